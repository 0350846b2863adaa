"""The gated down projection on the packed layout, registered as `kernel_pytorch::gated_down_packed_fwd`
/ `_bwd`: y = ((act(gate * m_g) * up) @ W.T + b) * m_d for gate_up (..., 2I) = [gate | up] (a fused gate_up_proj's
output, Phi-3), its gradient written as one (..., 2I) tensor. The launchers and the reasoning are
ops/gated_down.py's; the math reference/gated_down.py's. Only gate_up and W are saved, not h.
"""

from __future__ import annotations

from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import register_rules, rowwise
from kernel_pytorch.ops.gated_down import gated_down_packed_bwd, gated_down_packed_fwd
from kernel_pytorch.reference.gated_down import gated_down_packed, gated_down_packed_backward

# kernel_pytorch::gated_down_packed_fwd (gate_up, weight, bias, act, gate_multiplier=1.0,
# down_multiplier=1.0) -> y and gated_down_packed_bwd (dy, gate_up, weight, act, gate_multiplier,
# down_multiplier, has_bias) -> (d_gate_up, d_weight, d_bias); gated_down_packed_eager saves gate_up and
# weight only
gated_down_packed_fwd_op, gated_down_packed_bwd_op, gated_down_packed_eager = register_op(
    "gated_down_packed",
    Impl(gated_down_packed_fwd, gated_down_packed, "reference", outputs=("y",)),
    Impl(gated_down_packed_bwd, gated_down_packed_backward, "reference", outputs=("d_gate_up", "d_weight", "d_bias")),
    differentiable=("y",),
    save=("gate_up", "weight"),
    keep=("act", "gate_multiplier", "down_multiplier"),
    present=("bias",),
    grads={"gate_up": "d_gate_up", "weight": "d_weight", "bias": "d_bias"},
)

# DTensor: rows only (a column shard of [gate | up] is not a [gate | up] pair: gated_act_packed's rule says so)
register_rules(
    "gated_down_packed", rowwise(("gate_up",), ("rows",)), rowwise(("dy", "gate_up"), ("rows", "sum", "sum")),
    "gate_up is sharded on a dim other than the last with the weight and bias Replicate; a column-sharded "
    "[gate | up] is not [gate | up] on each rank, so shard gate and up apart (gated_down)",
)
