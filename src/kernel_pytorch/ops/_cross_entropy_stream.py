"""The streaming cross-entropy forward: one program per row (or a persistent grid walking rows) reads
the row in BLOCK-column steps, twice when it also writes the gradient.

Pass 1 streams a valid row: online max and sum of exponentials in fp32 (one block-wide max per step;
the sums stay per lane until the row ends), the smoothing sum, and one scalar load for the target's
logit; then lse and the row's loss, already divided by the mean's denominator. With GRAD, pass 2 reads
the row again and writes dx (ops/_cross_entropy_common.py) into the logits themselves (in place) or
into a new buffer. The second read is meant to hit L2: pass 1 marks its loads evict_last and pass 2
evict_first (FwdLaunch.evict). Each pass issues the next block's load before reducing the current one
(FwdLaunch.prefetch). Ignored rows read nothing and get zeros.

Measured on the H100 (benchmarks/results/probes/probe_ce.log, 8192 x 128256 bf16): the loss-only pass
runs at 93-97% of the copy bandwidth, but with the gradient the second read misses L2 (2.8x the
loss-only time at 4096-column blocks): ops/_cross_entropy_split.py reads each row once instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._cross_entropy_common import CrossEntropyOptions, _grad_block, _softcap
from kernel_pytorch.ops._launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._row_view import Rows


@dataclass(frozen=True)
class FwdLaunch:
    """How the streaming forward walks the rows."""

    block: int  # columns per step (power of two)
    num_warps: int
    programs_per_sm: int  # 0: one program per row; k > 0: k persistent programs per SM walk the rows
    evict: bool  # pass 1 loads evict_last (kept in L2 for pass 2), pass 2 loads and stores evict_first
    reverse: bool  # pass 2 walks the row from its end: the blocks pass 1 read last, likeliest in L2
    prefetch: bool = True  # each pass loads the next block before reducing this one

    def narrowed(self, n_cols: int) -> FwdLaunch:
        """This launch with its block narrowed to the row (and warps to the block) for small vocabularies."""
        block = min(self.block, next_power_of_2(n_cols))
        warps = max(1, min(self.num_warps, block // 256))
        return FwdLaunch(block, warps, self.programs_per_sm, self.evict, self.reverse, self.prefetch)


@triton.jit
def _cross_entropy_fwd_kernel(
    X, T, W, STATS, LOSS, LSE, G,
    n_rows, n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1,
    ignore_index, smoothing, z_scale, cap,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr,
    MEAN: tl.constexpr, GRAD: tl.constexpr, PREFETCH: tl.constexpr, REVERSE: tl.constexpr,
    KEEP: tl.constexpr, DROP: tl.constexpr,
):
    # KEEP / DROP: eviction policies of pass 1's loads and of pass 2's loads and stores ("" for none)
    offs = tl.arange(0, BLOCK)
    if MEAN:  # the mean's row scales (reference: r and q), folded into loss and gradient
        r = 1.0 / tl.load(STATS)
        q = 1.0 / tl.load(STATS + 1)
    else:
        r = 1.0
        q = 1.0
    if SMOOTH and HAS_WEIGHT:
        w_total = tl.load(STATS + 2)
    else:
        w_total = n_cols * 1.0
    n_blocks = tl.cdiv(n_cols, BLOCK)
    for i in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(i, tl.int64)
        # row_start, inlined: Triton's interpreter re-patches the language at every jit call (CPU tests)
        x_row = X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1
        g_row = G + (row // g_inner) * g_s0 + (row % g_inner) * g_s1
        t = tl.load(T + row).to(tl.int64)
        if t != ignore_index:
            bad = (t < 0) | (t >= n_cols)
            t_ok = tl.where(bad, 0, t).to(tl.int32)  # int32: compared with every column index in pass 2
            m = tl.full([], float("-inf"), tl.float32)
            d = tl.zeros([BLOCK], dtype=tl.float32)
            s = tl.zeros([BLOCK], dtype=tl.float32)
            # pass 1. PREFETCH: the next block's load is issued before this block's reductions, so
            # two blocks per program are in flight (Triton does not pipeline loads that feed no dot)
            if PREFETCH:
                x_next = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf"), eviction_policy=KEEP)
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                mask = cols < n_cols
                if PREFETCH:
                    x = x_next
                    x_next = tl.load(x_row + BLOCK + cols, mask=cols + BLOCK < n_cols, other=float("-inf"),
                                     eviction_policy=KEEP)
                else:
                    x = tl.load(x_row + cols, mask=mask, other=float("-inf"), eviction_policy=KEEP)
                z = x.to(tl.float32)
                if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
                    z = tl.where(mask, _softcap(z, cap), float("-inf"))
                m_new = tl.maximum(m, tl.max(z, axis=0))
                # while every logit so far is -inf, exponentiate against 0 so d stays 0 (not NaN)
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                d = d * tl.exp(m - m_ref) + tl.exp(z - m_ref)
                m = m_new
                if SMOOTH:
                    zs = tl.where(mask, z, 0.0)
                    if HAS_WEIGHT:
                        zs *= tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                    s += zs
            lse = m + tl.log(tl.sum(d, axis=0))
            lse = tl.where(bad, float("nan"), lse)
            z_t = tl.load(x_row + t_ok).to(tl.float32)
            if HAS_CAP:
                z_t = _softcap(z_t, cap)
            if HAS_WEIGHT:
                w_t = tl.load(W + t_ok).to(tl.float32)
            else:
                w_t = 1.0
            ce = (1.0 - smoothing) * w_t * (lse - z_t)
            if SMOOTH:
                ce += smoothing / n_cols * (w_total * lse - tl.sum(s, axis=0))
            tl.store(LOSS + row, r * ce + q * z_scale * lse * lse)
            tl.store(LSE + row, lse)
            if GRAD:  # pass 2, forwards or (REVERSE) from the row's end
                coef_p = r * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * q * z_scale * lse
                coef_t = r * (1.0 - smoothing) * w_t
                coef_s = r * smoothing / n_cols
                if REVERSE:
                    first = (n_blocks - 1) * BLOCK
                    step = -BLOCK
                else:
                    first = 0
                    step = BLOCK
                if PREFETCH:
                    x_next = tl.load(x_row + first + offs, mask=first + offs < n_cols, other=0.0, eviction_policy=DROP)
                for k in range(0, n_blocks):
                    cols = first + k * step + offs
                    mask = cols < n_cols
                    if PREFETCH:  # the in-place store of this block never overlaps the next block's load
                        x = x_next
                        nxt = cols + step
                        x_next = tl.load(x_row + nxt, mask=(nxt >= 0) & (nxt < n_cols), other=0.0,
                                         eviction_policy=DROP)
                    else:
                        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=DROP)
                    g = _grad_block(x.to(tl.float32), cols, mask, t_ok, lse, coef_p, coef_t, coef_s, W, cap,
                                    HAS_WEIGHT, SMOOTH, HAS_CAP)
                    tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=mask, eviction_policy=DROP)
        else:
            # 0 * (1 / denominator): NaN exactly when no row is valid, so the mean is torch's 0/0
            tl.store(LOSS + row, 0.0 * r)
            tl.store(LSE + row, 0.0)
            if GRAD:
                for start in range(0, n_cols, BLOCK):
                    cols = start + offs
                    tl.store(g_row + cols, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=cols < n_cols)


_stream_kernel = Launcher(_cross_entropy_fwd_kernel)


def launch_stream(
    logits: Rows, target: Tensor, weight: Tensor | None, stats: Tensor | None, loss_rows: Tensor, lse: Tensor,
    grad: Rows | None, opts: CrossEntropyOptions, launch: FwdLaunch, *, eager: bool = False,
) -> None:
    """The streaming forward into given buffers: loss_rows and lse (N,) fp32, and the gradient's rows
    (`grad`, which may be `logits` itself) unless None. target: (N,) contiguous; `stats` as
    ops.cross_entropy's launch_fwd requires it."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    launch = launch.narrowed(v)
    programs = n if launch.programs_per_sm == 0 else min(n, device_programs(loss_rows.device, launch.programs_per_sm))
    g = grad if grad is not None else logits
    _stream_kernel(
        (programs,), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, loss_rows, lse, g.tensor, n, v, *logits.args, *g.args,
        *opts.scalars(), BLOCK=launch.block, GRAD=grad is not None, PREFETCH=launch.prefetch,
        REVERSE=launch.reverse, KEEP="evict_last" if launch.evict else "", DROP="evict_first" if launch.evict else "",
        num_warps=launch.num_warps, eager=eager, **opts.flags(weight),
    )


__all__ = ["FwdLaunch", "launch_stream"]
