"""Argmax over classes, then a one-hot of the winner times the max probability."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(logits, -1)
        best = p.argmax(-1)
        return nn.functional.one_hot(best, p.shape[-1]).to(p.dtype) * p.amax(-1, keepdim=True)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4096, 1000)]


def get_init_inputs() -> list:
    return []
