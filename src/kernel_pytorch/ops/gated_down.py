"""The gated MLP's down projection with h recomputed in the backward, registered as
`kernel_pytorch::gated_down_fwd` / `_bwd` (split layout; the packed one in ops/gated_down_packed.py).

Math (reference/gated_down.py), gate and up (..., I), weight (H_out, I), bias (H_out,) or None, the
gate and down multipliers m_g, m_d (floats, 1.0 by default; Falcon-H1's):
    y = ((act(gate * m_g).to(dtype) * up) @ W.T + b) * m_d        (..., H_out)
backward, from dy (N, H_out):
    dy' = dy * m_d                                                 (N, H_out), only where m_d != 1
    dh = dy' @ W                                                   (N, I), a new buffer
    d_gate, d_up, h = gated_act_bwd(dh, gate, up, m_g, with_h, h over dh)   one kernel (ops/gated_act.py)
    dW = dy'.T @ h;  db = dy'.sum(0)
The down multiplier scales the GEMM's rounded output in place and dy before the GEMMs, each rounded to
the input dtype as eager's `down_proj(h) * m_d` and its autograd round them: H_out-wide passes, small
beside the I-wide ones, and none at all for m_d = 1.

Why: composed of the gated activation and torch's Linear, autograd saves h (N x I) for the Linear's
weight gradient besides gate and up. This op saves gate, up and W only and rewrites h in the backward
pass that computes d_gate and d_up anyway (one more (N, I) store; h lands in dh's buffer, which that
kernel has just read: no allocation). The GEMMs are torch's (cuBLAS), as a Linear's are; under
torch.compile Inductor sees the body (triton_op) and schedules it with the rest of the graph.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch.ops._activations import MlpConfig
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import P, R, Strategy, register_rules, row_dims, shard
from kernel_pytorch.ops.gated_act import gated_act_bwd, gated_act_fwd, gated_act_packed_bwd, gated_act_packed_fwd
from kernel_pytorch.reference.gated_down import gated_down, gated_down_backward


def _weight_grads(dy2: Tensor, h: Tensor, has_bias: bool) -> tuple[Tensor, Tensor | None]:
    """dW = dy.T @ h (H_out, I) and db = dy summed over rows (H_out,) or None; dy2 (N, H_out)."""
    return dy2.t() @ h.reshape(-1, h.shape[-1]), dy2.sum(0) if has_bias else None


def _scaled_(y: Tensor, multiplier: float) -> Tensor:
    """y * multiplier written over y (this call's own GEMM output), rounded as eager's `y * m`."""
    return y if multiplier == 1.0 else y.mul_(multiplier)


def _scaled_dy(dy: Tensor, multiplier: float) -> Tensor:
    """dy (..., H_out) as rows (N, H_out), times the down multiplier (a new buffer: dy is the caller's)."""
    dy2 = dy.reshape(-1, dy.shape[-1])
    return dy2 if multiplier == 1.0 else dy2 * multiplier


def gated_down_fwd(gate: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, act: str,
                   gate_multiplier: float = 1.0, down_multiplier: float = 1.0, *, eager: bool = False,
                   config: MlpConfig | None = None) -> Tensor:
    """Launch the gated activation, then the down projection; h is a temporary of this call.

    Args:
        gate, up: (..., I) of one fp32/bf16/fp16 dtype, any strides; weight (H_out, I), bias (H_out,) or
            None, of gate's dtype and device (unchecked: the functional layer validates).
        act: "silu", "gelu", "gelu_tanh" or "relu".
        gate_multiplier, down_multiplier: m_g and m_d (module docstring), finite floats.
        eager: launch directly (the eager entry) rather than through wrap_triton.
        config: the activation kernel's launch config (None: the one in force, `tuning.current("mlp")`).
    Returns:
        y (..., H_out) of gate's dtype.
    """
    y = F.linear(gated_act_fwd(gate, up, act, gate_multiplier, eager=eager, config=config), weight, bias)
    return _scaled_(y, down_multiplier)


def gated_down_bwd(dy: Tensor, gate: Tensor, up: Tensor, weight: Tensor, act: str, gate_multiplier: float,
                   down_multiplier: float, has_bias: bool, *, eager: bool = False,
                   config: MlpConfig | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The backward: two GEMMs around one gated-activation kernel that also rewrites h.

    Args:
        dy: (..., H_out); gate, up, weight, act, the multipliers, config: the forward's; has_bias: whether
            it had a bias.
    Returns:
        (d_gate, d_up) of gate's shape, d_weight (H_out, I), d_bias (H_out,) or None.
    """
    dy2 = _scaled_dy(dy, down_multiplier)
    dh = (dy2 @ weight).view(gate.shape)
    d_gate, d_up, h = gated_act_bwd(dh, gate, up, act, gate_multiplier, h=dh, with_h=True, eager=eager,
                                    config=config)
    return (d_gate, d_up, *_weight_grads(dy2, h, has_bias))


def gated_down_packed_fwd(gate_up: Tensor, weight: Tensor, bias: Tensor | None, act: str,
                          gate_multiplier: float = 1.0, down_multiplier: float = 1.0, *,
                          eager: bool = False, config: MlpConfig | None = None) -> Tensor:
    """`gated_down_fwd` on the packed layout: gate_up (..., 2I) = [gate | up] -> y (..., H_out)."""
    y = F.linear(gated_act_packed_fwd(gate_up, act, gate_multiplier, eager=eager, config=config), weight, bias)
    return _scaled_(y, down_multiplier)


def gated_down_packed_bwd(dy: Tensor, gate_up: Tensor, weight: Tensor, act: str, gate_multiplier: float,
                          down_multiplier: float, has_bias: bool, *, eager: bool = False,
                          config: MlpConfig | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """`gated_down_bwd` on the packed layout: ([d_gate | d_up] (..., 2I), d_weight, d_bias or None)."""
    dy2 = _scaled_dy(dy, down_multiplier)
    dh = (dy2 @ weight).view(*gate_up.shape[:-1], weight.shape[1])
    d_gate_up, h = gated_act_packed_bwd(dh, gate_up, act, gate_multiplier, h=dh, with_h=True, eager=eager,
                                        config=config)
    return (d_gate_up, *_weight_grads(dy2, h, has_bias))


# kernel_pytorch::gated_down_fwd (gate, up, weight, bias, act, gate_multiplier=1.0, down_multiplier=1.0)
# -> y and gated_down_bwd (dy, gate, up, weight, act, gate_multiplier, down_multiplier, has_bias) ->
# (d_gate, d_up, d_weight, d_bias) (the registration passes kept values before presence flags);
# gated_down_eager, differentiable, saving gate, up and weight only
gated_down_fwd_op, gated_down_bwd_op, gated_down_eager = register_op(
    "gated_down",
    Impl(gated_down_fwd, gated_down, "reference", outputs=("y",)),
    Impl(gated_down_bwd, gated_down_backward, "reference", outputs=("d_gate", "d_up", "d_weight", "d_bias")),
    differentiable=("y",),
    save=("gate", "up", "weight"),
    keep=("act", "gate_multiplier", "down_multiplier"),
    present=("bias",),
    grads={"gate": "d_gate", "up": "d_up", "weight": "d_weight", "bias": "d_bias"},
)


# DTensor (ops/_common/sharding.py): rows sharded alike (weight and bias Replicate; their gradients Partial
# sums), or the intermediate dim: gate and up column-sharded (Shard(-1)) with the weight sharded on its input
# features (Shard(1)), tensor parallelism's column- then row-parallel pair, whose y is a Partial sum over the
# ranks' slices of I. No bias there: every rank would add it to its partial y.
def _fwd_rule(a: object) -> list[Strategy]:
    rows = [Strategy((shard(d),), {"gate": shard(d), "up": shard(d)}) for d in row_dims(a.gate)]
    if a.bias is not None:
        return rows
    inner = shard(a.gate.ndim - 1)
    return [*rows, Strategy((P,), {"gate": inner, "up": inner, "weight": shard(1)})]


def _bwd_rule(a: object) -> list[Strategy]:
    rows = [Strategy((shard(d), shard(d), P, P), {"dy": shard(d), "gate": shard(d), "up": shard(d)})
            for d in row_dims(a.gate)]
    inner = shard(a.gate.ndim - 1)
    return [*rows, Strategy((inner, inner, shard(1), R), {"gate": inner, "up": inner, "weight": shard(1)})]


register_rules(
    "gated_down", _fwd_rule, _bwd_rule,
    "gate and up are sharded alike on a dim other than the last with the weight and bias Replicate, or "
    "column-sharded (Shard(-1)) with the weight Shard(1), no bias, and dy Replicate",
)
