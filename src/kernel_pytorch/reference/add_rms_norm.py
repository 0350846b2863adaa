"""Fused residual add + RMSNorm, the step every pre-norm transformer block repeats.

For x, residual of shape (..., D) and weight of shape (D,):

    h = (x + residual).to(x.dtype)       # the updated residual stream, one rounding
    y = rms_norm(h, weight, eps, offset, casting)  # see reference/rms_norm.py (casting: where y rounds)

Returns (y, h). The backward, with upstream gradients dy and dh:

    dh_total = dh + d rms_norm(h)/dh applied to dy
    dx = dresidual = dh_total
    dweight as in rms_norm (and its casting), on h
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.rms_norm import Casting, rms_norm, rms_norm_backward


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting: Casting = "llama",
) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual), both of x's shape and dtype.

    Args:
        x: (..., D) block output to add.
        residual: (..., D) residual stream, same dtype as x.
        weight: (D,) scale.
        eps: added to the mean square.
        offset: added to the weight (1.0 for Gemma-style norms).
        casting: where the norm rounds: "llama", "gemma" or "torch" (reference/rms_norm.py).
    """
    h = add_residual(x, residual)
    return rms_norm(h, weight, eps, offset, casting), h


def add_residual(x: Tensor, residual: Tensor) -> Tensor:
    """h = x + residual in fp32, rounded once to x's dtype."""
    return (acc(x) + acc(residual)).to(x.dtype)


def add_rms_norm_backward(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float = 0.0,
    casting: Casting = "llama",
) -> tuple[Tensor, Tensor]:
    """Gradients given the saved sum `h` and its fp32 `rstd`.

    Returns:
        d_sum (the gradient of both x and residual, h's dtype), dweight (weight's dtype).
    """
    dh_norm, dw = rms_norm_backward(dy, h, weight, rstd, offset, casting)
    return (acc(dh_norm) + acc(dh)).to(h.dtype), dw
