"""Cross-entropy kernels and their launchers, registered as `kernel_pytorch::cross_entropy_fwd` / `_bwd`.

Math (reference/cross_entropy.py, the specification), for logits x (N, V), targets t (N,), class
weights w (V,), smoothing eps, z-loss scale s, soft-cap c: z = c * tanh(x / c), lse = logsumexp(z),
ce_i = (1 - eps) w[t_i] (lse_i - z_i,t_i) + eps / V sum_j w_j (lse_i - z_ij), zl_i = s lse_i^2, and

    dx_ij = [r_i (A_i p_ij - (1 - eps) w[t_i] [j == t_i] - eps / V w_j) + q_i 2 s lse_i p_ij] (1 - (z_ij / c)^2)

with p = exp(z - lse), A_i = (1 - eps) w[t_i] + eps W / V (W = sum w), and (r, q) the reduction's
row scales (1 for "sum" and "none", 1 / sum valid w[t] and 1 / number of valid rows for "mean").

Kernels:
  _cross_entropy_fwd_kernel: rows walked by one program per row, or by a persistent grid (FwdLaunch).
    Pass 1 streams a valid row in BLOCK-column steps: online max and sum of exponentials in fp32 (one
    block-wide max per step; the sums stay per lane until the row ends), the smoothing sum, and one
    scalar load for the target's logit; then lse and the row's loss, already divided by the mean's
    denominator. With GRAD, pass 2 reads the row again and writes dx, scaled as above, into the logits
    themselves (in place) or into a new buffer. The second read is meant to hit L2: a row of 128K bf16
    is 256 KB, and 132 rows in flight (one per SM) are 33 MB of H100's 50 MB L2, so pass 1 marks its
    loads evict_last and pass 2 evict_first (FwdLaunch.evict). Each pass issues the next block's load
    before reducing the current one (FwdLaunch.prefetch). Ignored rows read nothing and get zeros.
    Measured on the H100 (benchmarks/results/probes/probe_ce.log) the re-read misses L2 (fwd+grad
    costs 2.8x a loss-only pass at 4096-column blocks); FWD_LAUNCH is the sweep's best, 75% of copy.
  _cross_entropy_bwd_kernel: grid (rows, column blocks); p from the saved lse, one read and one write.
    For reduction "none" (the upstream gradient differs per row) and for callers that did not keep the
    forward's gradient.
  The "mean"/"sum" backward multiplies the forward's gradient by the upstream gradient with
    ops/_scale.scale_grad_, which touches no memory when that is 1 (loss.backward()).
  The means' denominators and W = sum(w) come from ops/_cross_entropy_stats.py, on the device (no sync).

Bytes (B = bytes per logit): the fused forward with gradient reads the logits once from DRAM (the
second read is from L2 when it fits) and writes the gradient once: 2 N V B in place or into a separate
buffer alike (the separate buffer costs memory, N V B, not bytes). Loss only: N V B. Recompute backward:
2 N V B. Scaling by an upstream gradient != 1: 2 N V B more.

Registration: the forward op returns (loss, lse, grad), grad being the gradient for an upstream
gradient of 1 (of sum(loss) for "none"), computed in the same pass; the backward op returns
dloss * grad (one factor, or one per row for "none"). Under compile and export that product is a new
tensor (an op may not write into its inputs): one more read and write of a logits-sized tensor. The
eager CUDA path scales the saved gradient in place instead, touching nothing when dloss is 1, and
bumps its version so that a second backward through the same graph raises rather than scale twice.
Writing the gradient over the logits themselves (grad_inplace) is not a registered op: it would
mutate an input; functional/loss.py keeps it as an eager-only autograd.Function.

Targets out of range (and not ignore_index) are never dereferenced: their row's loss, lse and
gradient are NaN. Non-finite logits give a NaN (or inf) loss; -inf logits are allowed (masked classes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._cross_entropy_stats import cross_entropy_stats
from kernel_pytorch.ops._launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._register import Impl, register_op
from kernel_pytorch.ops._row_view import Rows, contiguous_rows, row_view
from kernel_pytorch.ops._scale import scale_grad_, scaled_grad
from kernel_pytorch.reference._math import acc, acc_dtype
from kernel_pytorch.reference.cross_entropy import cross_entropy, cross_entropy_backward, cross_entropy_rows


@dataclass(frozen=True)
class FwdLaunch:
    """How the forward walks the rows."""

    block: int  # columns per step (power of two)
    num_warps: int
    programs_per_sm: int  # 0: one program per row; k > 0: k persistent programs per SM walk the rows
    evict: bool  # pass 1 loads evict_last (kept in L2 for pass 2), pass 2 loads and stores evict_first
    reverse: bool  # pass 2 walks the row from its end: the blocks pass 1 read last, likeliest in L2
    prefetch: bool = True  # each pass loads the next block before reducing this one


# Measured on the H100, 8192 x 128256 bf16 (benchmarks/results/probes/probe_ce.log): with the
# gradient, 16384-column blocks at 32 warps without prefetch (16 elements per thread, one program per
# row) took 1.865 ms = 75.1% of copy, the best of the sweep (4096 x 16 with prefetch, the first choice:
# 2.13 ms). Loss only, that launch drops to 70%; 4096-column blocks at 8 warps with prefetch reach 97%
# there, so the loss-only pass (no_grad, the fused loss's "none" forward) has its own launch.
FWD_LAUNCH = FwdLaunch(block=16384, num_warps=32, programs_per_sm=0, evict=True, reverse=False, prefetch=False)
# None: loss-only passes use FWD_LAUNCH as well (the probe's sweep sets this to time one launch both ways)
LOSS_LAUNCH: FwdLaunch | None = FwdLaunch(block=4096, num_warps=8, programs_per_sm=0, evict=True, reverse=False,
                                          prefetch=True)
# The backward and the scaling are elementwise streams.
BWD_BLOCK, BWD_WARPS = 4096, 8


@triton.jit
def _softcap(x, cap):
    # c * tanh(x / c) = c - 2c / (exp(2x / c) + 1): one exp, saturating cleanly to +-c at +-inf
    return cap - (2.0 * cap) / (tl.exp(x * (2.0 / cap)) + 1.0)


@triton.jit
def _grad_block(x, cols, mask, t, lse, coef_p, coef_t, coef_s, W, cap,
                HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr):
    """dx for one block of a valid row (fp32): coef_p p - coef_t [j == t] - coef_s w_j, times dz/dx."""
    z = x
    if HAS_CAP:
        z = _softcap(x, cap)
    g = coef_p * tl.exp(z - lse) - tl.where(cols == t, coef_t, 0.0)
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


@triton.jit
def _cross_entropy_bwd_kernel(
    X, T, W, STATS, LSE, DLOSS, G,
    n_cols, x_inner, x_s0, x_s1, g_inner, g_s0, g_s1, stride_dloss,
    ignore_index, smoothing, z_scale, cap,
    BLOCK: tl.constexpr, HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr,
    MEAN: tl.constexpr,
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
                        W, cap, HAS_WEIGHT, SMOOTH, HAS_CAP)
        tl.store(g_ptrs, g.to(G.dtype.element_ty), mask=mask)
    else:
        tl.store(g_ptrs, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=mask)


_fwd_kernel = Launcher(_cross_entropy_fwd_kernel)
_bwd_kernel = Launcher(_cross_entropy_bwd_kernel)


@dataclass(frozen=True)
class CrossEntropyOptions:
    """The options every launcher takes (reference/cross_entropy.py gives their meaning)."""

    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None

    def needs_stats(self, weight: Tensor | None) -> bool:
        """Whether the kernels read `cross_entropy_stats`: the mean's denominators, or W = sum(w)."""
        return self.reduction == "mean" or (weight is not None and self.label_smoothing > 0.0)

    def scalars(self) -> tuple[int, float, float, float]:
        return (int(self.ignore_index), float(self.label_smoothing), float(self.lse_square_scale),
                float(self.softcap if self.softcap is not None else 1.0))

    def flags(self, weight: Tensor | None) -> dict[str, bool]:
        return {"HAS_WEIGHT": weight is not None, "SMOOTH": self.label_smoothing > 0.0,
                "HAS_CAP": self.softcap is not None, "MEAN": self.reduction == "mean"}


class CrossEntropyForward(NamedTuple):
    """What `cross_entropy_fwd` returns."""

    loss: Tensor  # 0-d fp32 ("mean"/"sum") or target's shape ("none")
    lse: Tensor  # (N,) fp32 logsumexp of each row's (capped) logits; 0 on ignored rows, NaN on bad targets
    grad: Tensor | None  # logits' shape and dtype, for an upstream gradient of 1; None unless asked for
    stats: Tensor | None  # (3,) fp32 `cross_entropy_stats`, where the kernels needed them; else None


def fwd_launch(n_cols: int, grad: bool = True) -> FwdLaunch:
    """FWD_LAUNCH (LOSS_LAUNCH for a loss-only pass, where set) with its block narrowed to the row (and
    warps to the block) for small vocabularies."""
    launch = FWD_LAUNCH if grad or LOSS_LAUNCH is None else LOSS_LAUNCH
    block = min(launch.block, next_power_of_2(n_cols))
    warps = max(1, min(launch.num_warps, block // 256))
    return FwdLaunch(block, warps, launch.programs_per_sm, launch.evict, launch.reverse, launch.prefetch)


def launch_fwd(
    logits: Rows, target: Tensor, weight: Tensor | None, stats: Tensor | None, loss_rows: Tensor, lse: Tensor,
    grad: Rows | None, opts: CrossEntropyOptions, *, eager: bool = False,
) -> None:
    """The forward kernel into given buffers: loss_rows and lse (N,) fp32, and the gradient's rows
    (`grad`, which may be `logits` itself) unless None. target: (N,) contiguous; `stats` is required
    where opts.needs_stats."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    launch = fwd_launch(v, grad is not None)
    programs = n if launch.programs_per_sm == 0 else min(n, device_programs(loss_rows.device, launch.programs_per_sm))
    g = grad if grad is not None else logits
    _fwd_kernel(
        (programs,), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, loss_rows, lse, g.tensor, n, v, *logits.args, *g.args,
        *opts.scalars(), BLOCK=launch.block, GRAD=grad is not None, PREFETCH=launch.prefetch,
        REVERSE=launch.reverse, KEEP="evict_last" if launch.evict else "", DROP="evict_first" if launch.evict else "",
        num_warps=launch.num_warps, eager=eager, **opts.flags(weight),
    )


def launch_bwd(
    dloss: Tensor, logits: Rows, target: Tensor, lse: Tensor, weight: Tensor | None, stats: Tensor | None,
    grad: Rows, opts: CrossEntropyOptions, *, eager: bool = False,
) -> None:
    """The backward kernel into `grad`'s rows (which may be `logits` itself). target: (N,) contiguous;
    dloss: (N,) contiguous for reduction "none", else one element."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    block = min(BWD_BLOCK, next_power_of_2(v))
    _bwd_kernel(
        (n, triton.cdiv(v, block)), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, lse, dloss, grad.tensor, v, *logits.args, *grad.args,
        1 if opts.reduction == "none" else 0, *opts.scalars(),
        BLOCK=block, num_warps=max(1, min(BWD_WARPS, block // 256)), eager=eager, **opts.flags(weight),
    )


def _grad_rows(logits: Tensor, rows: Rows, inplace: bool) -> tuple[Tensor, Rows]:
    """The gradient tensor (logits' shape) and its rows: the logits' own memory, or (where `row_view`
    had to copy them) the copy, in place; else a new contiguous buffer."""
    if inplace:
        return (logits if rows.same_storage(logits) else rows.tensor.view(logits.shape)), rows
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    return grad, contiguous_rows(grad)


def cross_entropy_fwd(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    with_grad: bool = True,
    grad_inplace: bool = False,
    eager: bool = False,
) -> CrossEntropyForward:
    """Loss, lse and (with_grad) the gradient for an upstream gradient of 1, in one kernel.

    Args:
        logits: (..., V) fp32/bf16/fp16; rows may be strided (`row_view`), columns are made unit-stride.
        target: (...) integer class indices, one per row of logits.
        weight: (V,) class weights or None.
        reduction: "mean", "sum" or "none"; for "none" the gradient is that of sum(loss) (the backward
            of a per-row upstream gradient is `cross_entropy_bwd`).
        with_grad: also write the gradient; grad_inplace: write it over the logits (which the caller
            must not need again) and return them as the gradient.
        eager: launch directly rather than through wrap_triton.
    """
    opts = CrossEntropyOptions(ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    rows = row_view(logits)
    t = target.reshape(-1).contiguous()
    if t.numel() != rows.n_rows:
        raise ValueError(f"target has {t.numel()} elements for {rows.n_rows} rows of logits")
    loss_rows = torch.empty(rows.n_rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(loss_rows)
    grad, g_rows = _grad_rows(logits, rows, grad_inplace) if with_grad else (None, None)
    stats = cross_entropy_stats(t, weight, logits.shape[-1], ignore_index, eager=eager) \
        if opts.needs_stats(weight) else None
    launch_fwd(rows, t, weight, stats, loss_rows, lse, g_rows, opts, eager=eager)
    loss = loss_rows.view(target.shape) if reduction == "none" else loss_rows.sum()
    return CrossEntropyForward(loss, lse, grad, stats)


def cross_entropy_bwd(
    dloss: Tensor,
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    weight: Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    grad_inplace: bool = False,
    stats: Tensor | None = None,
    eager: bool = False,
) -> Tensor:
    """The gradient for the upstream gradient `dloss`, recomputed from the logits and the forward's lse.

    Args:
        dloss: target's shape for reduction "none", else 0-d.
        logits, target, weight and the options: as given to `cross_entropy_fwd`; lse: its lse.
        grad_inplace: write the gradient over the logits and return them.
        stats: the forward's stats where it returned them (else computed where needed).
    Returns:
        logits' shape and dtype.
    """
    opts = CrossEntropyOptions(ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    rows = row_view(logits)
    grad, g_rows = _grad_rows(logits, rows, grad_inplace)
    t = target.reshape(-1).contiguous()
    if stats is None and opts.needs_stats(weight):
        stats = cross_entropy_stats(t, weight, logits.shape[-1], ignore_index, eager=eager)
    dl = dloss.reshape(-1).contiguous() if reduction == "none" else dloss.reshape(1)
    launch_bwd(dl, rows, t, lse.contiguous(), weight, stats, g_rows, opts, eager=eager)
    return grad


# Registration. softcap 0.0 stands for no cap (an op schema takes no Optional float here);
# with_grad=False computes loss and lse only (the logits need no gradient).


def _fwd_launch(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                label_smoothing: float, lse_square_scale: float, softcap: float, with_grad: bool, *,
                eager: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    out = cross_entropy_fwd(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                            softcap=softcap or None, with_grad=with_grad, eager=eager)
    return out.loss, out.lse, out.grad


def _bwd_launch(dloss: Tensor, grad: Tensor, *, eager: bool = False) -> Tensor:
    if eager:  # the saved gradient is this backward's alone (module docstring): scale it where it is
        scale_grad_(grad, dloss, eager=True)
        torch.autograd.graph.increment_version(grad)
        return grad
    return scaled_grad(grad, dloss)


def _fwd_reference(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                   label_smoothing: float, lse_square_scale: float, softcap: float, with_grad: bool,
                   ) -> tuple[Tensor, Tensor, Tensor | None]:
    cap = softcap or None
    loss = cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, cap)
    _, _, lse = cross_entropy_rows(logits, target, weight, ignore_index, label_smoothing, lse_square_scale, cap)
    lse = torch.where(target.reshape(-1) != ignore_index, lse, torch.zeros((), dtype=lse.dtype))
    grad = None
    if with_grad:
        ones = torch.ones(target.shape if reduction == "none" else (), dtype=loss.dtype, device=logits.device)
        grad = cross_entropy_backward(ones, logits, target, weight, ignore_index, reduction, label_smoothing,
                                      lse_square_scale, cap).contiguous()
    return loss, lse, grad


def _bwd_reference(dloss: Tensor, grad: Tensor) -> Tensor:
    return (acc(grad) * acc(dloss).unsqueeze(-1)).to(grad.dtype).contiguous()


def _fwd_fake(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
              label_smoothing: float, lse_square_scale: float, softcap: float, with_grad: bool,
              ) -> tuple[Tensor, Tensor, Tensor | None]:
    dtype = acc_dtype(logits.dtype)
    loss = logits.new_empty(target.shape if reduction == "none" else (), dtype=dtype)
    lse = logits.new_empty(target.numel(), dtype=dtype)
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device) if with_grad else None
    return loss, lse, grad


def _bwd_fake(dloss: Tensor, grad: Tensor) -> Tensor:
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


# kernel_pytorch::cross_entropy_fwd (logits, target, weight?, ignore_index, reduction, label_smoothing,
# lse_square_scale, softcap, with_grad) -> (loss, lse, grad) and cross_entropy_bwd (dloss, grad) -> dlogits;
# cross_entropy_eager(...same arguments) -> loss
cross_entropy_fwd_op, cross_entropy_bwd_op, cross_entropy_eager = register_op(
    "cross_entropy",
    Impl(_fwd_launch, _fwd_reference, _fwd_fake, outputs=("loss", "lse", "grad")),
    Impl(_bwd_launch, _bwd_reference, _bwd_fake, outputs=("dlogits",)),
    differentiable=("loss",),
    save=("grad",),
    grads={"logits": "dlogits"},
)
