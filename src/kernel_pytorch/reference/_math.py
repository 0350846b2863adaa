"""Precision helper for the references: fp32 math for low-precision inputs, fp64 stays fp64 (so the
same reference serves as the fp64 yardstick)."""

from __future__ import annotations

import torch
from torch import Tensor


def acc(t: Tensor) -> Tensor:
    """`t` in its accumulation dtype: float32 for fp16/bf16/fp32, float64 for float64."""
    return t.to(acc_dtype(t.dtype))


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype for inputs of `dtype` (also the dtype of saved statistics)."""
    return torch.promote_types(dtype, torch.float32)
