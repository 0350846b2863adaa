"""Cross-entropy kernels and their launchers, registered as `kernel_pytorch::cross_entropy_fwd` / `_bwd`.

Math (reference/cross_entropy.py, the specification), for logits x (N, V), targets t (N,), class
weights w (V,), smoothing eps, z-loss scale s, soft-cap c: z = c * tanh(x / c), lse = logsumexp(z),
ce_i = (1 - eps) w[t_i] (lse_i - z_i,t_i) + eps / V sum_j w_j (lse_i - z_ij), zl_i = s lse_i^2, and

    dx_ij = [r_i (A_i p_ij - (1 - eps) w[t_i] [j == t_i] - eps / V w_j) + q_i 2 s lse_i p_ij] (1 - (z_ij / c)^2)

with p = exp(z - lse), A_i = (1 - eps) w[t_i] + eps W / V (W = sum w), and (r, q) the reduction's
row scales (1 for "sum" and "none", 1 / sum valid w[t] and 1 / number of valid rows for "mean").

Kernels: ops/_cross_entropy_kernels.py (one forward kernel computing loss, lse and the gradient in two
passes over each row; one elementwise backward kernel).

Bytes (B = bytes per logit): the fused forward with gradient reads the logits once from DRAM (the
second read is from L2 when it fits) and writes the gradient once: 2 N V B in place or into a separate
buffer alike (the separate buffer costs memory, N V B, not bytes). Loss only: N V B. Recompute backward:
2 N V B. Scaling by an upstream gradient != 1: 2 N V B more. At large vocabularies the second read
comes from DRAM (ops/_cross_entropy_kernels.py says what was measured, and which row-split designs
were tried instead).

Token scales u (N,) multiply r and q row by row; with `argmax` pass 1 also keeps each row's largest
logit and its column (reference/cross_entropy_extras.py: the predicted tokens).

Registration: the forward op returns (loss, lse, grad, pred), grad being the gradient for an upstream
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
from torch import Tensor

from kernel_pytorch.ops._activations import precise_math
from kernel_pytorch.ops._common.launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.row_view import Rows, contiguous_rows, row_view
from kernel_pytorch.ops._common.scale import scale_grad_, scaled_grad
from kernel_pytorch.ops._cross_entropy_kernels import _cross_entropy_bwd_kernel, _cross_entropy_fwd_kernel
from kernel_pytorch.ops._cross_entropy_stats import cross_entropy_stats
from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.cross_entropy import cross_entropy, cross_entropy_backward, cross_entropy_rows
from kernel_pytorch.reference.cross_entropy_extras import predicted_tokens


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
    pred: Tensor | None = None  # (N,) int64 argmax of each row, -1 on ignored rows; None unless asked for


def fwd_launch(n_cols: int, grad: bool = True) -> FwdLaunch:
    """FWD_LAUNCH (LOSS_LAUNCH for a loss-only pass, where set) with its block narrowed to the row (and
    warps to the block) for small vocabularies."""
    launch = FWD_LAUNCH if grad or LOSS_LAUNCH is None else LOSS_LAUNCH
    block = min(launch.block, next_power_of_2(n_cols))
    warps = max(1, min(launch.num_warps, block // 256))
    return FwdLaunch(block, warps, launch.programs_per_sm, launch.evict, launch.reverse, launch.prefetch)


def launch_fwd(
    logits: Rows, target: Tensor, weight: Tensor | None, stats: Tensor | None, loss_rows: Tensor, lse: Tensor,
    grad: Rows | None, opts: CrossEntropyOptions, *, token_scale: Tensor | None = None, pred: Tensor | None = None,
    eager: bool = False,
) -> None:
    """The forward kernel into given buffers: loss_rows and lse (N,) fp32, and the gradient's rows
    (`grad`, which may be `logits` itself) unless None. target: (N,) contiguous; `stats` is required
    where opts.needs_stats. token_scale: (N,) contiguous, each row's factor, or None; pred: (N,) int64
    for each row's argmax (-1 on ignored rows), or None."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    launch = fwd_launch(v, grad is not None)
    programs = n if launch.programs_per_sm == 0 else min(n, device_programs(loss_rows.device, launch.programs_per_sm))
    g = grad if grad is not None else logits
    _fwd_kernel(
        (programs,), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, loss_rows, lse, g.tensor,
        token_scale if token_scale is not None else lse, pred if pred is not None else target,
        n, v, *logits.args, *g.args, *opts.scalars(), BLOCK=launch.block, GRAD=grad is not None,
        PREFETCH=launch.prefetch, HAS_SCALE=token_scale is not None, ARGMAX=pred is not None,
        REVERSE=launch.reverse, KEEP="evict_last" if launch.evict else "", DROP="evict_first" if launch.evict else "",
        num_warps=launch.num_warps, PRECISE=precise_math(logits.tensor), eager=eager, **opts.flags(weight),
    )


def launch_bwd(
    dloss: Tensor, logits: Rows, target: Tensor, lse: Tensor, weight: Tensor | None, stats: Tensor | None,
    grad: Rows, opts: CrossEntropyOptions, *, token_scale: Tensor | None = None, eager: bool = False,
) -> None:
    """The backward kernel into `grad`'s rows (which may be `logits` itself). target: (N,) contiguous;
    dloss: (N,) contiguous for reduction "none", else one element; token_scale: (N,) contiguous or None."""
    n, v = logits.n_rows, logits.tensor.shape[-1]
    if n == 0:
        return
    block = min(BWD_BLOCK, next_power_of_2(v))
    _bwd_kernel(
        (n, triton.cdiv(v, block)), logits.tensor, target, weight.contiguous() if weight is not None else lse,
        stats if stats is not None else lse, lse, dloss, grad.tensor,
        token_scale if token_scale is not None else lse, v, *logits.args, *grad.args,
        1 if opts.reduction == "none" else 0, *opts.scalars(),
        BLOCK=block, num_warps=max(1, min(BWD_WARPS, block // 256)), PRECISE=precise_math(logits.tensor),
        HAS_SCALE=token_scale is not None, eager=eager, **opts.flags(weight),
    )


def flat_token_scale(token_scale: Tensor | None) -> Tensor | None:
    """Token scales as the kernels read them: (N,) contiguous."""
    return token_scale.reshape(-1).contiguous() if token_scale is not None else None


def _grad_rows(logits: Tensor, rows: Rows, inplace: bool) -> tuple[Tensor, Rows]:
    """The gradient tensor (logits' shape) and its rows: the logits' own memory, or (where `row_view`
    had to copy them) the copy, in place; else a new contiguous buffer."""
    if inplace:
        return (logits if rows.same_storage(logits) else rows.tensor.view(logits.shape)), rows
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
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
    token_scale: Tensor | None = None,
    argmax: bool = False,
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
        token_scale: (...) of target's shape, each row's factor of its loss and gradient, or None.
        argmax: also return each row's argmax (`pred`).
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
    ts = flat_token_scale(token_scale)
    pred = torch.empty(rows.n_rows, dtype=torch.int64, device=logits.device) if argmax else None
    launch_fwd(rows, t, weight, stats, loss_rows, lse, g_rows, opts, token_scale=ts, pred=pred, eager=eager)
    loss = loss_rows.view(target.shape) if reduction == "none" else loss_rows.sum()
    return CrossEntropyForward(loss, lse, grad, stats, pred)


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
    token_scale: Tensor | None = None,
    eager: bool = False,
) -> Tensor:
    """The gradient for the upstream gradient `dloss`, recomputed from the logits and the forward's lse.

    Args:
        dloss: target's shape for reduction "none", else 0-d.
        logits, target, weight and the options: as given to `cross_entropy_fwd`; lse: its lse.
        grad_inplace: write the gradient over the logits and return them.
        stats: the forward's stats where it returned them (else computed where needed).
        token_scale: as given to `cross_entropy_fwd`.
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
    launch_bwd(dl, rows, t, lse.contiguous(), weight, stats, g_rows, opts, token_scale=flat_token_scale(token_scale),
               eager=eager)
    return grad


# Registration. softcap 0.0 stands for no cap (an op schema takes no Optional float here);
# with_grad=False computes loss and lse only (the logits need no gradient); argmax=True fills `pred`
# (empty otherwise). No gradient reaches token_scale.


def _fwd_launch(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                label_smoothing: float, lse_square_scale: float, softcap: float, with_grad: bool,
                token_scale: Tensor | None = None, argmax: bool = False, *,
                eager: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    out = cross_entropy_fwd(logits, target, weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                            softcap=softcap or None, with_grad=with_grad, token_scale=token_scale, argmax=argmax,
                            eager=eager)
    return out.loss, out.lse, out.grad, out.pred


def _bwd_launch(dloss: Tensor, grad: Tensor, *, eager: bool = False) -> Tensor:
    if eager:  # the saved gradient is this backward's alone (module docstring): scale it where it is
        scale_grad_(grad, dloss, eager=True)
        torch.autograd.graph.increment_version(grad)
        return grad
    return scaled_grad(grad, dloss)


def _fwd_reference(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str,
                   label_smoothing: float, lse_square_scale: float, softcap: float, with_grad: bool,
                   token_scale: Tensor | None = None, argmax: bool = False,
                   ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    cap = softcap or None
    loss = cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale, cap,
                         token_scale)
    _, _, lse = cross_entropy_rows(logits, target, weight, ignore_index, label_smoothing, lse_square_scale, cap)
    lse = torch.where(target.reshape(-1) != ignore_index, lse, torch.zeros((), dtype=lse.dtype))
    grad = None
    if with_grad:
        ones = torch.ones(target.shape if reduction == "none" else (), dtype=loss.dtype, device=logits.device)
        grad = cross_entropy_backward(ones, logits, target, weight, ignore_index, reduction, label_smoothing,
                                      lse_square_scale, cap, token_scale).contiguous()
    pred = predicted_tokens(logits, target, ignore_index).reshape(-1) if argmax else None
    return loss, lse, grad, pred


def _bwd_reference(dloss: Tensor, grad: Tensor) -> Tensor:
    return (acc(grad) * acc(dloss).unsqueeze(-1)).to(grad.dtype).contiguous()


# kernel_pytorch::cross_entropy_fwd (logits, target, weight?, ignore_index, reduction, label_smoothing,
# lse_square_scale, softcap, with_grad, token_scale?, argmax) -> (loss, lse, grad, pred) and
# cross_entropy_bwd (dloss, grad) -> dlogits;
# cross_entropy_eager(...same arguments) -> loss
cross_entropy_fwd_op, cross_entropy_bwd_op, cross_entropy_eager = register_op(
    "cross_entropy",
    Impl(_fwd_launch, _fwd_reference, "reference", outputs=("loss", "lse", "grad", "pred")),
    Impl(_bwd_launch, _bwd_reference, "reference", outputs=("dlogits",)),
    differentiable=("loss",),
    save=("grad",),
    grads={"logits": "dlogits"},
)
