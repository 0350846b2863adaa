"""A transposed add (x + x.T) and a scale: a strided read that the compiled loop tiles."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + x.t()) * 0.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4096, 4096)]


def get_init_inputs() -> list:
    return []
