"""docs/examples/cnn_optimization.md's exercise: ExerciseCNN with its channel shuffle kept in channels_last."""

from __future__ import annotations

import torch
from torch import nn


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle of x (B, C, H, W), written on the NHWC view: the result is channels_last.

    In channels_last memory the channels are the innermost dim, so the shuffle is a transpose of the last
    dim split in (groups, C / groups): one copy, into NHWC order, which permuted back is a channels_last
    (B, C, H, W) tensor. An NCHW input gives the same values, also in channels_last.
    """
    b, c, h, w = x.shape
    nhwc = x.permute(0, 2, 3, 1)                       # a view; contiguous when x is channels_last
    shuffled = nhwc.reshape(b, h, w, groups, c // groups).transpose(3, 4).reshape(b, h, w, c)
    return shuffled.permute(0, 3, 1, 2)


class SolutionCNN(nn.Module):
    """images (B, 3, H, W) -> logits (B, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.group1 = nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False)
        self.group2 = nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.group1(x))
        x = channel_shuffle(x, 4)
        x = torch.relu(self.group2(x))
        return self.head(x.mean((2, 3)))


SOLUTION = SolutionCNN
