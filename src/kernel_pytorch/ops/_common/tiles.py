"""Triton device helpers shared by the row-wise backward kernels: tile row indices and tile loads."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_rows(first, ROWS: tl.constexpr, end):
    """Rows first .. first + ROWS - 1 of a tile (int64 [ROWS]) clamped below `end`, and which of them
    are real: a tile running past `end` re-reads row end - 1 (in bounds) and masks what it computes."""
    rows = tl.cast(first, tl.int64) + tl.arange(0, ROWS)
    return tl.minimum(rows, end - 1), rows < end


@triton.jit
def load_rows(BASE, rows, stride, cols, col_ok):
    """The [ROWS, C] tile BASE[rows, cols] (rows int64 [ROWS], in bounds); masked columns read 0."""
    return tl.load(BASE + rows[:, None] * stride + cols[None, :], mask=col_ok[None, :], other=0.0)



@triton.jit
def load_dy_x(DY, X, rows, stride_dy, stride_x, cols, col_ok):
    """The upstream-gradient and input tiles of the same rows, as stored: every backward reads both."""
    return load_rows(DY, rows, stride_dy, cols, col_ok), load_rows(X, rows, stride_x, cols, col_ok)
