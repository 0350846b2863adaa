"""The split-row cross-entropy kernel: loss and gradient with each logit read once from memory.

The two-pass forward (ops/_cross_entropy_kernels.py) reads every row twice, and at large
vocabularies the second read comes from DRAM: a row of 128K bf16 is 256 KB, more than one SM holds.
Here a row is split over SPLIT programs of CHUNK columns each. Every program loads its chunk once
and keeps it in registers, publishes its partial statistics (max, sum of exponentials against that
max, the smoothing sum and, where its chunk holds the target, the target's logit), waits until the
row's SPLIT partials are in, merges them into the row's lse and writes its chunk's gradient. Bytes:
one read of the logits and one write of the gradient, the minimum.

The rendezvous. Each row has a counter; a program stores its partials (scalar stores, issued by one
thread, the same thread that then increments the counter with release semantics) and polls the
counter with acquire semantics until it reaches SPLIT; the partials are then read back in one volatile
load, which is served by L2 and so never sees a stale L1 line. A program never waits on one that has not
started: with TICKET each program takes its (row, part) from a global ticket counter as it starts,
so the parts missing from any row a program waits on are the next tickets, which the next program to
start takes, and a wait ends as long as SPLIT programs fit on the device at once (the launcher
checks this). Without TICKET the program id is the ticket, which relies on the hardware starting
programs in order.

PHASE 0 does all of the above in one launch (CUDA). Triton's interpreter runs programs one after
another, so a rendezvous there would wait forever: on CPU the same kernel runs as PHASE 1 (partials
only) then PHASE 2 (partials read back, gradient from a second read), which tests every step but
the wait itself.

The math and its symbols (r, q, coef_*) are ops/cross_entropy.py's; `_softcap` and `_grad_block` are
shared with the two-pass kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from kernel_pytorch.ops._activations import _exp
from kernel_pytorch.ops._cross_entropy_kernels import _grad_block, _softcap


@dataclass(frozen=True)
class SplitLaunch:
    """How the split-row kernel divides a row."""

    chunk: int  # columns per program (power of two); a row takes cdiv(V, chunk) programs
    num_warps: int
    ticket: bool = True  # programs take their (row, part) from a ticket counter (else the program id)
    max_split: int = 64  # wider rows go to the two-pass kernel
    group: int = 0  # > 0: the pipelined kernel, rows in groups of this many (0: the rendezvous kernel)
    per_sm: int = 4  # the pipelined kernel's persistent programs per SM


def split_shape(n_cols: int, launch: SplitLaunch, programs_at_once: int) -> tuple[int, int] | None:
    """(chunk, split) for rows of `n_cols`, or None where the split kernel does not apply: more parts
    than `launch.max_split`, or than `programs_at_once` (a lower bound of the programs resident at
    once, e.g. one per SM), below which a rendezvous could wait on a program that cannot start."""
    chunk = min(launch.chunk, 1 << max(0, (n_cols - 1).bit_length()))
    split = -(-n_cols // chunk)
    if split > launch.max_split or split > programs_at_once:
        return None
    return chunk, split


@triton.jit
def _cross_entropy_split_kernel(
    X, T, W, STATS, LOSS, LSE, G, PART, SYNC,
    n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1,
    ignore_index, smoothing, z_scale, cap,
    CHUNK: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr, TICKET: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr, MEAN: tl.constexpr,
    PRECISE: tl.constexpr,
):
    # SYNC: int32 [ticket, one counter per row], zeroed by the launcher; PART: fp32 (rows, SPLIT, 4):
    # per part its max, sum of exp(z - max), smoothing sum and target logit (0 where not its chunk)
    if TICKET and PHASE == 0:
        ticket = tl.atomic_add(SYNC, 1, sem="relaxed")
    else:
        ticket = tl.program_id(0)
    row = tl.cast(ticket // SPLIT, tl.int64)
    part = ticket % SPLIT
    cols = part * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x_row = X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1
    g_row = G + (row // g_inner) * g_s0 + (row % g_inner) * g_s1
    t = tl.load(T + row).to(tl.int64)
    if t != ignore_index:  # the same for every part of a row: all of them meet, or none waits
        bad = (t < 0) | (t >= n_cols)
        t_ok = tl.where(bad, 0, t).to(tl.int32)
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
        own = PART + (row * SPLIT + part) * 4
        x = tl.load(x_row + cols, mask=mask, other=float("-inf"))
        if PHASE != 2:
            z = x.to(tl.float32)
            if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
                z = tl.where(mask, _softcap(z, cap, PRECISE), float("-inf"))
            m = tl.max(z, axis=0)
            m_ref = tl.where(m == float("-inf"), 0.0, m)  # an all -inf chunk adds 0, not NaN
            d = tl.sum(_exp(z - m_ref, PRECISE), axis=0)
            z_t = tl.sum(tl.where(cols == t_ok, z, 0.0), axis=0)  # 0 unless this chunk holds the target
            if SMOOTH:
                zs = tl.where(mask, z, 0.0)
                if HAS_WEIGHT:
                    zs *= tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                s = tl.sum(zs, axis=0)
            else:
                s = 0.0
            tl.store(own, m)
            tl.store(own + 1, d)
            tl.store(own + 2, s)
            tl.store(own + 3, z_t)
        if PHASE == 0:  # arrive, then wait for the row's other parts
            seen = tl.atomic_add(SYNC + 1 + row, 1, sem="release") + 1
            while seen < SPLIT:
                seen = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire")
        if PHASE != 1:
            # the row's partials in one load: (SPLIT_P2, 4), SPLIT rounded up to a power of two, the
            # rest masked; volatile, so served by L2 (never a stale L1 line), after the acquire above
            idx = tl.arange(0, SPLIT_P2)
            has = idx < SPLIT
            field = tl.arange(0, 4)
            block = tl.load(PART + row * SPLIT * 4 + idx[:, None] * 4 + field[None, :], mask=has[:, None],
                            other=0.0, volatile=True)
            ms = tl.where(has, tl.sum(tl.where(field[None, :] == 0, block, 0.0), axis=1), float("-inf"))
            ds = tl.sum(tl.where(field[None, :] == 1, block, 0.0), axis=1)
            big = tl.max(ms, axis=0)
            big_ref = tl.where(big == float("-inf"), 0.0, big)
            lse = big_ref + tl.log(tl.sum(ds * _exp(ms - big_ref, PRECISE), axis=0))
            lse = tl.where(bad, float("nan"), lse)
            if HAS_WEIGHT:
                w_t = tl.load(W + t_ok).to(tl.float32)
            else:
                w_t = 1.0
            if part == 0:
                z_t = tl.sum(tl.sum(tl.where(field[None, :] == 3, block, 0.0), axis=1), axis=0)
                ce = (1.0 - smoothing) * w_t * (lse - z_t)
                if SMOOTH:
                    s_all = tl.sum(tl.sum(tl.where(field[None, :] == 2, block, 0.0), axis=1), axis=0)
                    ce += smoothing / n_cols * (w_total * lse - s_all)
                tl.store(LOSS + row, r * ce + q * z_scale * lse * lse)
                tl.store(LSE + row, lse)
            coef_p = r * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * q * z_scale * lse
            g = _grad_block(x.to(tl.float32), cols, mask, t_ok, lse, coef_p, r * (1.0 - smoothing) * w_t,
                            r * smoothing / n_cols, W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP, PRECISE)
            tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=mask)
    elif PHASE != 1:
        if part == 0:  # 0 * (1 / denominator): NaN exactly when no row is valid, torch's 0/0 for the mean
            if MEAN:
                tl.store(LOSS + row, 0.0 / tl.load(STATS))
            else:
                tl.store(LOSS + row, 0.0)
            tl.store(LSE + row, 0.0)
        tl.store(g_row + cols, tl.zeros([CHUNK], dtype=G.dtype.element_ty), mask=mask)



@triton.jit
def _cross_entropy_pipe_kernel(
    X, T, W, STATS, LOSS, LSE, G, PART, SYNC,
    n_rows, n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1,
    ignore_index, smoothing, z_scale, cap,
    CHUNK: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, GROUP: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr, MEAN: tl.constexpr,
    PRECISE: tl.constexpr,
):
    # Work items, in ticket order, by stage s = 0 .. n_groups: GROUP x SPLIT "statistics" items of row
    # group s (each reads one chunk and publishes its partials), then GROUP x SPLIT "gradient" items of
    # group s - 1 (each reads its chunk again, from L2 if the two groups fit there, waits for its row's
    # partials and writes the gradient). A gradient item only waits on items with earlier tickets.
    ITEMS: tl.constexpr = GROUP * SPLIT
    n_groups = tl.cdiv(n_rows, GROUP)
    total = (n_groups + 1) * 2 * ITEMS
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
    offs = tl.arange(0, CHUNK)
    idx = tl.arange(0, SPLIT_P2)
    has = idx < SPLIT
    field = tl.arange(0, 4)
    tk = tl.atomic_add(SYNC, 1, sem="relaxed")
    while tk < total:
        stage = tk // (2 * ITEMS)
        rem = tk % (2 * ITEMS)
        second = rem >= ITEMS
        group = tl.where(second, stage - 1, stage)
        item = rem % ITEMS
        row_i = group * GROUP + item // SPLIT
        part = item % SPLIT
        live = (group >= 0) & (group < n_groups) & (row_i < n_rows)
        row = tl.cast(tl.minimum(tl.maximum(row_i, 0), n_rows - 1), tl.int64)
        t = tl.load(T + row).to(tl.int64)
        cols = part * CHUNK + offs
        mask = cols < n_cols
        x_row = X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1
        g_row = G + (row // g_inner) * g_s0 + (row % g_inner) * g_s1
        if live & (t != ignore_index):
            x = tl.load(x_row + cols, mask=mask, other=float("-inf"))
            nxt = tl.atomic_add(SYNC, 1, sem="relaxed")  # the next ticket, while the chunk is in flight
            bad = (t < 0) | (t >= n_cols)
            t_ok = tl.where(bad, 0, t).to(tl.int32)
            if second:
                seen = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire")
                while seen < SPLIT:
                    seen = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire")
                block = tl.load(PART + row * SPLIT * 4 + idx[:, None] * 4 + field[None, :], mask=has[:, None],
                                other=0.0, volatile=True)
                ms = tl.where(has, tl.sum(tl.where(field[None, :] == 0, block, 0.0), axis=1), float("-inf"))
                ds = tl.sum(tl.where(field[None, :] == 1, block, 0.0), axis=1)
                big = tl.max(ms, axis=0)
                big_ref = tl.where(big == float("-inf"), 0.0, big)
                lse = big_ref + tl.log(tl.sum(ds * _exp(ms - big_ref, PRECISE), axis=0))
                lse = tl.where(bad, float("nan"), lse)
                if HAS_WEIGHT:
                    w_t = tl.load(W + t_ok).to(tl.float32)
                else:
                    w_t = 1.0
                if part == 0:
                    z_t = tl.sum(tl.sum(tl.where(field[None, :] == 3, block, 0.0), axis=1), axis=0)
                    ce = (1.0 - smoothing) * w_t * (lse - z_t)
                    if SMOOTH:
                        s_all = tl.sum(tl.sum(tl.where(field[None, :] == 2, block, 0.0), axis=1), axis=0)
                        ce += smoothing / n_cols * (w_total * lse - s_all)
                    tl.store(LOSS + row, r * ce + q * z_scale * lse * lse)
                    tl.store(LSE + row, lse)
                coef_p = r * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * q * z_scale * lse
                g = _grad_block(x.to(tl.float32), cols, mask, t_ok, lse, coef_p, r * (1.0 - smoothing) * w_t,
                                r * smoothing / n_cols, W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP, PRECISE)
                tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=mask)
            else:
                z = x.to(tl.float32)
                if HAS_CAP:
                    z = tl.where(mask, _softcap(z, cap, PRECISE), float("-inf"))
                m = tl.max(z, axis=0)
                m_ref = tl.where(m == float("-inf"), 0.0, m)
                d = tl.sum(_exp(z - m_ref, PRECISE), axis=0)
                z_t = tl.sum(tl.where(cols == t_ok, z, 0.0), axis=0)
                if SMOOTH:
                    zs = tl.where(mask, z, 0.0)
                    if HAS_WEIGHT:
                        zs *= tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                    s = tl.sum(zs, axis=0)
                else:
                    s = 0.0
                own = PART + (row * SPLIT + part) * 4
                tl.store(own, m)
                tl.store(own + 1, d)
                tl.store(own + 2, s)
                tl.store(own + 3, z_t)
                tl.atomic_add(SYNC + 1 + row, 1, sem="release")
        else:
            if live & second:  # an ignored row: zeros, and torch's 0/0 mean when no row is valid
                if part == 0:
                    if MEAN:
                        tl.store(LOSS + row, 0.0 / tl.load(STATS))
                    else:
                        tl.store(LOSS + row, 0.0)
                    tl.store(LSE + row, 0.0)
                tl.store(g_row + cols, tl.zeros([CHUNK], dtype=G.dtype.element_ty), mask=mask)
            nxt = tl.atomic_add(SYNC, 1, sem="relaxed")
        tk = nxt
