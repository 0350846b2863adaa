"""Row schedules for the row-wise kernels (norms): block and warp choice for a row, the backward's
row mode and split mode, and (rows, D) views of the inputs. No op math.

The schedules' limits are a `RowsConfig`, part of the norm family's launch config (ops/norm_config.py);
every function here takes the config in force as an argument, and the memoised ones key on it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from kernel_pytorch.ops._common.launch import device_programs, next_power_of_2, persistent_programs


@dataclass(frozen=True)
class RowsConfig:
    """Limits of the row schedules, shared by every row-wise op (docs/performance.md, H200 and H100,
    2026-11-21, measured each).

    Fields:
        max_fused_cols: one row lives in registers up to this many elements; wider rows loop over
            column blocks of `loop_block`.
        max_warps: warps per program at most: 32 measured slower than 16 on 16K-wide rows, the
            forward falling from 79% to 56% of copy at 2048 x 16384 (H200).
        prefetch_max_block: the row-mode backward prefetches the next tile while computing this one up
            to this block; wider rows would spill the doubled registers and run one row per tile, one
            program per SM. Two tiles ahead measured slower (RMSNorm 76%, LayerNorm 63% of copy against
            92% / 90%, H100, 16384 x 4096).
        split_col_block, split_tile_rows, split_programs_per_sm, split_warps: the split-mode backward
            (rows wider than the registers hold): a statistics pass writes each row's sums per column
            chunk, then a column pass gives each program `split_col_block` columns of a group of rows,
            walked in tiles of `split_tile_rows`, so weight-gradient partials are one row per row group
            and no partial row is read back and rewritten once per row. Two column-pass programs per
            SM measured best (one: 42.2 / 41.7, four: 46.8 / 30.6 against 48.7 / 42.0% of copy for
            LayerNorm at 2048 x 16384 / 256 x 262144, H100); 2048-column blocks gave LayerNorm +2
            points and RMSNorm -1 (benchmarks/results/probes/norm/probe_norms_sweep_h100.log).
    """

    max_fused_cols: int = 16384
    loop_block: int = 4096
    max_warps: int = 16
    prefetch_max_block: int = 8192
    split_col_block: int = 1024
    split_tile_rows: int = 4
    split_programs_per_sm: int = 2
    split_warps: int = 8


@dataclass(frozen=True)
class RowLaunch:
    """How to launch a row-wise kernel over rows of `n_cols` elements."""

    block: int  # column block (power of two)
    single_pass: bool  # the whole row fits in one block
    num_warps: int


def row_launch(
    n_cols: int, element_size: int, elements_per_thread: int, rows: RowsConfig, max_fused_cols: int | None = None
) -> RowLaunch:
    """Block and warp choice for a row of `n_cols` elements of `element_size` bytes.

    Args:
        n_cols: the row width; a symbolic size (a body traced with dynamic shapes) is specialised, since
            the block and warps are compile-time choices of the kernel (a model's hidden size is fixed).
        elements_per_thread: how many elements each thread should hold (each op measures its own;
            at least one 16-byte vector is always used).
        rows: the row schedules' limits in force (the norm config's `rows`).
        max_fused_cols: widest row kept whole in registers for this kernel (capped by
            `rows.max_fused_cols`); wider rows loop over `rows.loop_block` columns.
    """
    return _row_launch(int(n_cols), element_size, elements_per_thread, max_fused_cols, rows)


@functools.lru_cache(maxsize=1024)
def _row_launch(
    n_cols: int, element_size: int, elements_per_thread: int, max_fused_cols: int | None, rows: RowsConfig
) -> RowLaunch:
    # memoised (keyed on the config too): it runs on every eager call
    limit = min(rows.max_fused_cols, max_fused_cols or rows.max_fused_cols)
    if n_cols <= limit:
        block = next_power_of_2(n_cols)
        single = True
    else:
        block = min(rows.loop_block, next_power_of_2(limit))
        single = False
    per_thread = max(16 // element_size, elements_per_thread)
    num_warps = next_power_of_2(min(rows.max_warps, max(1, block // (32 * per_thread))))
    return RowLaunch(block=block, single_pass=single, num_warps=num_warps)


@dataclass(frozen=True)
class RowTiling:
    """An op's row-mode choice: rows per tile and persistent programs per SM.

    The backward's row mode (the row fits in registers) runs a persistent grid of programs, each
    walking tiles of rows and keeping one fp32 partial row per parameter gradient; one two-row program
    per SM keeps the partials to one row per SM at the same warps per SM as two one-row programs."""

    tile: int
    programs_per_sm: int


@dataclass(frozen=True)
class RowSchedule:
    """Row mode: `programs` persistent programs over tiles of `tile` rows."""

    programs: int
    tile: int
    prefetch: bool


@dataclass(frozen=True)
class SplitSchedule:
    """Split mode. Statistics pass: grid (rows, chunks), `chunks` column blocks of the row launch's
    block. Column pass: grid (column blocks of `col_block`, `groups`), each program walking
    `rows_per_group` rows (the last group fewer) in tiles of `tile` rows."""

    chunks: int
    col_block: int
    col_blocks: int
    groups: int
    rows_per_group: int
    tile: int
    num_warps: int


def row_schedule(
    n_rows: int, device: torch.device, launch: RowLaunch, tiling: RowTiling, rows: RowsConfig
) -> RowSchedule:
    """How a backward row loop runs rows of `launch` (a single-pass launch) on `device`; the
    program runs with `launch.num_warps` whatever its tile (each thread holds its share of every
    tile row)."""
    if launch.block > rows.prefetch_max_block:
        return RowSchedule(persistent_programs(n_rows, device, 1), 1, False)
    programs = persistent_programs(triton.cdiv(n_rows, tiling.tile), device, tiling.programs_per_sm)
    return RowSchedule(programs, tiling.tile, True)


def split_schedule(
    n_rows: int, n_cols: int, device: torch.device, launch: RowLaunch, rows: RowsConfig
) -> SplitSchedule:
    """How a split-mode backward covers (n_rows, n_cols) on `device`; `launch` is the looping launch."""
    col_block = min(rows.split_col_block, launch.block)
    col_blocks = triton.cdiv(n_cols, col_block)
    tile = rows.split_tile_rows
    n_tiles = triton.cdiv(n_rows, tile)
    groups = max(1, min(n_tiles, triton.cdiv(device_programs(device, rows.split_programs_per_sm), col_blocks)))
    rows_per_group = triton.cdiv(n_tiles, groups) * tile
    warps = next_power_of_2(min(rows.split_warps, max(1, tile * col_block // 256)))
    return SplitSchedule(
        chunks=triton.cdiv(n_cols, launch.block), col_block=col_block, col_blocks=col_blocks,
        groups=triton.cdiv(n_rows, rows_per_group), rows_per_group=rows_per_group, tile=tile, num_warps=warps,
    )


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View `x` (..., D) as (rows, D) with unit column stride; copies only when no such view exists.

    The returned tensor may have any row stride (slices of wider rows stay views).
    """
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    d = x.shape[-1]
    if x.stride(-1) != 1 and d > 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.unsqueeze(0)
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, d)
    except RuntimeError:  # leading dims not collapsible into one stride
        return x.reshape(-1, d)


def row_stride(x2d: torch.Tensor) -> int:
    """Row stride of a (rows, D) view; any value works for a single row."""
    return x2d.stride(0) if x2d.shape[0] > 1 else x2d.shape[1]
