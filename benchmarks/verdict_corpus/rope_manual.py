"""Rotary position embedding applied to queries, written out (split halves, cos/sin, cat)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        return q * cos + rotated * sin


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 16, 1024, 128), torch.randn(1024, 128), torch.randn(1024, 128)]


def get_init_inputs() -> list:
    return []
