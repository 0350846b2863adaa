"""Cross-entropy forward with gradient, each row split across programs that keep their part of it in
registers: the logits are read from memory once and the gradient written once, whatever L2 holds.

The streaming kernel (ops/cross_entropy.py) reads each row twice and counts on L2 for the second read;
on the H100 that read missed (fwd+grad took 2.8x a loss-only pass: benchmarks/results/probes/
probe_ce.log). Here a row of V columns is cut into S = cdiv(V, SEG) segments, one per program.

Schedule: a persistent grid of G x S programs; program p owns segment p % S of rows g, g + G, ... (g =
p // S), so the S programs of a group walk the same rows in the same order. Per row, each program

  1. loads its segment (with PREFETCH the next row's load is issued before this row's work) and
     computes its statistics: m_k = max z, d_k = sum exp(z - m_k), s_k = sum w z (smoothing);
  2. stores them in its slot of PART, claims its segment and publishes it (below);
  3. waits until all S segments of the row are published, combines them in a fixed order into lse
     (every program of the row computes the same bits) and writes its segment's gradient from the
     registers loaded in step 1; the program holding the target's segment writes loss and lse.

Bytes: N V B read and N V B written (B bytes per logit), the minimum, in place or not; the statistics
are 12 bytes per segment each way. The price is a wait per row on the slowest segment of the row.

Claims, so that no program ever waits on one that has not started: FLAGS holds per row one claim
word per segment (0 free, 1 its owner's, 2 a stealer's) and a count of published segments. An owner
publishes by CAS 0 -> 1 on its word, then adds 1 to the count (release). A program that has polled
the count `patience` times takes every still-free segment of its row (CAS 0 -> 2): it computes their
statistics from memory into the stealer's slot, publishes them, and later writes their gradients (a
second read of those segments). An owner whose CAS fails skips the row: the segment is the stealer's,
and nobody else reads or writes it. So every segment a program waits on is published, or held by a
running program that publishes it without waiting itself: the kernel finishes whatever the residency
(one program at a time, as Triton's interpreter runs them, included). A segment's statistics are
bitwise the same whoever computes them (the same [SEG] load and reductions), so results do not depend
on who took what. Stealing costs time, never correctness; with all G x S programs resident (the grid
is at most `programs_per_sm` per SM) it should not happen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._cross_entropy_common import CrossEntropyOptions, _grad_block, _softcap
from kernel_pytorch.ops._launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._row_view import Rows

# Segments per row at most: a program keeps the segments it took as bits of one int32.
MAX_SEGMENTS = 31


@dataclass(frozen=True)
class SplitLaunch:
    """How the split forward cuts rows and sizes its grid."""

    seg: int  # columns per program (a power of two); a row takes cdiv(V, seg) programs
    num_warps: int
    programs_per_sm: int  # the persistent grid: at most this many programs per SM
    prefetch: bool = True  # load the next row's segment before this row's wait and gradient
    patience: int = 256  # polls of a row's count before taking its unclaimed segments


# Untuned first choice, not yet measured (scripts/probe_cross_entropy.py times it next to the
# streaming kernel): 16 columns per thread, one program per SM, so 132 programs hold 132 segments of
# 32 KiB (bf16) in registers, and a 128K row is 8 programs.
SPLIT_LAUNCH = SplitLaunch(seg=16384, num_warps=32, programs_per_sm=1)


@triton.jit
def _segment_stats(x, cols, mask, W, cap, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr):
    """(max z, sum exp(z - max), sum w z) over one segment; masked columns are -inf in x."""
    z = x.to(tl.float32)
    if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
        z = tl.where(mask, _softcap(z, cap), float("-inf"))
    m = tl.max(z, axis=0)
    # a segment of only -inf: exponentiate against 0 so the sum is 0, not NaN
    d = tl.sum(tl.exp(z - tl.where(m == float("-inf"), 0.0, m)), axis=0)
    s = 0.0
    if SMOOTH:
        zs = tl.where(mask, z, 0.0)
        if HAS_WEIGHT:
            zs *= tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(zs, axis=0)
    return m, d, s


@triton.jit
def _store_stats(slot, k, m, d, s, SEGS: tl.constexpr, SMOOTH: tl.constexpr):
    tl.store(slot + k, m)
    tl.store(slot + SEGS + k, d)
    if SMOOTH:
        tl.store(slot + 2 * SEGS + k, s)


@triton.jit
def _target_logit(x, cols, t, cap, HAS_CAP: tl.constexpr):
    """z at column t, from the segment holding it (a sum of one value and zeros: exact)."""
    z = x.to(tl.float32)
    if HAS_CAP:
        z = _softcap(z, cap)
    return tl.sum(tl.where(cols == t, z, 0.0), axis=0)


@triton.jit
def _store_loss(LOSS, LSE, row, lse, z_t, w_t, smooth, r, zl, smoothing):
    # the reference's (1 - eps) w[t] (lse - z_t) + smoothing term, scaled, plus the z-loss
    tl.store(LOSS + row, r * ((1.0 - smoothing) * w_t * (lse - z_t) + smooth) + zl)
    tl.store(LSE + row, lse)


@triton.jit
def _cross_entropy_split_kernel(
    X, T, W, STATS, LOSS, LSE, G, PART, FLAGS,
    n_rows, n_cols, n_segs, n_groups, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1,
    ignore_index, smoothing, z_scale, cap, patience, seg_shift,
    SEG: tl.constexpr, SEGS: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr,
    HAS_CAP: tl.constexpr, MEAN: tl.constexpr, PREFETCH: tl.constexpr,
):
    # PART: per row [owner's slot | stealer's slot], each (m, d, s) x SEGS fp32. FLAGS: per row n_segs
    # claim words, then the published count. seg_shift rotates which program owns which segment
    # (tests: the interpreter runs programs in order)
    pid = tl.program_id(0)
    seg = (pid % n_segs + seg_shift) % n_segs
    offs = tl.arange(0, SEG)
    cols = seg * SEG + offs
    mask = cols < n_cols
    ks = tl.arange(0, SEGS)
    k_ok = ks < n_segs
    if MEAN:
        r = 1.0 / tl.load(STATS)
        q = 1.0 / tl.load(STATS + 1)
    else:
        r = 1.0
        q = 1.0
    if SMOOTH and HAS_WEIGHT:
        w_total = tl.load(STATS + 2)
    else:
        w_total = n_cols * 1.0
    first = pid // n_segs
    if PREFETCH:
        row0 = tl.cast(first, tl.int64)
        x_next = tl.load(X + (row0 // x_inner) * x_s0 + (row0 % x_inner) * x_s1 + cols,
                         mask=mask & (row0 < n_rows), other=float("-inf"), eviction_policy="evict_first")
    for i in range(first, n_rows, n_groups):
        row = tl.cast(i, tl.int64)
        x_row = X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1
        g_row = G + (row // g_inner) * g_s0 + (row % g_inner) * g_s1
        if PREFETCH:
            x = x_next
            nxt = row + n_groups
            x_next = tl.load(X + (nxt // x_inner) * x_s0 + (nxt % x_inner) * x_s1 + cols,
                             mask=mask & (nxt < n_rows), other=float("-inf"), eviction_policy="evict_first")
        else:
            x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy="evict_first")
        t = tl.load(T + row).to(tl.int64)
        if t != ignore_index:
            bad = (t < 0) | (t >= n_cols)
            t_ok = tl.where(bad, 0, t).to(tl.int32)
            t_seg = t_ok // SEG
            flag_row = FLAGS + row * (n_segs + 1)
            count = flag_row + n_segs
            part = PART + row * (6 * SEGS)
            m, d, s = _segment_stats(x, cols, mask, W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP)
            _store_stats(part, seg, m, d, s, SEGS, SMOOTH)
            tl.debug_barrier()  # every thread's stores before the one thread's claim and count
            if tl.atomic_cas(flag_row + seg, 0, 1, sem="relaxed") == 0:
                tl.atomic_add(count, 1, sem="release")
                taken = 0  # bits: segments of this row this program took from their owners
                polls = 0
                published = tl.atomic_add(count, 0, sem="acquire")
                while published < n_segs:
                    polls += 1
                    if polls > patience:
                        for k in range(0, n_segs):
                            if tl.atomic_cas(flag_row + k, 0, 2, sem="relaxed") == 0:
                                kc = k * SEG + offs
                                km = kc < n_cols
                                xk = tl.load(x_row + kc, mask=km, other=float("-inf"))
                                mk, dk, sk = _segment_stats(xk, kc, km, W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP)
                                _store_stats(part + 3 * SEGS, k, mk, dk, sk, SEGS, SMOOTH)
                                tl.debug_barrier()
                                tl.atomic_add(count, 1, sem="release")
                                taken = taken | (1 << k)
                    published = tl.atomic_add(count, 0, sem="acquire")
                tl.debug_barrier()
                # combine the segments in a fixed order (.cg: read at L2, where the others stored them)
                claims = tl.load(flag_row + ks, mask=k_ok, other=1, cache_modifier=".cg")
                slot = part + tl.where(claims == 2, 3 * SEGS, 0) + ks
                m_k = tl.load(slot, mask=k_ok, other=float("-inf"), cache_modifier=".cg")
                d_k = tl.load(slot + SEGS, mask=k_ok, other=0.0, cache_modifier=".cg")
                m_all = tl.max(m_k, axis=0)
                lse = m_all + tl.log(tl.sum(d_k * tl.exp(m_k - tl.where(m_all == float("-inf"), 0.0, m_all)), axis=0))
                lse = tl.where(bad, float("nan"), lse)
                if HAS_WEIGHT:
                    w_t = tl.load(W + t_ok).to(tl.float32)
                else:
                    w_t = 1.0
                coef_p = r * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * q * z_scale * lse
                coef_t = r * (1.0 - smoothing) * w_t
                coef_s = r * smoothing / n_cols
                smooth = 0.0
                if SMOOTH:
                    s_total = tl.sum(tl.load(slot + 2 * SEGS, mask=k_ok, other=0.0, cache_modifier=".cg"), axis=0)
                    smooth = smoothing / n_cols * (w_total * lse - s_total)
                zl = q * z_scale * lse * lse
                if t_seg == seg:  # the loss needs z_t, from this segment's registers
                    _store_loss(LOSS, LSE, row, lse, _target_logit(x, cols, t_ok, cap, HAS_CAP), w_t, smooth, r, zl,
                                smoothing)
                g = _grad_block(x.to(tl.float32), cols, mask, t_ok, lse, coef_p, coef_t, coef_s, W, cap,
                                HAS_WEIGHT, SMOOTH, HAS_CAP)
                tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=mask)
                for k in range(0, n_segs):  # the segments taken: read again, then their gradient
                    if (taken >> k) & 1:
                        kc = k * SEG + offs
                        km = kc < n_cols
                        xk = tl.load(x_row + kc, mask=km, other=float("-inf"))
                        if t_seg == k:
                            _store_loss(LOSS, LSE, row, lse, _target_logit(xk, kc, t_ok, cap, HAS_CAP), w_t, smooth,
                                        r, zl, smoothing)
                        gk = _grad_block(xk.to(tl.float32), kc, km, t_ok, lse, coef_p, coef_t, coef_s, W, cap,
                                         HAS_WEIGHT, SMOOTH, HAS_CAP)
                        tl.store(g_row + kc, gk.to(G.dtype.element_ty), mask=km)
        else:
            # nobody waits on an ignored row: each owner zeroes its segment, segment 0's writes the loss
            tl.store(g_row + cols, tl.zeros([SEG], dtype=G.dtype.element_ty), mask=mask)
            if seg == 0:
                # 0 * (1 / denominator): NaN exactly when no row is valid, so the mean is torch's 0/0
                tl.store(LOSS + row, 0.0 * r)
                tl.store(LSE + row, 0.0)


_split_kernel = Launcher(_cross_entropy_split_kernel)


def split_segments(n_cols: int, launch: SplitLaunch) -> tuple[int, int, int]:
    """(columns per segment, segments per row, warps) for rows of `n_cols`: the launch's segment,
    narrowed to the row, and at least 8 columns per thread."""
    seg = min(launch.seg, next_power_of_2(n_cols))
    return seg, triton.cdiv(n_cols, seg), max(1, min(launch.num_warps, seg // 256))


def fits(n_cols: int, launch: SplitLaunch) -> bool:
    """Whether rows of `n_cols` cut into at most MAX_SEGMENTS segments of `launch`."""
    return split_segments(n_cols, launch)[1] <= MAX_SEGMENTS


def launch_split(
    logits: Rows, target: Tensor, weight: Tensor | None, stats: Tensor | None, loss_rows: Tensor, lse: Tensor,
    grad: Rows, opts: CrossEntropyOptions, launch: SplitLaunch, *, seg_shift: int = 0, eager: bool = False,
) -> None:
    """The split forward into given buffers: loss_rows and lse (N,) fp32 and the gradient's rows
    (`grad`, which may be `logits` itself). target: (N,) contiguous; `stats` as ops.cross_entropy's
    launch_fwd requires it; the rows must fit (`fits`)."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    seg, n_segs, warps = split_segments(v, launch)
    segs = next_power_of_2(n_segs)
    groups = max(1, min(n, device_programs(lse.device, launch.programs_per_sm) // n_segs))
    flags = torch.zeros(n * (n_segs + 1), dtype=torch.int32, device=lse.device)
    part = torch.empty(n * 6 * segs, dtype=torch.float32, device=lse.device)
    _split_kernel(
        (groups * n_segs,), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, loss_rows, lse, grad.tensor, part, flags,
        n, v, n_segs, groups, *logits.args, *grad.args, *opts.scalars(), launch.patience, seg_shift % n_segs,
        SEG=seg, SEGS=segs, PREFETCH=launch.prefetch, num_warps=warps, eager=eager, **opts.flags(weight),
    )


__all__ = ["MAX_SEGMENTS", "SPLIT_LAUNCH", "SplitLaunch", "fits", "launch_split", "split_segments"]
