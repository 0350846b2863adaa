"""What both cross-entropy forward kernels share: the soft-cap, one block's gradient, and the options
every launcher takes (reference/cross_entropy.py gives their meaning).

Gradient of a valid row i at columns j (reference/cross_entropy.py, module docstring):

    dx_ij = (coef_p p_ij - coef_t [j == t_i] - coef_s w_j) (1 - (z_ij / c)^2)

with p = exp(z - lse), coef_p = r ((1 - eps) w[t] + eps W / V) + 2 q s lse, coef_t = r (1 - eps) w[t],
coef_s = r eps / V, (r, q) the reduction's row scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _softcap(x, cap):
    # c * tanh(x / c) = c - 2c / (exp(2x / c) + 1): one exp, saturating cleanly to +-c at +-inf
    return cap - (2.0 * cap) / (tl.exp(x * (2.0 / cap)) + 1.0)


@triton.jit
def _grad_block(x, cols, mask, t, lse, coef_p, coef_t, coef_s, W, cap,
                HAS_WEIGHT: tl.constexpr, SMOOTH: tl.constexpr, HAS_CAP: tl.constexpr):
    """dx for one block of a valid row (fp32): coef_p p - coef_t [j == t] - coef_s w_j, times dz/dx."""
    z = x
    if HAS_CAP:
        z = _softcap(x, cap)
    g = coef_p * tl.exp(z - lse) - tl.where(cols == t, coef_t, 0.0)
    if SMOOTH:
        if HAS_WEIGHT:
            g -= coef_s * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        else:
            g -= coef_s
    if HAS_CAP:
        y = z / cap
        g = g * (1.0 - y * y)
    return g


@dataclass(frozen=True)
class CrossEntropyOptions:
    """The options every launcher takes (reference/cross_entropy.py gives their meaning)."""

    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None

    def needs_stats(self, weight: Tensor | None) -> bool:
        """Whether the kernels read `cross_entropy_stats`: the mean's denominators, or W = sum(w)."""
        return self.reduction == "mean" or (weight is not None and self.label_smoothing > 0.0)

    def scalars(self) -> tuple[int, float, float, float]:
        return (int(self.ignore_index), float(self.label_smoothing), float(self.lse_square_scale),
                float(self.softcap if self.softcap is not None else 1.0))

    def flags(self, weight: Tensor | None) -> dict[str, bool]:
        return {"HAS_WEIGHT": weight is not None, "SMOOTH": self.label_smoothing > 0.0,
                "HAS_CAP": self.softcap is not None, "MEAN": self.reduction == "mean"}


__all__ = ["CrossEntropyOptions"]
