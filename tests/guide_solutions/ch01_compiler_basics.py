"""Chapter 1's exercise: Exercise01 as one graph, with the same outputs."""

from __future__ import annotations

import torch
from torch import nn


class Solution01(nn.Module):
    """x: (B, 16) -> logits (B, 4), scaled to a largest magnitude of 1."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the print goes (log outside the model); clamping a tensor with nothing beyond 10 leaves it as it
        # was, so the branch is not needed; the scale stays a 0-dim tensor
        y = self.proj(x.clamp(-10, 10))
        return y / y.abs().amax()


SOLUTION = Solution01
