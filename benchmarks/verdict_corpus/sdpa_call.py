"""One scaled_dot_product_attention call: the same attention kernel both ways."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 8, 512, 64) for _ in range(3)]


def get_init_inputs() -> list:
    return []
