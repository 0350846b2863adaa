"""Shared pieces of the norm-family op tests."""

from __future__ import annotations

import torch

from kernel_pytorch.tolerances import compare, fp64_budget
from tests.grid import compile_and_count_breaks, randn


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message(name)


def assert_budget(actual: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, name: str) -> None:
    result = fp64_budget(actual, eager, ref64)
    assert result.passed, result.message(name)


def assert_compiles_like_eager(f, wrt: tuple[torch.Tensor, ...]) -> None:
    """f compiles with fullgraph and no break, and matches eager in its output and in the gradients of
    every tensor in `wrt` for a random upstream gradient."""
    eager = f(*wrt)
    compiled, breaks = compile_and_count_breaks(f, *wrt)
    assert breaks == 0
    assert_close(compiled, eager, "compiled")
    dy = randn(*eager.shape, device=eager.device)
    for a, e in zip(torch.autograd.grad(compiled, wrt, dy), torch.autograd.grad(eager, wrt, dy)):
        assert_close(a, e, "compiled grad")
