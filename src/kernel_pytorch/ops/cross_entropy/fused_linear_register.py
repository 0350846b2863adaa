"""`kernel_pytorch::fused_linear_cross_entropy_fwd` / `_bwd` and the eager entry
`fused_linear_cross_entropy_eager` (the algorithm: fused_linear.py).

The forward op returns (loss, lse, grad_x, grad_w, grad_b, pred), the gradients for an upstream gradient
of 1 (empty where not needed, and for "none"); needs_x/w/b say which gradients autograd wants; argmax=True
fills `pred` (empty otherwise). No gradient reaches token_scale. It is an opaque custom op: compile
keeps it as one node, since with its body traced the AOT partitioner moved the last chunk's grad_W
update into the backward graph and saved that chunk's (C, V) logits gradient and the partial
accumulator instead of grad_W (one accumulator more at the step's peak). The backward op scales them by
the upstream gradient (a new tensor each under compile and export; in place on the eager CUDA path, as
register.py explains) or, for "none", recomputes them chunk by chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.scale import scale_grad_, scaled_grad
from kernel_pytorch.ops._common.sharding import P, R, Strategy, register_rules, shard
from kernel_pytorch.ops.cross_entropy.fused_linear import (
    FusedLinearArgs,
    fused_linear_cross_entropy_bwd,
    fused_linear_cross_entropy_fwd,
)
from kernel_pytorch.ops.cross_entropy.register import rows_takes
from kernel_pytorch.ops.cross_entropy.schema import OPTION_NAMES, OPTIONS, OpSignature
from kernel_pytorch.reference._math import acc, acc_dtype
from kernel_pytorch.reference.cross_entropy import apply_softcap
from kernel_pytorch.reference.cross_entropy_extras import predicted_tokens
from kernel_pytorch.reference.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_backward,
)

_NEEDS = (("needs_x", bool), ("needs_w", bool), ("needs_b", bool))
_GRADS = tuple[Tensor | None, Tensor | None, Tensor | None]
# kernel_pytorch::fused_linear_cross_entropy_fwd
FWD = OpSignature(
    ("x", Tensor), ("weight", Tensor), ("target", Tensor), ("bias", Tensor | None), ("ce_weight", Tensor | None),
    OPTIONS, *_NEEDS, ("token_scale", Tensor | None, None), ("argmax", bool, False),
    returns=tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None],
)
# kernel_pytorch::fused_linear_cross_entropy_bwd: the forward's gradients, the saved tensors, the options
BWD = OpSignature(
    ("dloss", Tensor), ("grad_x", Tensor | None), ("grad_w", Tensor | None), ("grad_b", Tensor | None), ("x", Tensor),
    ("weight", Tensor), ("target", Tensor), ("lse", Tensor), ("bias", Tensor | None), ("ce_weight", Tensor | None),
    ("token_scale", Tensor | None), OPTIONS, *_NEEDS,
    returns=_GRADS,
)


def _args(a: object) -> FusedLinearArgs:
    return FusedLinearArgs(a.weight, a.target, a.bias, a.ce_weight, a.token_scale)


def _needs(a: object) -> tuple[bool, bool, bool]:
    return a.needs_x, a.needs_w, a.needs_b and a.bias is not None


@FWD
def _fwd_launch(*args: object, eager: bool = False) -> tuple:
    a = FWD.parse(args)
    out = fused_linear_cross_entropy_fwd(a.x, _args(a), a.options, needs=_needs(a), argmax=a.argmax, eager=eager)
    return out.loss, out.lse, out.grad_x, out.grad_w, out.grad_b, out.pred


@BWD
def _bwd_launch(*args: object, eager: bool = False) -> tuple:
    a = BWD.parse(args)
    needs = _needs(a)
    if a.options.reduction == "none":
        return fused_linear_cross_entropy_bwd(a.dloss, a.x, _args(a), a.lse, a.options, needs=needs, eager=eager)
    out = []
    for g, need in zip((a.grad_x, a.grad_w, a.grad_b), needs):
        if not need:
            out.append(None)
        elif eager:  # the saved gradients are this backward's alone (register.py)
            out.append(scale_grad_(g, a.dloss, eager=True))
            torch.autograd.graph.increment_version(g)
        else:
            out.append(scaled_grad(g, a.dloss))
    return tuple(out)


@FWD
def _fwd_reference(*args: object) -> tuple:
    a = FWD.parse(args)
    x, weight, target, bias, options = a.x, a.weight, a.target, a.bias, a.options
    kw = dict(ce_weight=a.ce_weight, options=options, token_scale=a.token_scale)
    loss = fused_linear_cross_entropy(x, weight, target, bias, **kw)
    low = torch.nn.functional.linear(x, weight, bias)
    pred = predicted_tokens(low, target, options.ignore_index).reshape(-1) if a.argmax else None
    logits = apply_softcap(acc(low).reshape(-1, weight.shape[0]), options.softcap)
    valid = target.reshape(-1) != options.ignore_index
    lse = torch.where(valid, torch.logsumexp(logits, -1), torch.zeros((), dtype=logits.dtype))
    needs = _needs(a)
    if options.reduction == "none" or not any((a.needs_x, a.needs_w, a.needs_b)):
        return loss, lse, None, None, None, pred
    dx, dw, db = fused_linear_cross_entropy_backward(torch.ones_like(loss), x, weight, target, bias, **kw)
    return (loss, lse, dx.contiguous() if needs[0] else None, dw.contiguous() if needs[1] else None,
            db if needs[2] else None, pred)


@BWD
def _bwd_reference(*args: object) -> _GRADS:
    a = BWD.parse(args)
    if a.options.reduction == "none":
        grads = fused_linear_cross_entropy_backward(a.dloss, a.x, a.weight, a.target, a.bias, ce_weight=a.ce_weight,
                                                    options=a.options, token_scale=a.token_scale)
    else:
        saved = (a.grad_x, a.grad_w, a.grad_b)
        grads = tuple(None if g is None else (acc(g) * acc(a.dloss)).to(g.dtype) for g in saved)
    return tuple(g.contiguous() if need and g is not None else None for g, need in zip(grads, _needs(a)))


def _grads_like(a: object) -> _GRADS:
    """Empty gradients of x, weight and bias where needed."""
    needs = _needs(a)
    return (torch.empty(a.x.shape, dtype=a.x.dtype, device=a.x.device) if needs[0] else None,
            torch.empty(a.weight.shape, dtype=a.weight.dtype, device=a.weight.device) if needs[1] else None,
            torch.empty(a.bias.shape, dtype=a.bias.dtype, device=a.bias.device) if needs[2] else None)


@FWD
def _fwd_fake(*args: object) -> tuple:
    a = FWD.parse(args)
    x, target = a.x, a.target
    dtype = acc_dtype(x.dtype)
    loss = x.new_empty(target.shape if a.options.reduction == "none" else (), dtype=dtype)
    lse = x.new_empty(target.numel(), dtype=dtype)
    pred = x.new_empty(target.numel(), dtype=torch.int64) if a.argmax else None
    if a.options.reduction == "none" or not any((a.needs_x, a.needs_w, a.needs_b)):
        return loss, lse, None, None, None, pred
    return (loss, lse, *_grads_like(a), pred)


@BWD
def _bwd_fake(*args: object) -> _GRADS:
    return _grads_like(BWD.parse(args))


# kernel_pytorch::fused_linear_cross_entropy_fwd (FWD) -> (loss, lse, grad_x, grad_w, grad_b, pred) and _bwd
# (BWD) -> (dx, dweight, dbias); fused_linear_cross_entropy_eager(...FWD's arguments) -> loss
fused_linear_cross_entropy_fwd_op, fused_linear_cross_entropy_bwd_op, fused_linear_cross_entropy_eager = register_op(
    "fused_linear_cross_entropy",
    Impl(_fwd_launch, _fwd_reference, _fwd_fake, outputs=("loss", "lse", "grad_x", "grad_w", "grad_b", "pred")),
    Impl(_bwd_launch, _bwd_reference, _bwd_fake, outputs=("dx", "dweight", "dbias")),
    differentiable=("loss",),
    save=("grad_x", "grad_w", "grad_b", "x", "weight", "target", "lse", "bias", "ce_weight", "token_scale"),
    keep=(*OPTION_NAMES, "needs_x", "needs_w", "needs_b"),
    grads={"x": "dx", "weight": "dweight", "bias": "dbias"},
    opaque_forward=True,  # traced, the partitioner moved the last chunk's grad_W update into the backward
)


# DTensor: cross_entropy's rule (register.py) on the rows of x (N, H), the weight, bias and class weights
# Replicate; the weight's and bias's gradients are Partial sums over the ranks' rows. The saved gradients'
# placements follow the forward's: empty (Replicate) where not computed.
def _saved(a: object) -> tuple:
    """The placements of grad_x, grad_w, grad_b as the forward returns them."""
    saved = a.reduction != "none" and (a.needs_x or a.needs_w or a.needs_b)
    return (shard(0) if saved and a.needs_x else R, P if saved and a.needs_w else R,
            P if saved and a.needs_b and a.bias is not None else R)


def _fwd_rule(a: object) -> list[Strategy]:
    if a.x.ndim != 2 or a.reduction == "mean":
        return []
    rows = shard(0)
    loss = rows if a.reduction == "none" else P
    outputs = (loss, rows, *_saved(a), rows if a.argmax else R)
    return [Strategy(outputs, {"x": rows, "target": rows, "token_scale": rows})]


def _bwd_rule(a: object) -> list[Strategy]:
    if a.x.ndim != 2 or a.reduction == "mean":
        return []
    rows = shard(0)
    grad_x, grad_w, grad_b = _saved(a)
    inputs = {"dloss": rows if a.reduction == "none" else R, "grad_x": grad_x, "grad_w": grad_w, "grad_b": grad_b,
              "x": rows, "target": rows, "lse": rows, "token_scale": rows}
    outputs = (rows if a.needs_x else R, P if a.needs_w else R, P if a.needs_b and a.bias is not None else R)
    return [Strategy(outputs, inputs)]


register_rules("fused_linear_cross_entropy", _fwd_rule, _bwd_rule, rows_takes("x (N, H) is"))
