"""The gated MLP's down projection with h recomputed in the backward: y = linear(act(gate) * up, W, b).

For gate and up (..., I) (or one packed gate_up (..., 2I) = [gate | up]), weight (H_out, I), an
optional bias (H_out,), all of one dtype, and the gate and down multipliers m_g, m_d (Python floats,
1.0 by default; Falcon-H1's mlp_multipliers):

    h = gated_act(gate, up, act, m_g)         (..., I), reference/gated_act.py's rounding
    y = scaled(linear(h, weight, bias), m_d)  (..., H_out), reference/mlp.py's linear: one rounding,
                                              then the multiplier: one more (`down_proj(h) * m_d`)

Backward, from dy (..., H_out), with N = the number of rows:

    dy' = scaled(dy, m_d)                                      eager autograd's rounding of dy * m_d
    dh = (dy' @ W).to(dtype)                                   (N, I)
    d_gate, d_up = gated_act_backward(dh, gate, up, act, m_g)  h = gated_act(gate, up, act, m_g) recomputed
    dW = (dy'.T @ h).to(dtype);  db = dy'.sum(rows).to(dtype) (None without a bias)

The forward composed of torch's Linear and the gated activation has autograd save h for the Linear's
weight gradient; this op needs gate, up and W only (ops/gated_down.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._activations import activation
from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.gated_act import gated_act, gated_act_backward, scaled, split_packed
from kernel_pytorch.reference.mlp import linear


def gated_down(
    gate: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, act: str,
    gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
) -> Tensor:
    """scaled(linear(act(gate * m_g) * up, weight, bias), m_d): gate, up (..., I), weight (H_out, I) ->
    (..., H_out)."""
    return scaled(linear(gated_act(gate, up, act, gate_multiplier), weight, bias), down_multiplier)


def gated_down_backward(
    dy: Tensor, gate: Tensor, up: Tensor, weight: Tensor, act: str, gate_multiplier: float,
    down_multiplier: float, has_bias: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of `gated_down` given dy (..., H_out). The parameters follow the op registration's order
    (saved tensors, kept values, then the bias's presence), so the multipliers come before has_bias.

    Returns:
        (d_gate, d_up) of gate's shape, d_weight of weight's shape, d_bias (H_out,) or None; gate's dtype.
    """
    dy2 = acc(scaled(dy, down_multiplier)).reshape(-1, dy.shape[-1])
    dh = (dy2 @ acc(weight)).to(gate.dtype).reshape(gate.shape)
    d_gate, d_up = gated_act_backward(dh, gate, up, act, gate_multiplier)
    # h = gated_act(gate, up, act, m_g), its product written up * a: the same value, but not the forward's
    # expression, which torch.compile's CSE would merge with the forward's h; the partitioner then saves
    # it (a value a matmul reads in the backward is not recomputed), keeping h alive after all
    a = acc(activation(acc(scaled(gate, gate_multiplier)), act).to(gate.dtype))
    h = (acc(up) * a).to(gate.dtype).reshape(-1, gate.shape[-1])
    d_weight = (dy2.t() @ acc(h)).to(weight.dtype)
    d_bias = dy2.sum(0).to(weight.dtype) if has_bias else None
    return d_gate, d_up, d_weight, d_bias


def gated_down_packed(
    gate_up: Tensor, weight: Tensor, bias: Tensor | None, act: str,
    gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
) -> Tensor:
    """`gated_down` of the halves of gate_up (..., 2I): -> (..., H_out)."""
    return gated_down(*split_packed(gate_up), weight, bias, act, gate_multiplier, down_multiplier)


def gated_down_packed_backward(
    dy: Tensor, gate_up: Tensor, weight: Tensor, act: str, gate_multiplier: float, down_multiplier: float,
    has_bias: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gradients of `gated_down_packed`: ([d_gate | d_up] (..., 2I), d_weight, d_bias or None)."""
    d_gate, d_up, d_weight, d_bias = gated_down_backward(
        dy, *split_packed(gate_up), weight, act, gate_multiplier, down_multiplier, has_bias)
    return torch.cat([d_gate, d_up], dim=-1), d_weight, d_bias
