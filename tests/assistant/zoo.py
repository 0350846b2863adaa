"""Small models with one known compile problem each. Each offending line carries a `# ZOO:<name>`
marker; the tests find the expected line number by that marker, so editing this file cannot silently
shift what they check."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from torch import Tensor, nn

log = logging.getLogger("zoo")


class _Base(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)


class Clean(_Base):
    """Linear -> GELU -> LayerNorm: compiles as one graph."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__(dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, D)
        return self.norm(torch.nn.functional.gelu(self.proj(x)))


class DataDependentBranch(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        if y.sum() > 0:  # ZOO:branch
            y = y * 2
        return y + 1


class ItemCall(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        peak = y.abs().max().item()  # ZOO:item
        return y / peak


class PrintCall(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        print("activations", y.shape)  # ZOO:print
        return torch.relu(y)


class LoggingCall(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        log.info("activations %s", y.shape)  # ZOO:logging
        return torch.relu(y)


class NumpyCall(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        table = np.interp(y.detach().numpy(), [-1.0, 1.0], [0.0, 1.0])  # ZOO:numpy
        return y + torch.from_numpy(table).to(y.dtype)


class UnsupportedBuiltin(_Base):
    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        started = time.time()  # ZOO:builtin
        return y * (started > 0)


class ScalarArg(_Base):
    """A Python float argument: each new value is a new constant to Dynamo."""

    def forward(self, x: Tensor, scale: float) -> Tensor:
        return self.proj(x) * scale  # ZOO:scalar


class Mlp(nn.Module):
    """Two linears over (B, T, D) inputs: any batch and sequence length works."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, D)
        return self.down(torch.relu(self.up(x)))


class RaisesWhenTraced(_Base):
    """Runs eagerly, raises under torch.compile."""

    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        if torch.compiler.is_compiling():
            raise RuntimeError("this model refuses to be traced")  # ZOO:raise-traced
        return y


class RaisesEagerly(_Base):
    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x.t())  # ZOO:raise-eager


class TwoBlocks(nn.Module):
    """Repeated identical blocks: the case for regional compilation."""

    def __init__(self, dim: int = 16, n: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Mlp(dim) for _ in range(n))

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def _chatty(y: Tensor) -> None:
    print("shape", y.shape)  # ZOO:helper-print


class BreakTwiceSameLine(_Base):
    """The same helper breaks the graph twice: one finding, two occurrences."""

    def forward(self, x: Tensor) -> Tensor:
        y = self.proj(x)
        _chatty(y)
        y = torch.relu(y)
        _chatty(y)
        return y * 2


class TwoInputs(nn.Module):
    """Keyword inputs: token ids (B, T) and a float mask (B, T)."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:  # ids, mask: (B, T)
        return (self.emb(ids) * mask.unsqueeze(-1)).sum(1)


def line_of(marker: str) -> int:
    """1-based line number of the line carrying `# ZOO:<marker>` in this file."""
    with open(__file__) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# ZOO:{marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def def_line(cls: type[nn.Module]) -> int:
    """Line of `def forward` of `cls`."""
    import inspect

    return inspect.getsourcelines(cls.forward)[1]
