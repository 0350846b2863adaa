"""One multiply on four numbers: eager runs a single op in microseconds; the compiled call adds its guard
checks and wrapper around the same work. Compiling loses clearly."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4)]


def get_init_inputs() -> list:
    return []
