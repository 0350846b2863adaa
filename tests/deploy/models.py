"""Small plain-torch models for the deploy tests: two norms that optimize() swaps and a linear layer (`Small`), and
an LM head tied to the embedding (`TiedHead`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import kernel_pytorch

DIM = 16


class Small(nn.Module):
    def __init__(self, dim: int = DIM, extra: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.out = nn.RMSNorm(dim)
        if extra:
            self.head = nn.Linear(dim, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.proj(self.norm(x)))


class TiedHead(nn.Module):
    """An embedding and an LM head sharing one (32, 16) weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.embed(ids))


def optimized_small(**kwargs: object) -> tuple[nn.Module, kernel_pytorch.optimize.OptimizeReport]:
    """A `Small` with random norm weights, optimized without validation (both norms swapped)."""
    model = Small(**kwargs)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return kernel_pytorch.optimize(model, (torch.randn(2, DIM),), validate=False, compile=False)


def snapshot(model: nn.Module) -> tuple[dict[str, Tensor], list[str]]:
    """(a copy of every state_dict tensor, each module's class) to check a model is unchanged."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, [f"{type(m).__module__}.{type(m).__name__}" for m in model.modules()]


def _bits(t: Tensor) -> Tensor:
    return t.reshape(-1).view(torch.uint8)


def unchanged(model: nn.Module, before: tuple[dict[str, Tensor], list[str]]) -> bool:
    """Whether `model` has the classes and bitwise the tensors of `before` (from `snapshot`)."""
    state, classes = snapshot(model)
    return (classes == before[1] and state.keys() == before[0].keys()
            and all(torch.equal(_bits(state[k]), _bits(before[0][k])) for k in state))
