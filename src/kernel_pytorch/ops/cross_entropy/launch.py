"""The cross-entropy launchers: the two-pass forward and the backward into given buffers, and the
Python entries `cross_entropy_fwd` / `cross_entropy_bwd` that allocate them (register.py registers them).

Math (reference/cross_entropy.py, the specification), for logits x (N, V), targets t (N,), class
weights w (V,), smoothing eps, z-loss scale s, soft-cap c: z = c * tanh(x / c), lse = logsumexp(z),
ce_i = (1 - eps) w[t_i] (lse_i - z_i,t_i) + eps / V sum_j w_j (lse_i - z_ij), zl_i = s lse_i^2, and

    dx_ij = [r_i (A_i p_ij - (1 - eps) w[t_i] [j == t_i] - eps / V w_j) + q_i 2 s lse_i p_ij] (1 - (z_ij / c)^2)

with p = exp(z - lse), A_i = (1 - eps) w[t_i] + eps W / V (W = sum w), and (r, q) the reduction's
row scales (1 for "sum" and "none", 1 / sum valid w[t] and 1 / number of valid rows for "mean").

Kernels: kernels.py (one forward kernel computing loss, lse and the gradient in two passes over each
row; one elementwise backward kernel); launch knobs: config.CrossEntropyConfig.

Bytes (B = bytes per logit): the fused forward with gradient reads the logits once from DRAM (the
second read is from L2 when it fits) and writes the gradient once: 2 N V B in place or into a separate
buffer alike (the separate buffer costs memory, N V B, not bytes). Loss only: N V B. Recompute backward:
2 N V B. Scaling by an upstream gradient != 1: 2 N V B more. At large vocabularies the second read
comes from DRAM (kernels.py says what was measured, and which row-split designs were tried instead).

Token scales u (N,) multiply r and q row by row; with `argmax` pass 1 also keeps each row's largest
logit and its column (reference/cross_entropy_extras.py: the predicted tokens).

Targets out of range (and not ignore_index) are never dereferenced: their row's loss, lse and
gradient are NaN. Non-finite logits give a NaN (or inf) loss; -inf logits are allowed (masked classes).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._activations import precise_math
from kernel_pytorch.ops._common.launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._common.row_view import Rows, contiguous_rows, row_view
from kernel_pytorch.ops.cross_entropy.config import CrossEntropyConfig, FwdLaunch
from kernel_pytorch.ops.cross_entropy.kernels import _cross_entropy_bwd_kernel, _cross_entropy_fwd_kernel
from kernel_pytorch.ops.cross_entropy.stats import cross_entropy_stats
from kernel_pytorch.reference.cross_entropy import DEFAULT_OPTIONS, CrossEntropyOptions

_fwd_kernel = Launcher(_cross_entropy_fwd_kernel)
_bwd_kernel = Launcher(_cross_entropy_bwd_kernel)


class RowInputs(NamedTuple):
    """What the kernels read beside the logits, rows flattened."""

    target: Tensor  # (N,) contiguous class indices
    weight: Tensor | None  # (V,) class weights
    stats: Tensor | None  # (3,) fp32 `cross_entropy_stats`, required where `needs_stats`
    token_scale: Tensor | None  # (N,) contiguous, each row's factor

    def chunk(self, start: int, end: int) -> RowInputs:
        """Rows [start, end) (the class weights and stats are the whole batch's)."""
        ts = self.token_scale[start:end] if self.token_scale is not None else None
        return RowInputs(self.target[start:end], self.weight, self.stats, ts)


class RowOutputs(NamedTuple):
    """What the forward writes per row: (N,) fp32 loss and lse, and (N,) int64 argmax or None."""

    loss: Tensor
    lse: Tensor
    pred: Tensor | None = None

    def chunk(self, start: int, end: int) -> RowOutputs:
        return RowOutputs(self.loss[start:end], self.lse[start:end],
                          self.pred[start:end] if self.pred is not None else None)


class CrossEntropyForward(NamedTuple):
    """What `cross_entropy_fwd` returns."""

    loss: Tensor  # 0-d fp32 ("mean"/"sum") or target's shape ("none")
    lse: Tensor  # (N,) fp32 logsumexp of each row's (capped) logits; 0 on ignored rows, NaN on bad targets
    grad: Tensor | None  # logits' shape and dtype, for an upstream gradient of 1; None unless asked for
    stats: Tensor | None  # (3,) fp32 `cross_entropy_stats`, where the kernels needed them; else None
    pred: Tensor | None = None  # (N,) int64 argmax of each row, -1 on ignored rows; None unless asked for


def needs_stats(options: CrossEntropyOptions, weight: Tensor | None) -> bool:
    """Whether the kernels read `cross_entropy_stats`: the mean's denominators, or W = sum(w)."""
    return options.reduction == "mean" or (weight is not None and options.label_smoothing > 0.0)


def row_inputs(target: Tensor, weight: Tensor | None, options: CrossEntropyOptions, n_classes: int,
               token_scale: Tensor | None, *, stats: Tensor | None = None, eager: bool = False) -> RowInputs:
    """The kernels' row inputs: flat contiguous targets and token scales, and the stats where needed
    (`stats` where the forward returned them, else computed on the device)."""
    t = target.reshape(-1).contiguous()
    if stats is None and needs_stats(options, weight):
        stats = cross_entropy_stats(t, weight, n_classes, options.ignore_index, eager=eager)
    ts = token_scale.reshape(-1).contiguous() if token_scale is not None else None
    return RowInputs(t, weight.contiguous() if weight is not None else None, stats, ts)


def _scalars(options: CrossEntropyOptions) -> tuple[int, float, float, float]:
    return (int(options.ignore_index), float(options.label_smoothing), float(options.lse_square_scale),
            float(options.softcap if options.softcap is not None else 1.0))


def _flags(options: CrossEntropyOptions, weight: Tensor | None) -> dict[str, bool]:
    return {"HAS_WEIGHT": weight is not None, "SMOOTH": options.label_smoothing > 0.0,
            "HAS_CAP": options.softcap is not None, "MEAN": options.reduction == "mean"}


def fwd_launch(n_cols: int, grad: bool = True, config: CrossEntropyConfig | None = None) -> FwdLaunch:
    """config.fwd (config.loss for a loss-only pass, where set) with its block narrowed to the row (and
    warps to the block) for small vocabularies; config: the one in force by default."""
    config = config or tuning.current("cross_entropy")
    launch = config.fwd if grad or config.loss is None else config.loss
    block = min(launch.block, next_power_of_2(n_cols))
    warps = max(1, min(launch.num_warps, block // 256))
    return FwdLaunch(block, warps, launch.programs_per_sm, launch.evict, launch.reverse, launch.prefetch)


def launch_fwd(logits: Rows, inputs: RowInputs, out: RowOutputs, grad: Rows | None, options: CrossEntropyOptions,
               *, eager: bool = False) -> None:
    """The forward kernel: out's loss and lse rows, its argmax where `out.pred` is given, and the
    gradient's rows (`grad`, which may be `logits` itself) unless None."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    launch = fwd_launch(v, grad is not None)
    lse = out.lse
    programs = n if launch.programs_per_sm == 0 else min(n, device_programs(lse.device, launch.programs_per_sm))
    g = grad if grad is not None else logits
    w, ts = inputs.weight, inputs.token_scale
    _fwd_kernel(
        (programs,), logits.tensor, inputs.target, w if w is not None else lse,
        inputs.stats if inputs.stats is not None else lse, out.loss, lse, g.tensor,
        ts if ts is not None else lse, out.pred if out.pred is not None else inputs.target,
        n, v, *logits.args, *g.args, *_scalars(options), BLOCK=launch.block, GRAD=grad is not None,
        PREFETCH=launch.prefetch, HAS_SCALE=ts is not None, ARGMAX=out.pred is not None,
        REVERSE=launch.reverse, KEEP="evict_last" if launch.evict else "", DROP="evict_first" if launch.evict else "",
        num_warps=launch.num_warps, PRECISE=precise_math(logits.tensor), eager=eager, **_flags(options, w),
    )


def launch_bwd(dloss: Tensor, logits: Rows, inputs: RowInputs, lse: Tensor, grad: Rows,
               options: CrossEntropyOptions, *, eager: bool = False) -> None:
    """The backward kernel into `grad`'s rows (which may be `logits` itself). dloss: (N,) contiguous for
    reduction "none", else one element; lse: (N,) the forward's."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    config = tuning.current("cross_entropy")
    block = min(config.bwd_block, next_power_of_2(v))
    w, ts = inputs.weight, inputs.token_scale
    _bwd_kernel(
        (n, triton.cdiv(v, block)), logits.tensor, inputs.target, w if w is not None else lse,
        inputs.stats if inputs.stats is not None else lse, lse, dloss, grad.tensor,
        ts if ts is not None else lse, v, *logits.args, *grad.args,
        1 if options.reduction == "none" else 0, *_scalars(options),
        BLOCK=block, num_warps=max(1, min(config.bwd_warps, block // 256)), PRECISE=precise_math(logits.tensor),
        HAS_SCALE=ts is not None, eager=eager, **_flags(options, w),
    )


def _grad_rows(logits: Tensor, rows: Rows, inplace: bool) -> tuple[Tensor, Rows]:
    """The gradient tensor (logits' shape) and its rows: the logits' own memory, or (where `row_view`
    had to copy them) the copy, in place; else a new contiguous buffer."""
    if inplace:
        return (logits if rows.same_storage(logits) else rows.tensor.view(logits.shape)), rows
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    return grad, contiguous_rows(grad)


def cross_entropy_fwd(
    logits: Tensor, target: Tensor, weight: Tensor | None = None, options: CrossEntropyOptions = DEFAULT_OPTIONS,
    *, with_grad: bool = True, grad_inplace: bool = False, token_scale: Tensor | None = None,
    argmax: bool = False, eager: bool = False,
) -> CrossEntropyForward:
    """Loss, lse and (with_grad) the gradient for an upstream gradient of 1, in one kernel.

    Args:
        logits: (..., V) fp32/bf16/fp16; rows may be strided (`row_view`), columns are made unit-stride.
        target: (...) integer class indices, one per row of logits.
        weight: (V,) class weights or None.
        options: for reduction "none" the gradient is that of sum(loss) (the backward of a per-row
            upstream gradient is `cross_entropy_bwd`); the return_* flags are not read.
        with_grad: also write the gradient; grad_inplace: write it over the logits (which the caller
            must not need again) and return them as the gradient.
        token_scale: (...) of target's shape, each row's factor of its loss and gradient, or None.
        argmax: also return each row's argmax (`pred`).
        eager: launch directly rather than through wrap_triton.
    """
    rows = row_view(logits)
    if target.numel() != rows.n_rows:
        raise ValueError(f"target has {target.numel()} elements for {rows.n_rows} rows of logits")
    inputs = row_inputs(target, weight, options, logits.shape[-1], token_scale, eager=eager)
    loss_rows = torch.empty(rows.n_rows, dtype=torch.float32, device=logits.device)
    pred = torch.empty(rows.n_rows, dtype=torch.int64, device=logits.device) if argmax else None
    out = RowOutputs(loss_rows, torch.empty_like(loss_rows), pred)
    grad, g_rows = _grad_rows(logits, rows, grad_inplace) if with_grad else (None, None)
    launch_fwd(rows, inputs, out, g_rows, options, eager=eager)
    loss = loss_rows.view(target.shape) if options.reduction == "none" else loss_rows.sum()
    return CrossEntropyForward(loss, out.lse, grad, inputs.stats, pred)


def cross_entropy_bwd(
    dloss: Tensor, logits: Tensor, target: Tensor, forward: CrossEntropyForward, weight: Tensor | None = None,
    options: CrossEntropyOptions = DEFAULT_OPTIONS, *, grad_inplace: bool = False, token_scale: Tensor | None = None,
    eager: bool = False,
) -> Tensor:
    """The gradient for the upstream gradient `dloss`, recomputed from the logits and the forward's lse.

    Args:
        dloss: target's shape for reduction "none", else 0-d.
        logits, target, weight, options, token_scale: as given to `cross_entropy_fwd`; forward: what it
            returned (its lse, and its stats where it computed them).
        grad_inplace: write the gradient over the logits and return them.
    Returns:
        logits' shape and dtype.
    """
    rows = row_view(logits)
    grad, g_rows = _grad_rows(logits, rows, grad_inplace)
    inputs = row_inputs(target, weight, options, logits.shape[-1], token_scale, stats=forward.stats, eager=eager)
    dl = dloss.reshape(-1).contiguous() if options.reduction == "none" else dloss.reshape(1)
    launch_bwd(dl, rows, inputs, forward.lse.contiguous(), g_rows, options, eager=eager)
    return grad
