"""Masks applied with where and masked_fill, then a clamp and an exp (elementwise with bool inputs)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = torch.where(mask, x, torch.zeros_like(x)).masked_fill(x > 2.0, 2.0)
        return torch.exp(y.clamp(-3.0, 3.0))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4096, 2048), torch.rand(4096, 2048) > 0.5]


def get_init_inputs() -> list:
    return []
