"""A SwiGLU MLP block (gate, up, silu * up, down): GEMM-bound with one fusable elementwise step."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d: int = 1024, hidden: int = 2816) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2048, 1024)]


def get_init_inputs() -> list:
    return [1024, 2816]
