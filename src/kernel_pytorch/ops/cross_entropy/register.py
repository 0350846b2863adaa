"""`kernel_pytorch::cross_entropy_fwd` / `_bwd` and the eager entry `cross_entropy_eager`.

The forward op returns (loss, lse, grad, pred), grad being the gradient for an upstream gradient of 1
(of sum(loss) for "none"), computed in the same pass; with_grad=False computes loss and lse only (the
logits need no gradient); argmax=True fills `pred` (empty otherwise). No gradient reaches token_scale.
The backward op returns dloss * grad (one factor, or one per row for "none"). Under compile and export
that product is a new tensor (an op may not write into its inputs): one more read and write of a
logits-sized tensor. The eager CUDA path scales the saved gradient in place instead, touching nothing
when dloss is 1, and bumps its version so that a second backward through the same graph raises rather
than scale twice. Writing the gradient over the logits themselves (grad_inplace) is not a registered
op: it would mutate an input; functional/cross_entropy.py keeps it as an eager-only autograd.Function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.scale import scale_grad_, scaled_grad
from kernel_pytorch.ops._common.sharding import P, R, Strategy, register_rules, shard
from kernel_pytorch.ops.cross_entropy.launch import cross_entropy_fwd
from kernel_pytorch.ops.cross_entropy.schema import OPTIONS, OpSignature
from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.cross_entropy import cross_entropy, cross_entropy_backward, cross_entropy_rows
from kernel_pytorch.reference.cross_entropy_extras import predicted_tokens

# kernel_pytorch::cross_entropy_fwd
FWD = OpSignature(
    ("logits", Tensor), ("target", Tensor), ("weight", Tensor | None), OPTIONS, ("with_grad", bool),
    ("token_scale", Tensor | None, None), ("argmax", bool, False),
    returns=tuple[Tensor, Tensor, Tensor | None, Tensor | None],  # loss, lse, grad, pred
)


@FWD
def _fwd_launch(*args: object, eager: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    a = FWD.parse(args)
    out = cross_entropy_fwd(a.logits, a.target, a.weight, a.options, with_grad=a.with_grad,
                            token_scale=a.token_scale, argmax=a.argmax, eager=eager)
    return out.loss, out.lse, out.grad, out.pred


@FWD
def _fwd_reference(*args: object) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    a = FWD.parse(args)
    logits, target, weight, options = a.logits, a.target, a.weight, a.options
    loss = cross_entropy(logits, target, weight, options, a.token_scale)
    _, _, lse = cross_entropy_rows(logits, target, weight, options)
    lse = torch.where(target.reshape(-1) != options.ignore_index, lse, torch.zeros((), dtype=lse.dtype))
    grad = None
    if a.with_grad:
        shape = target.shape if options.reduction == "none" else ()
        ones = torch.ones(shape, dtype=loss.dtype, device=logits.device)
        grad = cross_entropy_backward(ones, logits, target, weight, options, a.token_scale).contiguous()
    pred = predicted_tokens(logits, target, options.ignore_index).reshape(-1) if a.argmax else None
    return loss, lse, grad, pred


def _bwd_launch(dloss: Tensor, grad: Tensor, *, eager: bool = False) -> Tensor:
    if eager:  # the saved gradient is this backward's alone (module docstring): scale it where it is
        scale_grad_(grad, dloss, eager=True)
        torch.autograd.graph.increment_version(grad)
        return grad
    return scaled_grad(grad, dloss)


def _bwd_reference(dloss: Tensor, grad: Tensor) -> Tensor:
    return (acc(grad) * acc(dloss).unsqueeze(-1)).to(grad.dtype).contiguous()


# kernel_pytorch::cross_entropy_fwd (FWD) -> (loss, lse, grad, pred) and cross_entropy_bwd (dloss, grad)
# -> dlogits; cross_entropy_eager(...FWD's arguments) -> loss
cross_entropy_fwd_op, cross_entropy_bwd_op, cross_entropy_eager = register_op(
    "cross_entropy",
    Impl(_fwd_launch, _fwd_reference, "reference", outputs=("loss", "lse", "grad", "pred")),
    Impl(_bwd_launch, _bwd_reference, "reference", outputs=("dlogits",)),
    differentiable=("loss",),
    save=("grad",),
    grads={"logits": "dlogits"},
)


# DTensor (ops/_common/sharding.py): the rows of (N, V) logits sharded (Shard(0), with target and token scales;
# class weights Replicate) for reduction "sum" (a Partial sum of the ranks' losses) or "none" (the losses
# sharded as the rows). Not "mean": its denominator counts the valid rows of every shard (sum the loss
# and divide by the global count). Not vocabulary-sharded logits: the log-sum-exp spans the shards.
def rows_takes(rows: str) -> str:
    """The rule's phrase for the error (ops/_common/sharding.py), `rows` the tensor sharded on its rows."""
    return (f"{rows} sharded on its rows (Shard(0)) with the targets and token scales, class weights Replicate, "
            "and reduction is 'sum' or 'none' ('mean' divides by a count spanning every shard: sum and divide by "
            "the global count; vocabulary-sharded logits are not taken)")


def _fwd_rule(a: object) -> list[Strategy]:
    if a.logits.ndim != 2 or a.reduction == "mean":
        return []
    rows = shard(0)
    loss = rows if a.reduction == "none" else P
    return [Strategy((loss, rows, rows if a.with_grad else R, rows if a.argmax else R),
                     {"logits": rows, "target": rows, "token_scale": rows})]


def _bwd_rule(a: object) -> list[Strategy]:
    rows = shard(0)
    per_row = [Strategy((rows,), {"dloss": rows, "grad": rows})] if a.dloss.ndim else []
    return [Strategy((rows,), {"grad": rows}), *per_row]


register_rules("cross_entropy", _fwd_rule, _bwd_rule, rows_takes("the (N, V) logits are"))
