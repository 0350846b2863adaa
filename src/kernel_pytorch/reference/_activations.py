"""The pointwise activations of the MLP family, as torch computes them, and their derivatives.

Every function takes and returns tensors in the accumulation dtype (fp32, or fp64 for fp64 inputs:
see reference/_math.py); callers round. Names:

    "silu"       z * sigmoid(z)                                    (HF "silu" / "swish")
    "gelu"       0.5 * z * (1 + erf(z / sqrt(2)))                  (HF "gelu", torch's exact GELU)
    "gelu_tanh"  0.5 * z * (1 + tanh(sqrt(2/pi) * (z + 0.044715 z^3)))  (HF "gelu_pytorch_tanh")
    "relu"       max(z, 0)                                         (HF "relu")

The forward is torch's own function (so the reference rounds exactly where torch does); the
derivatives are the formulas of torch's backward kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")

# transformers' ACT2FN names for the same functions (functional entry points may accept either)
HF_NAMES = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def activation(z: Tensor, name: str) -> Tensor:
    """act(z) elementwise, in z's dtype (pass the accumulation dtype)."""
    if name == "silu":
        return F.silu(z)
    if name == "gelu":
        return F.gelu(z)
    if name == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    if name == "relu":
        return F.relu(z)
    raise ValueError(f"activation must be one of {ACTIVATIONS} (got {name!r})")


def activation_grad(z: Tensor, name: str) -> Tensor:
    """d act / dz elementwise, in z's dtype (torch's backward formulas)."""
    if name == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * (1 - s))
    if name == "gelu":
        cdf = 0.5 * (1 + torch.erf(z * math.sqrt(0.5)))
        return cdf + z * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI
    if name == "gelu_tanh":
        t = torch.tanh(_SQRT_2_OVER_PI * (z + _KAPPA * z * z * z))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _KAPPA * z * z)
    if name == "relu":
        # torch's threshold_backward: the gradient passes where the output is positive
        return (z > 0).to(z.dtype)
    raise ValueError(f"activation must be one of {ACTIVATIONS} (got {name!r})")
