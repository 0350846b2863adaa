"""Gated activations (SwiGLU, GEGLU), Hugging Face eager-MLP semantics.

For gate and up of the same shape (..., I) and dtype, act one of reference/_activations.ACTIVATIONS and
a gate multiplier m (a Python float, 1.0 by default):

    z = (gate * m).to(dtype)             # m rounded to fp32 (fp64 for fp64 inputs), the product rounded
                                         # to the input dtype: torch's `tensor * float`, as Falcon-H1's
                                         # act_fn(gate_proj(x) * gate_multiplier) computes it
    a = act(z).to(dtype)                 # act in fp32, rounded to the input dtype, as HF's
                                         # act_fn(gate_proj(x)) hands a bf16 tensor to the multiply
    h = (a * up).to(dtype)               # product in fp32, rounded once (torch's bf16 * bf16)

With m = 1 z is gate itself.

swiglu is act = "silu" (Llama, Mistral, Qwen), geglu act = "gelu" or "gelu_tanh" (Gemma). h has
gate's shape and dtype. fp64 inputs stay fp64 throughout (the yardstick), where rounding is a no-op.

Packed layout: one tensor gate_up of shape (..., 2I) holding [gate | up] along the last dim, as a
fused gate_up_proj produces it; transformers' Phi3MLP splits it with `gate, up = t.chunk(2, -1)`: the
first half is the gate. Its gradient is one (..., 2I) tensor [d_gate | d_up].

Backward (recomputes z and a from gate; treats the final rounding of h as the identity, and uses the
rounded a for d_up exactly as eager autograd does, since a is what the multiply saw):

    d_up   = (dh * a).to(dtype)                           # fp32 product, one rounding
    d_gate = (dh * up * act'(z) * m).to(dtype)             # fp32 throughout, one rounding

Eager autograd rounds dh * up to the input dtype before multiplying by act'(z), and that product again
before the multiplier; the single rounding here is at least as accurate (within the tolerance table of
eager's repeated rounding).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._activations import activation, activation_grad
from kernel_pytorch.reference._math import acc


def scaled(t: Tensor, multiplier: float) -> Tensor:
    """t * multiplier rounded to t's dtype, as torch's `tensor * float` computes it (the float rounded to
    fp32, fp64 for fp64 tensors; the product in that precision): t itself for a multiplier of 1."""
    if multiplier == 1.0:
        return t
    return (acc(t) * multiplier).to(t.dtype)


def gated_act(gate: Tensor, up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    """h = act((gate * m).to(dtype)).to(dtype) * up, product in fp32, result in gate's dtype.

    Args:
        gate, up: (..., I) tensors of one dtype.
        act: "silu", "gelu", "gelu_tanh" or "relu".
        gate_multiplier: m, applied to gate before the activation (Falcon-H1's mlp_multipliers[0]).
    Returns:
        (..., I) tensor of gate's dtype.
    """
    a = activation(acc(scaled(gate, gate_multiplier)), act).to(gate.dtype)
    return (acc(a) * acc(up)).to(gate.dtype)


def gated_act_backward(
    dh: Tensor, gate: Tensor, up: Tensor, act: str, gate_multiplier: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Gradients of `gated_act` given the upstream gradient dh (..., I).

    Returns:
        (d_gate, d_up), each of gate's shape and dtype.
    """
    z32, dh32 = acc(scaled(gate, gate_multiplier)), acc(dh)
    a = acc(activation(z32, act).to(gate.dtype))
    d_up = dh32 * a
    d_gate = dh32 * acc(up) * activation_grad(z32, act)
    if gate_multiplier != 1.0:
        d_gate = d_gate * gate_multiplier
    return d_gate.to(gate.dtype), d_up.to(gate.dtype)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up with HF rounding: (..., I) -> (..., I)."""
    return gated_act(gate, up, "silu")


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """gelu(gate) * up with HF rounding; approximate "none" (HF "gelu") or "tanh" ("gelu_pytorch_tanh")."""
    return gated_act(gate, up, gelu_name(approximate))


def split_packed(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """The (gate, up) halves of a packed (..., 2I) tensor, as views (gate first, as Phi3MLP's chunk)."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even, [gate | up] (got {gate_up.shape[-1]})")
    return gate_up.chunk(2, dim=-1)


def gated_act_packed(gate_up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    """`gated_act` of the halves of gate_up (..., 2I) -> (..., I)."""
    return gated_act(*split_packed(gate_up), act, gate_multiplier)


def gated_act_packed_backward(dh: Tensor, gate_up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    """Gradient of `gated_act_packed`: one (..., 2I) tensor [d_gate | d_up] of gate_up's dtype."""
    return torch.cat(gated_act_backward(dh, *split_packed(gate_up), act, gate_multiplier), dim=-1)


def gelu_name(approximate: str) -> str:
    """Our activation name for torch's GELU `approximate` argument ("none" or "tanh")."""
    if approximate == "none":
        return "gelu"
    if approximate == "tanh":
        return "gelu_tanh"
    raise ValueError(f"approximate must be 'none' or 'tanh' (got {approximate!r})")
