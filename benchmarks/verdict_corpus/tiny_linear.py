"""A single small Linear: one GEMM both ways; compiling adds only its call overhead."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 64)]


def get_init_inputs() -> list:
    return [64]
