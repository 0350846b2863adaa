"""Rows of a (..., D) tensor addressed without a copy by up to two index levels, for kernels that must
not copy a large input: a shifted view such as logits[:, :-1] of a (B, T, V) tensor has rows no single
stride reaches, and `as_rows` would copy all of it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Rows:
    """A (..., D) tensor seen as `n_rows` rows: row i starts (i // inner) * s0 + (i % inner) * s1
    elements after `tensor`'s first element, and its D elements are contiguous."""

    tensor: Tensor
    n_rows: int
    inner: int
    s0: int
    s1: int

    @property
    def args(self) -> tuple[int, int, int]:
        """(inner, s0, s1): what a kernel takes to address the rows: row i at (i // inner) * s0 + (i % inner) * s1."""
        return self.inner, self.s0, self.s1

    def same_storage(self, x: Tensor) -> bool:
        """Whether the rows are `x`'s own memory (not a copy)."""
        return self.tensor.data_ptr() == x.data_ptr()


def row_view(x: Tensor) -> Rows:
    """The rows of `x` (..., D): a view when one or two index levels address them (any leading strides
    of a 2-D or 3-D tensor, or of one whose leading dims collapse to at most two); a contiguous copy
    otherwise, or when the last dim is strided."""
    d = x.shape[-1]
    if x.stride(-1) != 1 and d > 1:
        x = x.contiguous()
    n = math.prod(x.shape[:-1])
    if n <= 1:
        return Rows(x, n, 1, 0, d)
    try:
        x2 = x.view(n, d)
        return Rows(x2, n, n, 0, x2.stride(0))
    except RuntimeError:  # leading dims not collapsible into one stride
        pass
    try:
        x3 = x.view(-1, x.shape[-2], d)
        return Rows(x3, n, x3.shape[1], x3.stride(0), x3.stride(1))
    except RuntimeError:
        return Rows(x.contiguous().view(n, d), n, n, 0, d)


def contiguous_rows(x: Tensor) -> Rows:
    """`row_view` of a tensor known to be contiguous (a buffer the caller allocated)."""
    n = math.prod(x.shape[:-1])
    return Rows(x, n, max(n, 1), 0, x.shape[-1])

