"""Shared pieces of the quantized-matmul tests: quantized weights, the reference call in the op's
argument order, and the matmul comparison (tolerances.compare_matmul)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference import quant_matmul as R
from kernel_pytorch.tolerances import compare_matmul
from tests.grid import randn


def quantized(scheme: str, n: int, k: int, group: int = 32, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    """The parts of a random (n, k) weight of `dtype` under `scheme` (int4 in groups of `group`), with
    a few rows scaled up: rows of different scales."""
    w = randn(n, k, device=device) * (torch.rand(n, 1, device=device) + 0.5)
    w[: max(1, n // 4)] *= 8
    return R.quantize(w.to(dtype), scheme, group)


def weight_args(scheme: str, parts: dict[str, Tensor], group: int) -> tuple:
    """The op's weight arguments after x: (qweight, scale) or (qweight, scale, zero, group_size)."""
    if scheme == "int4":
        return parts["qweight"], parts["scale"], parts["zero"], group
    return parts["qweight"], parts["scale"]


def reference(scheme: str, x: Tensor, parts: dict[str, Tensor], group: int, bias: Tensor | None) -> Tensor:
    return getattr(R, f"{scheme}_matmul")(x, *weight_args(scheme, parts, group), bias)


def magnitude(scheme: str, x: Tensor, parts: dict[str, Tensor], group: int, bias: Tensor | None) -> Tensor:
    """sum |x_k W_nk| (+ |bias_n|) per output element, fp64: the scale of fp32's summation error."""
    w = R.dequantize(parts, scheme, group, torch.float64)
    mag = x.to(torch.float64).abs() @ w.abs().t()
    return mag + bias.to(torch.float64).abs() if bias is not None else mag


def assert_matmul_close(actual: Tensor, expected: Tensor, mag: Tensor, k: int, name: str) -> None:
    result = compare_matmul(actual, expected, mag, k)
    assert result.passed, result.message(name)
