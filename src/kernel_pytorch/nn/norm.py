"""Norm modules: drop-ins for torch.nn.RMSNorm / torch.nn.LayerNorm, and a fused add+RMSNorm.

The drop-ins subclass the torch modules and override `forward` only, so constructor, parameter names,
`state_dict` keys and `repr` are torch's. A multi-dim `normalized_shape` is normalised as one
flattened row, which is what torch does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernel_pytorch import functional as F
from kernel_pytorch.functional import Backend


def _flatten_normalized(x: Tensor, normalized_shape: tuple[int, ...]) -> tuple[Tensor, int]:
    """View x (..., *normalized_shape) as (..., prod(normalized_shape))."""
    k = len(normalized_shape)
    if tuple(x.shape[x.dim() - k :]) != tuple(normalized_shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end in normalized_shape {tuple(normalized_shape)}"
        )
    if k == 1:
        return x, x.shape[-1]
    return x.reshape(*x.shape[: x.dim() - k], -1), math.prod(normalized_shape)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm running kernel_pytorch's RMSNorm (Triton on CUDA).

    Same arguments as torch.nn.RMSNorm. forward: x (..., *normalized_shape) -> same shape and dtype.
    `backend` may be set on an instance ("auto", "triton", "reference").
    """

    backend: Backend = "auto"

    def forward(self, x: Tensor) -> Tensor:
        x2, d = _flatten_normalized(x, tuple(self.normalized_shape))
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        weight = self.weight.reshape(-1) if self.weight is not None else x.new_ones(d)
        return F.rms_norm(x2, weight, eps, backend=self.backend).view(x.shape)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm running kernel_pytorch's LayerNorm (Triton on CUDA).

    Same arguments as torch.nn.LayerNorm. forward: x (..., *normalized_shape) -> same shape and dtype.
    """

    backend: Backend = "auto"

    def forward(self, x: Tensor) -> Tensor:
        x2, _ = _flatten_normalized(x, tuple(self.normalized_shape))
        weight = self.weight.reshape(-1) if self.weight is not None else None
        bias = self.bias.reshape(-1) if self.bias is not None else None
        return F.layer_norm(x2, weight, bias, self.eps, backend=self.backend).view(x.shape)


class FusedAddRMSNorm(torch.nn.Module):
    """Residual add + RMSNorm in one kernel, with HF Llama's parameter names (`weight`,
    `variance_epsilon`) so a `LlamaRMSNorm` state_dict loads into it unchanged.

    Args:
        hidden_size: D.
        eps: added to the mean square.
        offset: added to the weight (1.0 for Gemma-style norms, whose weight starts at 0).
    forward(x, residual): both (..., D) -> (normed, x + residual), both (..., D).
    """

    backend: Backend = "auto"

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.offset = offset

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return F.add_rms_norm(
            x, residual, self.weight, self.variance_epsilon, offset=self.offset, backend=self.backend
        )

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, offset={self.offset}"
