"""Twenty elementwise ops in a row on a (256, 256) tensor: eager launches (CPU: runs) twenty ops and
writes twenty intermediates; the compiled step is one fused loop. Compiling wins clearly."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(5):
            x = torch.sin(x) * 1.01 + 0.1 * i
            x = torch.tanh(x) - x * 0.5
        return x


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(256, 256)]


def get_init_inputs() -> list:
    return []
