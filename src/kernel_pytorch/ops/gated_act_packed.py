"""Gated activation on the packed layout, registered as `kernel_pytorch::gated_act_packed_fwd` / `_bwd`.

Math (see reference/gated_act.py), for gate_up (rows, 2I) = [gate | up] (the output of a fused
gate_up_proj, chunked gate-first as transformers' Phi3MLP does):
    z = (gate * m).to(dtype);  h = act(z).to(dtype) * up          -> (rows, I)
    d_gate_up = [dh * up * act'(z) * m | dh * a]                  -> (rows, 2I), one tensor
with m the gate multiplier (1.0 by default).

The kernels are the split layout's (ops/gated_act.py) reading the two halves of gate_up through
strided views of it: no copy in, and the gradient written as one packed tensor (no concatenation).
Only gate_up is saved for the backward.
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.ops._activations import MlpConfig
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import register_rules, rowwise
from kernel_pytorch.ops.gated_act import gated_act_packed_bwd, gated_act_packed_fwd
from kernel_pytorch.reference.gated_act import gated_act_packed, gated_act_packed_backward


def gated_act_packed_grad(dh: Tensor, gate_up: Tensor, act: str, gate_multiplier: float = 1.0, *,
                          eager: bool = False, config: MlpConfig | None = None) -> Tensor:
    """Launch the packed backward (out of place) and return [d_gate | d_up] alone: (..., 2I)."""
    return gated_act_packed_bwd(dh, gate_up, act, gate_multiplier, eager=eager, config=config)[0]


def _fwd_reference(gate_up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    return gated_act_packed(gate_up, act, gate_multiplier).contiguous()


def _bwd_reference(dh: Tensor, gate_up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    return gated_act_packed_backward(dh, gate_up, act, gate_multiplier).contiguous()


# kernel_pytorch::gated_act_packed_fwd (gate_up, act, gate_multiplier=1.0) -> h and gated_act_packed_bwd
# (dh, gate_up, act, gate_multiplier=1.0) -> d_gate_up; gated_act_packed_eager(gate_up, act[,
# gate_multiplier]) -> h, differentiable, saving gate_up only
gated_act_packed_fwd_op, gated_act_packed_bwd_op, gated_act_packed_eager = register_op(
    "gated_act_packed",
    Impl(gated_act_packed_fwd, _fwd_reference, "reference", outputs=("h",)),
    Impl(gated_act_packed_grad, _bwd_reference, "reference", outputs=("d_gate_up",)),
    differentiable=("h",),
    save=("gate_up",),
    keep=("act", "gate_multiplier"),
    grads={"gate_up": "d_gate_up"},
)

# DTensor: rows only. A column shard of [gate | up] is not a [gate | up] pair (a column-parallel gate_up_proj
# gives one rank gate columns, another up columns): shard gate and up as two tensors for that.
register_rules(
    "gated_act_packed", rowwise(("gate_up",), ("rows",)), rowwise(("dh", "gate_up"), ("rows",)),
    "gate_up is sharded on a dim other than the last (Shard(d), d < gate_up.ndim - 1); a column-sharded "
    "[gate | up] is not [gate | up] on each rank, so shard gate and up apart (gated_act)",
)
