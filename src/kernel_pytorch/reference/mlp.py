"""MLP blocks as Hugging Face's eager modules compute them, from the activations' references.

    linear(x, W, b) = (x @ W.T + b).to(dtype)                       one rounding, as a Linear's output

    gated_mlp        down(act(gate(x)).to(dtype) * up(x))            LlamaMLP, MistralMLP, Qwen2MLP, GemmaMLP
                     down(act(gate(x) * m_g) * up(x)) * m_d          FalconH1MLP (its mlp_multipliers)
    gated_mlp_packed down(gated_act_packed(gate_up(x)))              Phi3MLP ([gate | up] = gate_up_proj(x))
    mlp              fc2(act((fc1(x) without bias + b1).to(dtype)))  Linear -> activation -> Linear

x is (..., H); gate/up weights (I, H), gate_up (2I, H), down (H_out, I), fc1 (I, H), fc2 (H_out, I);
biases optional, (out_features,). Math in the accumulation dtype (fp32, fp64 for fp64 inputs: the
yardstick), each Linear rounded once to x's dtype, each multiplier's product once more
(reference/gated_act.py's `scaled`). `mlp` adds the first bias after the matmul's rounding
(reference/bias_act.py says why); an eager `F.linear(x, W, b)` adds it before, one rounding apart.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.bias_act import bias_act
from kernel_pytorch.reference.gated_act import gated_act, gated_act_packed, scaled


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias in the accumulation dtype, rounded once to x's dtype: (..., in) -> (..., out)."""
    return F.linear(acc(x), acc(weight), acc(bias) if bias is not None else None).to(x.dtype)


def gated_mlp(
    x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor, act: str,
    gate_bias: Tensor | None = None, up_bias: Tensor | None = None, down_bias: Tensor | None = None,
    gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
) -> Tensor:
    """down_proj(act(gate_proj(x) * m_g) * up_proj(x)) * m_d: (..., H) -> (..., H_out) of x's dtype."""
    h = gated_act(linear(x, gate_weight, gate_bias), linear(x, up_weight, up_bias), act, gate_multiplier)
    return scaled(linear(h, down_weight, down_bias), down_multiplier)


def gated_mlp_packed(
    x: Tensor, gate_up_weight: Tensor, down_weight: Tensor, act: str,
    gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None,
    gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
) -> Tensor:
    """down_proj(act(gate * m_g) * up) * m_d with [gate | up] = gate_up_proj(x): (..., H) -> (..., H_out)."""
    h = gated_act_packed(linear(x, gate_up_weight, gate_up_bias), act, gate_multiplier)
    return scaled(linear(h, down_weight, down_bias), down_multiplier)


def mlp(
    x: Tensor, fc1_weight: Tensor, fc1_bias: Tensor | None, fc2_weight: Tensor, fc2_bias: Tensor | None, act: str
) -> Tensor:
    """fc2(act(fc1(x))), fc1's bias added by the fused bias + activation: (..., H) -> (..., H_out)."""
    return linear(bias_act(linear(x, fc1_weight), fc1_bias, act), fc2_weight, fc2_bias)
