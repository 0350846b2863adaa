"""The cross-entropy Triton kernels (launch.py launches them, register.py registers them; the math and
its symbols are in launch.py's docstring and in reference/cross_entropy.py).

Kernels:
  _cross_entropy_fwd_kernel: rows walked by one program per row, or by a persistent grid (FwdLaunch).
    Pass 1 streams a valid row in BLOCK-column steps: online max and sum of exponentials in fp32 (one
    block-wide max per step; the sums stay per lane until the row ends), the smoothing sum, and one
    scalar load for the target's logit; then lse and the row's loss, already divided by the mean's
    denominator, each row's terms times its token scale (HAS_SCALE). ARGMAX: pass 1 also keeps each
    lane's largest logit and its first column, reduced to the row's argmax at the row's end. With GRAD,
    pass 2 reads the row again and writes dx, scaled as above, into the logits
    themselves (in place) or into a new buffer. The second read is meant to hit L2: a row of 128K bf16
    is 256 KB, and 132 rows in flight (one per SM) are 33 MB of H100's 50 MB L2, so pass 1 marks its
    loads evict_last and pass 2 evict_first (FwdLaunch.evict). Each pass issues the next block's load
    before reducing the current one (FwdLaunch.prefetch). Ignored rows read nothing and get zeros.
    Measured on the H100 (benchmarks/results/probes/cross_entropy/probe_ce_h100.log) the re-read misses L2 (fwd+grad
    costs 2.8x a loss-only pass at 4096-column blocks); CrossEntropyConfig.fwd is the sweep's best, 75%
    of copy.
    Two designs that read each logit once were built and measured on the H200 against this kernel's
    1.70 ms (8192 x 128256 bf16, gradient in place; benchmarks/results/probes/cross_entropy/probe_ce_split_h200.log):
    a row split over programs that keep their chunk in registers and meet at a per-row counter
    (2.30-3.62 ms over 15 launches), and a persistent pipeline over row groups, statistics of one
    group while the previous group's gradients re-read it from L2 (2.93-5.03 ms over 9). Both lose
    to the latency of their per-chunk atomics, each a round trip and a block-wide barrier in Triton,
    with too few programs per SM to hide it; neither was kept (the first is commit e553191).
  _cross_entropy_bwd_kernel: grid (rows, column blocks); p from the saved lse, one read and one write.
    For reduction "none" (the upstream gradient differs per row) and for callers that did not keep the
    forward's gradient.
  The "mean"/"sum" backward multiplies the forward's gradient by the upstream gradient with
    ops/_common/scale.scale_grad_, which touches no memory when that is 1 (loss.backward()).
  The means' denominators and W = sum(w) come from stats.py, on the device (no sync).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_pytorch.ops._activations import _exp, _log, _recip, libdevice


@triton.jit
def _softcap(x, cap, PRECISE: tl.constexpr):
    # PRECISE (fp32/fp16 logits on the GPU, ops/_activations.precise_math): torch's tanh(x / c) * c with
    # libdevice's tanh and an IEEE division; else c - 2c / (exp(2x / c) + 1): one exp, saturating
    # cleanly to +-c at +-inf
    if PRECISE:
        return libdevice.tanh(tl.div_rn(x, cap)) * cap
    else:
        return cap - (2.0 * cap) / (tl.exp(x * (2.0 / cap)) + 1.0)


@triton.jit
def _grad_block(x, cols, mask, t, lse, coef_p, coef_t, coef_s, W, cap,
                HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr, PRECISE: tl.constexpr):
    """dx for one block of a valid row (fp32): coef_p p - coef_t [j == t] - coef_s w_j, times dz/dx."""
    z = x
    if HAS_CAP:
        z = _softcap(x, cap, PRECISE)
    g = coef_p * _exp(z - lse, PRECISE) - tl.where(cols == t, coef_t, 0.0)
    if SMOOTH:
        if HAS_WEIGHT:
            g -= coef_s * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            g -= coef_s
    if HAS_CAP:
        y = z / cap
        g = g * (1.0 - y * y)
    return g


@triton.jit
def _cross_entropy_fwd_kernel(
    X, T, W, STATS, LOSS, LSE, G, TS, PRED,
    n_rows, n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1,
    ignore_index, smoothing, z_scale, cap,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr,
    MEAN: tl.constexpr, GRAD: tl.constexpr, PREFETCH: tl.constexpr, REVERSE: tl.constexpr,
    KEEP: tl.constexpr, DROP: tl.constexpr, PRECISE: tl.constexpr, HAS_SCALE: tl.constexpr,
    ARGMAX: tl.constexpr,
):
    # KEEP / DROP: eviction policies of pass 1's loads and of pass 2's loads and stores ("" for none).
    # HAS_SCALE: TS holds each row's token scale u; ARGMAX: PRED gets each row's argmax (-1 if ignored)
    offs = tl.arange(0, BLOCK)
    if MEAN:  # the mean's row scales (reference: r and q), folded into loss and gradient
        r = _recip(tl.load(STATS), PRECISE)
        q = _recip(tl.load(STATS + 1), PRECISE)
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
            # the row's scales: r and q times its token scale (new names: a runtime branch may not
            # retype a variable it shares with the other branch)
            if HAS_SCALE:
                u = tl.load(TS + row).to(tl.float32)
            else:
                u = 1.0
            ru = r * u
            qu = q * u
            bad = (t < 0) | (t >= n_cols)
            t_ok = tl.where(bad, 0, t).to(tl.int32)  # int32: compared with every column index in pass 2
            m = tl.full([], float("-inf"), tl.float32)
            d = tl.zeros([BLOCK], dtype=tl.float32)
            s = tl.zeros([BLOCK], dtype=tl.float32)
            # per lane: the largest logit seen and its first column (a lane's columns only increase)
            best = tl.full([BLOCK], float("-inf"), tl.float32)
            best_col = offs
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
                if ARGMAX:  # on the logits before the cap (reference/cross_entropy_extras.py)
                    better = z > best
                    best = tl.where(better, z, best)
                    best_col = tl.where(better, cols, best_col)
                if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
                    z = tl.where(mask, _softcap(z, cap, PRECISE), float("-inf"))
                m_new = tl.maximum(m, tl.max(z, axis=0))
                # while every logit so far is -inf, exponentiate against 0 so d stays 0 (not NaN)
                m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
                d = d * _exp(m - m_ref, PRECISE) + _exp(z - m_ref, PRECISE)
                m = m_new
                if SMOOTH:
                    zs = tl.where(mask, z, 0.0)
                    if HAS_WEIGHT:
                        zs *= tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                    s += zs
            lse = m + _log(tl.sum(d, axis=0), PRECISE)
            lse = tl.where(bad, float("nan"), lse)
            z_t = tl.load(x_row + t_ok).to(tl.float32)
            if HAS_CAP:
                z_t = _softcap(z_t, cap, PRECISE)
            if HAS_WEIGHT:
                w_t = tl.load(W + t_ok).to(tl.float32)
            else:
                w_t = 1.0
            ce = (1.0 - smoothing) * w_t * (lse - z_t)
            if SMOOTH:
                ce += smoothing / n_cols * (w_total * lse - tl.sum(s, axis=0))
            tl.store(LOSS + row, ru * ce + qu * z_scale * lse * lse)
            tl.store(LSE + row, lse)
            if ARGMAX:
                top = tl.max(best, axis=0)
                tl.store(PRED + row, tl.min(tl.where((best == top) & (best_col < n_cols), best_col, n_cols),
                                            axis=0).to(tl.int64))
            if GRAD:  # pass 2, forwards or (REVERSE) from the row's end
                coef_p = ru * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * qu * z_scale * lse
                coef_t = ru * (1.0 - smoothing) * w_t
                coef_s = ru * smoothing / n_cols
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
                                    HAS_WEIGHT, SMOOTH, HAS_CAP, PRECISE)
                    tl.store(g_row + cols, g.to(G.dtype.element_ty), mask=mask, eviction_policy=DROP)
        else:
            # 0 * (1 / denominator): NaN exactly when no row is valid, so the mean is torch's 0/0
            tl.store(LOSS + row, 0.0 * r)
            tl.store(LSE + row, 0.0)
            if ARGMAX:
                tl.store(PRED + row, tl.full([], -1, tl.int64))
            if GRAD:
                for start in range(0, n_cols, BLOCK):
                    cols = start + offs
                    tl.store(g_row + cols, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _cross_entropy_bwd_kernel(
    X, T, W, STATS, LSE, DLOSS, G, TS,
    n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1, stride_dloss,
    ignore_index, smoothing, z_scale, cap,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr,
    MEAN: tl.constexpr, PRECISE: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    # program (row, column block); stride_dloss 0 broadcasts a 0-d upstream gradient
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g_ptrs = G + (row // g_inner) * g_s0 + (row % g_inner) * g_s1 + cols
    t = tl.load(T + row).to(tl.int64)
    if t != ignore_index:
        t_ok = tl.where((t < 0) | (t >= n_cols), 0, t).to(tl.int32)  # the forward stored a NaN lse for these
        x = tl.load(X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1 + cols, mask=mask, other=0.0).to(tl.float32)
        lse = tl.load(LSE + row)
        r = tl.load(DLOSS + row * stride_dloss).to(tl.float32)
        if HAS_SCALE:
            r = r * tl.load(TS + row).to(tl.float32)
        q = r
        if MEAN:
            r = r / tl.load(STATS)
            q = q / tl.load(STATS + 1)
        if SMOOTH and HAS_WEIGHT:
            w_total = tl.load(STATS + 2)
        else:
            w_total = n_cols * 1.0
        if HAS_WEIGHT:
            w_t = tl.load(W + t_ok).to(tl.float32)
        else:
            w_t = 1.0
        coef_p = r * ((1.0 - smoothing) * w_t + smoothing / n_cols * w_total) + 2.0 * q * z_scale * lse
        g = _grad_block(x, cols, mask, t_ok, lse, coef_p, r * (1.0 - smoothing) * w_t, r * smoothing / n_cols,
                        W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP, PRECISE)
        tl.store(g_ptrs, g.to(G.dtype.element_ty), mask=mask)
    else:
        tl.store(g_ptrs, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=mask)
