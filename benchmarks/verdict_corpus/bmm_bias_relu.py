"""A batched matmul with a bias and ReLU epilogue (the epilogue fuses compiled)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.bmm(a, b) + bias)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(32, 256, 256), torch.randn(32, 256, 256), torch.randn(256)]


def get_init_inputs() -> list:
    return []
