"""LayerNorm, torch.nn.LayerNorm semantics (statistics and affine in fp32 - fp64 for fp64 inputs -
one final rounding).

For x of shape (..., D), optional weight and bias of shape (D,):

    mean = mean(x, -1);  rstd = 1 / sqrt(mean((x - mean)^2, -1) + eps)     # fp32, biased variance
    x_hat = (x - mean) * rstd
    y = (x_hat * weight + bias).to(x.dtype)        # weight 1 / bias 0 when absent

The backward (x_hat unrounded, fp32):

    g = dy * weight
    dx = rstd * (g - mean(g, -1) - x_hat * mean(g * x_hat, -1))
    dweight = sum over rows of dy * x_hat;   dbias = sum over rows of dy
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc


def layer_norm_stats(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(mean, rstd) over the last dim, fp32, each of shape x.shape[:-1]."""
    x32 = acc(x)
    mean = x32.mean(-1)
    var = (x32 - mean.unsqueeze(-1)).pow(2).mean(-1)
    return mean, torch.rsqrt(var + eps)


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """y = (x - mean) * rstd * weight + bias in fp32, result in x.dtype.

    Args:
        x: (..., D) input.
        weight: (D,) scale or None.
        bias: (D,) shift or None.
        eps: added to the variance.
    Returns:
        (..., D) tensor of x.dtype.
    """
    return layer_norm_from_stats(x, weight, bias, *layer_norm_stats(x, eps))


def layer_norm_from_stats(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, rstd: Tensor
) -> Tensor:
    """`layer_norm` given its statistics (from `layer_norm_stats`): callers that also keep mean and
    rstd compute them once."""
    y = (acc(x) - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    if weight is not None:
        y = y * acc(weight)
    if bias is not None:
        y = y + acc(bias)
    return y.to(x.dtype)


def layer_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, has_bias: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Gradients of `layer_norm` given the saved fp32 `mean` and `rstd` (shape x.shape[:-1]).

    Returns:
        dx (x's dtype), dweight (weight's dtype, or None without weight), dbias (None without bias;
        the bias gradient takes weight's dtype when there is a weight, else x's).
    """
    d = x.shape[-1]
    r = rstd.unsqueeze(-1)
    x_hat = (acc(x) - mean.unsqueeze(-1)) * r
    dy32 = acc(dy)
    g = dy32 * acc(weight) if weight is not None else dy32
    dx = r * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
    dw = (dy32 * x_hat).reshape(-1, d).sum(0).to(weight.dtype) if weight is not None else None
    param_dtype = weight.dtype if weight is not None else x.dtype
    db = dy32.reshape(-1, d).sum(0).to(param_dtype) if has_bias else None
    return dx.to(x.dtype), dw, db
