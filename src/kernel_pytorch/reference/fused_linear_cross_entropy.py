"""Linear layer + cross-entropy, the language-model head's loss, as eager PyTorch computes it.

For x (..., H), weight (V, H), optional bias (V,) and targets t (...):

    logits = x @ weight.T + bias      # in x's dtype, as the lm_head produces them (fp32 accumulation,
                                      # one rounding)
    loss = cross_entropy(logits, t, ...)                  # reference/cross_entropy.py: fp32 math

Backward, with g = d loss / d logits rounded to the logits' dtype (reference/cross_entropy.py):

    dx = g @ weight;  dweight = g.T @ x;  dbias = sum over rows of g     (each product rounded once)

The fused kernels never hold all the logits; they compute the same quantities chunk by chunk over rows
(ops/cross_entropy/fused_linear.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.cross_entropy import (
    DEFAULT_OPTIONS,
    CrossEntropyOptions,
    cross_entropy,
    cross_entropy_backward,
)


def fused_linear_cross_entropy(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, *, ce_weight: Tensor | None = None,
    options: CrossEntropyOptions = DEFAULT_OPTIONS, token_scale: Tensor | None = None,
) -> Tensor:
    """cross_entropy(x @ weight.T + bias, target) with the logits in x's dtype.

    Args:
        x: (..., H); weight: (V, H), x's dtype; target: (...) class indices; bias: (V,) or None.
        ce_weight: (V,) class weights of the cross-entropy (torch's `weight`).
        options, token_scale: as in reference.cross_entropy.
    Returns:
        fp32 (fp64 for fp64) loss: 0-d, or target's shape for "none".
    """
    logits = torch.nn.functional.linear(x, weight, bias)
    return cross_entropy(logits, target, ce_weight, options, token_scale)


def fused_linear_cross_entropy_backward(
    dloss: Tensor, x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, *,
    ce_weight: Tensor | None = None, options: CrossEntropyOptions = DEFAULT_OPTIONS,
    token_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Gradients of `fused_linear_cross_entropy` for the upstream gradient `dloss`.

    Returns:
        (dx of x's shape, dweight (V, H), dbias (V,) or None), each in its input's dtype.
    """
    h = x.shape[-1]
    logits = torch.nn.functional.linear(x, weight, bias)
    g = cross_entropy_backward(dloss, logits, target, ce_weight, options, token_scale).reshape(-1, weight.shape[0])
    x2 = x.reshape(-1, h)
    dx = (g @ weight).reshape(x.shape)
    dw = g.t() @ x2
    db = acc(g).sum(0).to(bias.dtype) if bias is not None else None
    return dx, dw, db
