"""Shared pieces of the norm-family op tests."""

from __future__ import annotations

import torch

from kernel_pytorch.tolerances import compare, fp64_budget


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message(name)


def assert_budget(actual: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor, name: str) -> None:
    result = fp64_budget(actual, eager, ref64)
    assert result.passed, result.message(name)
