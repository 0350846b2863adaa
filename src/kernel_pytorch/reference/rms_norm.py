"""RMSNorm, Hugging Face Llama semantics.

For x of shape (..., D) and weight of shape (D,):

    rstd = 1 / sqrt(mean(x^2, -1) + eps)          # fp32 (fp64 for fp64 inputs)
    x_hat = (x * rstd).to(x.dtype)                 # normalise in fp32, round to the input dtype
    y = (x_hat * (offset + weight)).to(x.dtype)    # then scale; offset=1 gives Gemma's (1 + weight)

The product is taken in fp32 and rounded once, which is what PyTorch does for `bf16 * bf16`.
y has x's shape and dtype. The backward treats the rounding of x_hat as the identity:

    g = dy * (offset + weight)
    dx = rstd * (g - x_hat * mean(g * x_hat, -1))   # x_hat unrounded here
    dweight = sum over rows of dy * x_hat            # x_hat rounded, as in the forward
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc


def rms_norm_rstd(x: Tensor, eps: float) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dim in the accumulation dtype, shape x.shape[:-1]."""
    x32 = acc(x)
    return torch.rsqrt(x32.pow(2).mean(-1) + eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0) -> Tensor:
    """y = (x * rstd).to(x.dtype) * (offset + weight), product in fp32, result in x.dtype.

    Args:
        x: (..., D) input.
        weight: (D,) scale.
        eps: added to the mean square.
        offset: added to the weight (1.0 for Gemma-style norms).
    Returns:
        (..., D) tensor of x.dtype.
    """
    return rms_norm_from_rstd(x, weight, rms_norm_rstd(x, eps), offset)


def rms_norm_from_rstd(x: Tensor, weight: Tensor, rstd: Tensor, offset: float = 0.0) -> Tensor:
    """`rms_norm` given its statistic `rstd` (x.shape[:-1], from `rms_norm_rstd`): callers that also
    keep rstd compute it once."""
    x_hat = (acc(x) * rstd.unsqueeze(-1)).to(x.dtype)
    return (acc(x_hat) * (acc(weight) + offset)).to(x.dtype)


def rms_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Gradients of `rms_norm` given the saved fp32 `rstd` (shape x.shape[:-1]).

    Returns:
        dx of x's shape and dtype, dweight of weight's shape and dtype (summed in fp32).
    """
    x32 = acc(x)
    r = rstd.unsqueeze(-1)
    x_hat = x32 * r
    dy32 = acc(dy)
    g = dy32 * (acc(weight) + offset)
    dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    x_hat_rounded = acc(x_hat.to(x.dtype))
    dw = (dy32 * x_hat_rounded).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)
