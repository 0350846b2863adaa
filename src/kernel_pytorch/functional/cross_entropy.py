"""The cross-entropy family: cross_entropy and fused_linear_cross_entropy. Each validates its arguments once (eager
only: types, shapes, dtypes, options, and the targets' range, which reads them: a host sync), resolves
the backend (functional/_dispatch.py) and runs the eager launchers, the registered op or the reference.

Both compute the gradient in the forward (one pass over the logits; for the fused loss, chunk by chunk
without ever holding all the logits) and scale it by the upstream gradient in the backward. An
all-ignored batch gives what torch gives: "mean" is 0/0 = NaN, "sum" 0, and the gradient is 0.

`cross_entropy(..., inplace_backward=True)` writes the gradient over the logits (no logits-sized
buffer): the caller promises not to read the logits again. That is an eager CUDA autograd.Function
here, not a registered op: an op that writes into its input must declare it (mutates_args), and compile
would then copy the logits to keep the graph functional, losing the memory it saves. Under compile, and
off CUDA, the flag is ignored. The logits' version is bumped, so an autograd node that saved them
raises instead of reading the gradient.

Beside the loss a training loop logs: `return_z_loss`, `return_token_accuracy` and
`return_predicted_tokens` (Liger-Kernel's names) make a call return a `LossOutput(loss, z_loss,
token_accuracy, predicted_tokens)` (reference/cross_entropy_extras.py), the unrequested fields None; a
call asking for none returns the loss tensor. The kernels take each row's argmax in their pass over the
logits, so the fused loss still never holds them. Such a call runs the registered op even in eager
mode: the eager entry returns the loss alone, the op its lse and argmax too. `token_scale` (target's
shape) multiplies each row's loss and gradient before the reduction (reference/cross_entropy.py).

The public functions take the options (the fields of `CrossEntropyOptions`, reference/cross_entropy.py)
as keyword arguments and build that one object from them, naming any keyword that is no option;
`cross_entropy_with` and `fused_linear_cross_entropy_with` take the object (the nn modules call them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch.functional._dispatch import Backend, _resolve, kernels
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions, cross_entropy_rows
from kernel_pytorch.reference.cross_entropy_checks import (
    check_class_weight,
    check_cross_entropy_args,
    check_finite_loss,
    check_linear_args,
    check_options,
    check_target,
    check_target_range,
    check_token_scale,
)
from kernel_pytorch.reference.cross_entropy_extras import LossOutput, loss_output, predicted_tokens


class _CrossEntropyInplace(torch.autograd.Function):
    """Eager CUDA cross-entropy whose gradient is written over the logits (module docstring)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, weight: Tensor | None,  # noqa: ANN001
                options: CrossEntropyOptions, token_scale: Tensor | None = None,
                ) -> tuple[Tensor, Tensor, Tensor | None]:
        """-> (loss, lse, argmax of each row or None), the last two for LossOutput."""
        out = kernels().cross_entropy.cross_entropy_fwd(logits, target, weight, options, grad_inplace=True,
                                                        token_scale=token_scale, argmax=options.argmax, eager=True)
        # logits now hold the gradient: whoever saved them must not read them as logits
        torch.autograd.graph.increment_version(logits)
        ctx.grad = out.grad  # not save_for_backward: that would check the version just bumped
        ctx.mark_non_differentiable(out.lse)
        return out.loss, out.lse, out.pred

    @staticmethod
    def backward(ctx, dloss: Tensor, *_: Tensor | None) -> tuple:  # noqa: ANN001
        grad, ctx.grad = ctx.grad, None  # the buffer is this backward's alone; a second one finds None
        if grad is None:
            raise RuntimeError("cross_entropy(inplace_backward=True) can run its backward once only "
                               "(its gradient was written over the logits and handed out)")
        kernels().cross_entropy.scale_grad_(grad, dloss, eager=True)
        return grad, None, None, None, None


def _reference_extras(logits: Tensor, target: Tensor, options: CrossEntropyOptions,
                      ) -> tuple[Tensor | None, Tensor | None]:
    """(each row's lse, its argmax), where asked for, from logits the reference path holds."""
    logits = logits.detach()
    lse = cross_entropy_rows(logits, target, None, options)[2] if options.return_z_loss else None
    return lse, predicted_tokens(logits, target, options.ignore_index) if options.argmax else None


def _explain_non_finite(loss: Tensor, logits: Tensor, target: Tensor, weight: Tensor | None,
                        options: CrossEntropyOptions, readable: bool) -> None:
    """Raise FloatingPointError naming the first row whose loss is not finite, and why."""
    if bool(torch.isfinite(loss).all()):
        return
    if not readable:  # the logits hold the gradient now
        check_finite_loss(loss)
        return
    rows = reference.cross_entropy(logits.detach(), target, weight, CrossEntropyOptions(
        options.ignore_index, "none", options.label_smoothing, options.lse_square_scale, options.softcap))
    check_finite_loss(rows, logits.detach())
    raise FloatingPointError(f"the loss is {float(loss.reshape(-1)[0])} with finite rows: no row is counted "
                             "(every target is ignore_index, or their class weights sum to 0)")


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    *,
    token_scale: Tensor | None = None,
    inplace_backward: bool = False,
    check_finite: bool = False,
    backend: Backend = "auto",
    **options: Any,
) -> Tensor | LossOutput:
    """Cross-entropy over class indices (torch.nn.functional.cross_entropy semantics, the class dim
    last), with z-loss and logit soft-capping; loss and gradient in one pass (reference/cross_entropy.py).

    Args:
        logits: (..., V) fp32/bf16/fp16 (fp64 runs the reference).
        target: (...) int64 (or uint8) class indices, or ignore_index.
        weight: (V,) class weights or None.
        token_scale: (...) of target's shape, a float factor of each row's loss and gradient, or None.
        inplace_backward: write the gradient over the logits (eager CUDA; module docstring).
        check_finite: raise FloatingPointError naming the first row whose loss is not finite (a host sync).
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
        options: the fields of `CrossEntropyOptions`, by name (each defaults to its default there):
            ignore_index (-100); reduction ("mean", "sum" or "none"); label_smoothing (in [0, 1]);
            lse_square_scale (z-loss scale: adds scale * lse^2 per row); softcap (c in c * tanh(x / c), or
            None); return_z_loss, return_token_accuracy, return_predicted_tokens (return a LossOutput with
            these: module docstring; reference/cross_entropy_extras.py gives their values).
    Returns:
        fp32 loss (fp64 for fp64 logits): 0-d, or target's shape for "none"; a LossOutput where an
        extra is asked for.
    """
    options = CrossEntropyOptions.from_keywords("cross_entropy", options)
    return cross_entropy_with(logits, target, weight, options, token_scale=token_scale,
                              inplace_backward=inplace_backward, check_finite=check_finite, backend=backend)


def cross_entropy_with(
    logits: Tensor, target: Tensor, weight: Tensor | None, options: CrossEntropyOptions, *,
    token_scale: Tensor | None = None, inplace_backward: bool = False, check_finite: bool = False,
    backend: Backend = "auto",
) -> Tensor | LossOutput:
    """`cross_entropy` with its options as one object (the arguments as there)."""
    compiling = torch.compiler.is_compiling()
    if not compiling:
        check_cross_entropy_args(logits, target, weight, options)
        check_token_scale(token_scale, target)
        check_target_range(target, logits.shape[-1], options.ignore_index)
    path = _resolve(backend, "cross_entropy", logits, compiling)
    with_grad = torch.is_grad_enabled() and logits.requires_grad
    inplace = False
    lse = pred = None
    if path == "eager" and inplace_backward and with_grad:
        inplace = True
        loss, lse, pred = _CrossEntropyInplace.apply(logits, target, weight, options, token_scale)
    elif path == "eager" and not options.extras:
        loss = kernels().cross_entropy_eager(logits, target, weight, *options.flat(), with_grad, token_scale)
    elif path in ("eager", "op"):
        loss, lse, _, pred = torch.ops.kernel_pytorch.cross_entropy_fwd(
            logits, target, weight, *options.flat(), with_grad, token_scale, options.argmax)
    else:
        loss = reference.cross_entropy(logits, target, weight, options, token_scale)
        if options.extras:
            lse, pred = _reference_extras(logits, target, options)
    if check_finite and not compiling:
        _explain_non_finite(loss, logits, target, weight, options, not inplace)
    if not options.extras:
        return loss
    return loss_output(loss, lse, pred if options.argmax else None, target, options, token_scale)


def fused_linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ce_weight: Tensor | None = None,
    token_scale: Tensor | None = None,
    backend: Backend = "auto",
    **options: Any,
) -> Tensor | LossOutput:
    """cross_entropy(x @ weight.T + bias, target) without holding all the logits: chunks of rows sized
    from the shapes and the free memory (ops/cross_entropy/fused_linear.py).

    Args:
        x: (..., H) fp32/bf16/fp16; weight: (V, H) of x's dtype (may be tied to the input embedding);
            target: (...) class indices; bias: (V,) or None.
        ce_weight: (V,) class weights (torch's `weight`); token_scale, backend and the options (the
            fields of `CrossEntropyOptions`, by name) as in `cross_entropy`.
    Returns:
        fp32 loss (fp64 for fp64 x): 0-d, or target's shape for "none"; a LossOutput where an extra is
        asked for.
    """
    options = CrossEntropyOptions.from_keywords("fused_linear_cross_entropy", options)
    return fused_linear_cross_entropy_with(x, weight, target, bias, options, ce_weight=ce_weight,
                                           token_scale=token_scale, backend=backend)


def linear_grads_needed(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[bool, bool, bool]:
    """Whether this call must give the gradients of (x, weight, bias): grad mode on, and each requires it."""
    grad = torch.is_grad_enabled()
    return (grad and x.requires_grad, grad and weight.requires_grad,
            grad and bias is not None and bias.requires_grad)


def fused_linear_cross_entropy_with(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, options: CrossEntropyOptions, *,
    ce_weight: Tensor | None = None, token_scale: Tensor | None = None, backend: Backend = "auto",
) -> Tensor | LossOutput:
    """`fused_linear_cross_entropy` with its options as one object (the arguments as there)."""
    compiling = torch.compiler.is_compiling()
    if not compiling:
        check_linear_args(x, weight, bias)
        check_target(target, x.shape[:-1], x.device)
        check_class_weight(ce_weight, weight.shape[0], x.device, "ce_weight")
        check_options(options)
        check_token_scale(token_scale, target)
        check_target_range(target, weight.shape[0], options.ignore_index)
    path = _resolve(backend, "fused_linear_cross_entropy", x, compiling)
    lse = pred = None
    if path == "reference":
        loss = reference.fused_linear_cross_entropy(x, weight, target, bias, ce_weight=ce_weight, options=options,
                                                    token_scale=token_scale)
        if options.extras:
            with torch.no_grad():
                logits = torch.nn.functional.linear(x, weight, bias)
            lse, pred = _reference_extras(logits, target, options)
    else:
        args = (x, weight, target, bias, ce_weight, *options.flat(), *linear_grads_needed(x, weight, bias), token_scale)
        if path == "eager" and not options.extras:
            return kernels().fused_linear_cross_entropy_eager(*args)
        outs = torch.ops.kernel_pytorch.fused_linear_cross_entropy_fwd(*args, options.argmax)
        loss, lse, pred = outs[0], outs[1], outs[5]
    if not options.extras:
        return loss
    return loss_output(loss, lse, pred if options.argmax else None, target, options, token_scale)


__all__ = ["LossOutput", "cross_entropy", "cross_entropy_with", "fused_linear_cross_entropy",
           "fused_linear_cross_entropy_with"]
