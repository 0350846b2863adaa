"""A Python loop of 64 tiny ops on a (32,) vector: launch- (CPU: dispatch-) bound eager, one kernel compiled."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(32):
            x = x * 0.99 + 0.01 * i
        return x


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32)]


def get_init_inputs() -> list:
    return []
