"""A depthwise 3x3 convolution followed by a pointwise one and a hardswish (MobileNet block)."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, c: int = 128) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.hardswish(self.pw(nn.functional.hardswish(self.dw(x))))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(16, 128, 28, 28)]


def get_init_inputs() -> list:
    return [128]
