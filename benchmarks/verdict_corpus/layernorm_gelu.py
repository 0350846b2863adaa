"""LayerNorm then GELU then a residual add: three memory-bound passes eager, fused compiled."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d: int = 1024) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.norm(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8192, 1024)]


def get_init_inputs() -> list:
    return [1024]
