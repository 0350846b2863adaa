"""Chapter 2's exercise: HeadLoopAttention without the loop, on one SDPA call."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Solution02(nn.Module):
    """Causal self-attention, every head at once. x: (B, T, dim) -> (B, T, dim)."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # (B, T, 3, H, D) -> three (B, H, T, D): the columns of head h are h * D ... (h + 1) * D, as in the loop
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


SOLUTION = Solution02
