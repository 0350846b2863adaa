"""Token and position embeddings looked up and summed, then scaled (a gather and two elementwise ops)."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, vocab: int = 32000, d: int = 512, positions: int = 512) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(positions, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return (self.tok(ids) + self.pos(pos)) * 0.5


def get_inputs() -> list[torch.Tensor]:
    return [torch.randint(0, 32000, (16, 512))]


def get_init_inputs() -> list:
    return [32000, 512, 512]
