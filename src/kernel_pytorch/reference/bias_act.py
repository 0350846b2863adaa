"""Bias + activation, for `Linear -> activation` stacks that keep a bias (GPT-2, ViT, BERT MLPs).

For x of shape (..., D) (a bias-free matmul's output), an optional bias of shape (D,) and dtype x's,
and act one of reference/_activations.ACTIVATIONS:

    z = (x + bias).to(dtype)          # the pre-activation, rounded as a Linear's output is
    y = act(z).to(dtype)              # act in fp32, one rounding (torch's bf16 activation)

y has x's shape and dtype; without a bias z = x. An eager `F.linear(x, W) + b` followed by the
activation rounds at the same two places; `F.linear(x, W, b)` adds the bias inside the matmul, before
its rounding, which no op after the matmul can reproduce (the difference is one rounding of x @ W).

Backward (z recomputed from x and bias; its rounding treated as the identity):

    dz = dy * act'(z)                 # fp32
    dx = dz.to(dtype)
    dbias = sum over rows of dz       # fp32 sum of the unrounded dz, cast to bias's dtype

Eager autograd sums the rounded dz; summing before rounding is at least as accurate (the tests hold
dbias to the fp64-derived budget).
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.reference._activations import activation, activation_grad
from kernel_pytorch.reference._math import acc


def pre_activation(x: Tensor, bias: Tensor | None) -> Tensor:
    """z = (x + bias) rounded to x's dtype (x itself without a bias), in the accumulation dtype."""
    if bias is None:
        return acc(x)
    return acc((acc(x) + acc(bias)).to(x.dtype))


def bias_act(x: Tensor, bias: Tensor | None, act: str) -> Tensor:
    """y = act((x + bias).to(dtype)) in fp32, result in x's dtype.

    Args:
        x: (..., D) input.
        bias: (D,) tensor or None.
        act: "silu", "gelu", "gelu_tanh" or "relu".
    Returns:
        (..., D) tensor of x's dtype.
    """
    return activation(pre_activation(x, bias), act).to(x.dtype)


def bias_act_backward(dy: Tensor, x: Tensor, bias: Tensor | None, act: str) -> tuple[Tensor, Tensor | None]:
    """Gradients of `bias_act` given dy (..., D).

    Returns:
        dx of x's shape and dtype; dbias (D,) of bias's dtype, or None without a bias.
    """
    dz = acc(dy) * activation_grad(pre_activation(x, bias), act)
    dbias = dz.reshape(-1, x.shape[-1]).sum(0).to(bias.dtype) if bias is not None else None
    return dz.to(x.dtype), dbias
