"""Conv2d, BatchNorm (eval: folded into a per-channel scale), ReLU, at ResNet stem-like sizes."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(16, 64, 56, 56)]


def get_init_inputs() -> list:
    return []
