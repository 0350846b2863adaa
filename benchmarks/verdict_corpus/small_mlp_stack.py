"""Eight small Linear + ReLU layers on a batch of 16: launch-bound eager (16 ops), bias+ReLU fused compiled."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, d: int = 128, layers: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.ReLU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(16, 128)]


def get_init_inputs() -> list:
    return [128, 8]
