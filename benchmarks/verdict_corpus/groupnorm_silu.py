"""GroupNorm then SiLU on a UNet-like feature map."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(32, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.norm(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(8, 256, 32, 32)]


def get_init_inputs() -> list:
    return []
