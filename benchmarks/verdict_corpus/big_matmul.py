"""One large matmul: the same GEMM library call eager and compiled (no difference expected)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]


def get_init_inputs() -> list:
    return []
