"""Triton device helpers shared by the row-wise backward kernels (ops/rms_norm.py, ops/layer_norm.py):
tile row indices, tile loads, and the two modes' walks over tiles.

The walks prefetch by hand: each step issues the next tile's loads before this tile's math, so two
tiles of traffic are in flight; past the end the loads re-read the last row (`tile_rows`)."""

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


@triton.jit
def first_loads(DY, X, first, end, stride_dy, stride_x, cols, col_ok, ROWS: tl.constexpr, PREFETCH: tl.constexpr):
    """Before a walk: with PREFETCH the (dy, x) loads of the tile at row `first`, else placeholders."""
    if PREFETCH:
        rows, _ = tile_rows(first, ROWS, end)
        return load_dy_x(DY, X, rows, stride_dy, stride_x, cols, col_ok)
    else:
        return 0.0, 0.0


@triton.jit
def row_step(
    DY, X, tile, n_progs, n_rows, dy_next, x_next, stride_dy, stride_x, cols, col_ok,
    ROWS: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Row mode, one step of a program's walk over tiles tile, tile + n_progs, ...: the tile's rows, which
    of them are real, its dy and x in fp32, and the loads to pass to the next step. With PREFETCH the
    tile is `dy_next, x_next` (loaded a step earlier) and the next tile is loaded now; without, this
    tile is loaded now and the placeholders pass through."""
    rows, row_ok = tile_rows(tile * ROWS, ROWS, n_rows)
    if PREFETCH:
        dy, x = dy_next, x_next
        nxt, _ = tile_rows((tile + n_progs) * ROWS, ROWS, n_rows)
        dy_next, x_next = load_dy_x(DY, X, nxt, stride_dy, stride_x, cols, col_ok)
    else:
        dy, x = load_dy_x(DY, X, rows, stride_dy, stride_x, cols, col_ok)
    return rows, row_ok, dy.to(tl.float32), x.to(tl.float32), dy_next, x_next


@triton.jit
def split_step(DY, X, first, end, dy_next, x_next, stride_dy, stride_x, cols, col_ok, ROWS: tl.constexpr):
    """Split mode, one step of a column-pass program's walk: the tile at row `first` (its rows, which
    are real, dy and x in fp32, from `dy_next, x_next` loaded a step earlier) and the loads of the tile
    after it, issued now."""
    rows, row_ok = tile_rows(first, ROWS, end)
    dy, x = dy_next.to(tl.float32), x_next.to(tl.float32)
    nxt, _ = tile_rows(first + ROWS, ROWS, end)
    dy_next, x_next = load_dy_x(DY, X, nxt, stride_dy, stride_x, cols, col_ok)
    return rows, row_ok, dy, x, dy_next, x_next


@triton.jit
def chunk_dy_x(DY, X, stride_dy, stride_x, n_cols, BLOCK: tl.constexpr):
    """Split mode, statistics pass: program (row, chunk)'s row, columns, column mask, and its dy and x
    in fp32 (masked columns 0)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    dy = tl.load(DY + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    return row, cols, ok, dy, x


@triton.jit
def split_block(n_rows, n_cols, rows_per_group, BLOCK: tl.constexpr):
    """Split mode, column pass: program (i, k)'s columns i*BLOCK.., their mask, and its rows
    k*rows_per_group .. end - 1 (the last group fewer)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    start = tl.program_id(1) * rows_per_group
    return cols, cols < n_cols, start, tl.minimum(start + rows_per_group, n_rows)


@triton.jit
def chunk_sums(STATS, rows, n_chunks, CHUNKS: tl.constexpr):
    """Split mode: each row's statistic summed over its chunks, STATS (rows, n_chunks), in a fixed
    order -> [ROWS, 1]."""
    chunk = tl.arange(0, CHUNKS)
    return tl.sum(load_rows(STATS, rows, n_chunks, chunk, chunk < n_chunks), axis=1)[:, None]
