"""The fused linear cross-entropy's one-read forward kernel: loss, lse and a row-scaled gradient over
each chunk's logits, reading every logit once (fused_linear.py launches it).

The two-pass kernel (kernels.py) reads a row for lse, then again for
dx = coef (p - onehot(t)); at 128K-column rows the second read comes from DRAM, so it moves 3 bytes
per 2 it needs. In the fused loss the gradient only feeds two GEMMs, and a per-row factor can be moved
out of it: with m a reference value for the row, e_j = exp(z_j - m), D = sum_j e_j and lse = m + log D,

    dx_ij = s_i q_ij,   s_i = r w[t_i] / D_i,   q_ij = (e_ij - D_i [j == t_i]) (dz/dx)_ij

so one streaming pass writes q over the logits (and D), and the caller applies s to the GEMMs' small
operands instead: grad_x = diag(s) (q @ W) and grad_W = q.T @ (diag(s) x). This kernel writes
xs = diag(s) x itself (H elements per row) and s, which the caller applies to grad_x's rows once at the
end. The target's entry is rewritten after the pass (it needs D), behind a barrier.

m is the row's first block's maximum. A later block whose maximum exceeds m + switch (a config field)
moves m to that maximum and rescales what the row has written so far by exp(m_old - m_new) (a second
read of those blocks: rare for real logits, correct for any). So every e_j <= exp(switch) and D <= V exp(switch):
no overflow in fp32 or in the logits' dtype, and exp(z - m) underflows only where p_j < exp(-87).

Applies to "mean"/"sum" without label smoothing or z-loss (their gradient terms are not proportional
to p) and without a bias gradient; softcap, class weights and token scales are per-element and per-row
factors, and the argmax (predicted tokens) is taken from each block before it is overwritten. The
others keep the two-pass kernel. Ignored rows: loss 0, lse 0, s 0, zero q and xs rows. Out-of-range
targets: NaN lse, loss and s, as the two-pass kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._activations import _exp, _log, _recip, precise_math
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops._common.row_view import Rows
from kernel_pytorch.ops.cross_entropy.kernels import _softcap
from kernel_pytorch.ops.cross_entropy.launch import RowInputs, RowOutputs
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions


@triton.jit
def _cross_entropy_onepass_kernel(
    X, T, W, STATS, LOSS, LSE, S, XC, XS, TS, PRED,
    n_rows, n_cols, x_inner, x_s0, x_s1, h, xc_s0, xc_s1, xs_s0, ignore_index, cap,
    BLOCK: tl.constexpr, H_BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_CAP: tl.constexpr,
    MEAN: tl.constexpr, WRITE_XS: tl.constexpr, PREFETCH: tl.constexpr, SWITCH_AT: tl.constexpr,
    PRECISE: tl.constexpr, HAS_SCALE: tl.constexpr, ARGMAX: tl.constexpr,
):
    # HAS_SCALE: TS holds each row's token scale, a factor of r; ARGMAX: PRED gets each row's argmax,
    # -1 on ignored rows (as kernels.py)
    offs = tl.arange(0, BLOCK)
    h_offs = tl.arange(0, H_BLOCK)
    DTYPE = X.dtype.element_ty
    if MEAN:
        r = _recip(tl.load(STATS), PRECISE)
    else:
        r = 1.0
    for i in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row = tl.cast(i, tl.int64)
        x_row = X + (row // x_inner) * x_s0 + (row % x_inner) * x_s1
        t = tl.load(T + row).to(tl.int64)
        if t != ignore_index:
            bad = (t < 0) | (t >= n_cols)
            t_ok = tl.where(bad, 0, t).to(tl.int32)
            if HAS_SCALE:
                ru = r * tl.load(TS + row).to(tl.float32)
            else:
                ru = r
            best = tl.full([BLOCK], float("-inf"), tl.float32)
            best_col = offs
            z_t = tl.load(x_row + t_ok).to(tl.float32)  # before the pass writes over it
            if HAS_CAP:
                z_t = _softcap(z_t, cap, PRECISE)
            m = tl.full([], float("-inf"), tl.float32)
            d = tl.zeros([BLOCK], dtype=tl.float32)
            if PREFETCH:  # the next block's load is issued before this block's math
                x_next = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf"))
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                mask = cols < n_cols
                if PREFETCH:
                    x = x_next
                    x_next = tl.load(x_row + BLOCK + cols, mask=cols + BLOCK < n_cols, other=float("-inf"))
                else:
                    x = tl.load(x_row + cols, mask=mask, other=float("-inf"))
                z = x.to(tl.float32)
                if ARGMAX:  # on the logits before the cap, before they are overwritten
                    better = z > best
                    best = tl.where(better, z, best)
                    best_col = tl.where(better, cols, best_col)
                if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
                    z = tl.where(mask, _softcap(z, cap, PRECISE), float("-inf"))
                bm = tl.max(z, axis=0)
                if bm > m + SWITCH_AT:  # the first finite block, or (rarely) a much larger one
                    if m > float("-inf"):  # rescale the blocks already written to the new reference
                        f = _exp(m - bm, PRECISE)
                        for prev in range(0, start, BLOCK):
                            pc = prev + offs
                            q_prev = tl.load(x_row + pc).to(tl.float32)  # prev < start: whole blocks
                            tl.store(x_row + pc, (q_prev * f).to(DTYPE))
                        d = d * f
                    m = bm
                # while every logit so far is -inf, exponentiate against 0 so e stays 0 (not NaN)
                m_ref = tl.where(m == float("-inf"), 0.0, m)
                e = _exp(z - m_ref, PRECISE)
                d += e
                if HAS_CAP:
                    y = z / cap
                    e = e * (1.0 - y * y)
                tl.store(x_row + cols, e.to(DTYPE), mask=mask)
            m_ref = tl.where(m == float("-inf"), 0.0, m)
            d_sum = tl.sum(d, axis=0)
            lse = tl.where(bad, float("nan"), m_ref + _log(d_sum, PRECISE))
            if HAS_WEIGHT:
                w_t = tl.load(W + t_ok).to(tl.float32)
            else:
                w_t = 1.0
            tl.store(LOSS + row, ru * w_t * (lse - z_t))
            tl.store(LSE + row, lse)
            if ARGMAX:
                top = tl.max(best, axis=0)
                tl.store(PRED + row, tl.min(tl.where((best == top) & (best_col < n_cols), best_col, n_cols),
                                            axis=0).to(tl.int64))
            s = tl.where(bad, float("nan"), ru * w_t / d_sum)
            q_t = _exp(z_t - m_ref, PRECISE) - d_sum
            if HAS_CAP:
                y_t = z_t / cap
                q_t = q_t * (1.0 - y_t * y_t)
            tl.debug_barrier()  # every lane's store of the row lands before the target's entry is rewritten
            tl.store(x_row + t_ok, q_t.to(DTYPE))
            tl.store(S + row, s)
            if WRITE_XS:
                for hs in range(0, h, H_BLOCK):
                    hc = hs + h_offs
                    xv = tl.load(XC + row * xc_s0 + hc * xc_s1, mask=hc < h, other=0.0).to(tl.float32)
                    tl.store(XS + row * xs_s0 + hc, (xv * s).to(XS.dtype.element_ty), mask=hc < h)
        else:
            tl.store(LOSS + row, 0.0 * r)  # NaN exactly when no row is valid: the mean is torch's 0/0
            tl.store(LSE + row, 0.0)
            tl.store(S + row, 0.0)
            if ARGMAX:
                tl.store(PRED + row, tl.full([], -1, tl.int64))
            for start in range(0, n_cols, BLOCK):
                cols = start + offs
                tl.store(x_row + cols, tl.zeros([BLOCK], dtype=DTYPE), mask=cols < n_cols)
            if WRITE_XS:
                for hs in range(0, h, H_BLOCK):
                    hc = hs + h_offs
                    tl.store(XS + row * xs_s0 + hc, tl.zeros([H_BLOCK], dtype=XS.dtype.element_ty), mask=hc < h)


_kernel = Launcher(_cross_entropy_onepass_kernel)


def applies(options: CrossEntropyOptions, bias_grad: bool) -> bool:
    """Whether the one-read kernel computes this loss's gradient (module docstring)."""
    return (options.reduction in ("mean", "sum") and options.label_smoothing == 0.0
            and options.lse_square_scale == 0.0 and not bias_grad)


def launch_one_read(logits: Rows, inputs: RowInputs, out: RowOutputs, scale: Tensor, x: Tensor, xs: Tensor | None,
                    options: CrossEntropyOptions, *, eager: bool = False) -> None:
    """q over the logits' rows in place; out's loss and lse rows (and argmax where out.pred is given),
    scale (the rows' s), (N,) fp32; xs = s x.

    Args:
        logits: (N, V) rows, overwritten with q. inputs: the rows' targets, class weights, stats
            (needed for mean) and token scales. x: (N, H) the rows' inputs (any strides);
        xs: (N, H) with a unit column stride, or None where grad_W is not needed.
    """
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    config = tuning.current("fused_linear_cross_entropy")
    launch = config.one_read_launch
    block = min(launch.block, next_power_of_2(v))
    h = x.shape[-1]
    w, ts, lse = inputs.weight, inputs.token_scale, out.lse
    _kernel(
        (n,), logits.tensor, inputs.target, w if w is not None else lse,
        inputs.stats if inputs.stats is not None else lse, out.loss, lse, scale, x, xs if xs is not None else x,
        ts if ts is not None else lse, out.pred if out.pred is not None else inputs.target,
        n, v, *logits.args, h, x.stride(0), x.stride(1), xs.stride(0) if xs is not None else 0,
        int(options.ignore_index), float(options.softcap if options.softcap is not None else 1.0),
        BLOCK=block, H_BLOCK=min(config.h_block, next_power_of_2(h)), HAS_WEIGHT=w is not None,
        HAS_CAP=options.softcap is not None, MEAN=options.reduction == "mean", WRITE_XS=xs is not None,
        PREFETCH=launch.prefetch, SWITCH_AT=config.switch, PRECISE=precise_math(logits.tensor),
        HAS_SCALE=ts is not None, ARGMAX=out.pred is not None, num_warps=max(1, min(launch.num_warps, block // 256)),
        eager=eager,
    )
