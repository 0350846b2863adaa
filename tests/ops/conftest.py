"""Fixtures for the op tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import triton

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common import rows as _rows
from kernel_pytorch.ops.norm_config import NormConfig
from tests.grid import device_under_test

TWO_ROW_TILES = _rows.RowTiling(tile=2, programs_per_sm=1)


def norm_config(**rows: int) -> NormConfig:
    """The norm config in force with some of its row-schedule limits replaced."""
    cfg = tuning.current("norm")
    return replace(cfg, rows=replace(cfg.rows, **rows))


@pytest.fixture(params=["fused", "looped"])
def row_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test on both kernel paths: whole row in registers, and the column-block loop (forced on
    small rows by lowering the fused limit)."""
    looped = request.param == "looped"
    with tuning.override(norm=norm_config(max_fused_cols=16, loop_block=16) if looped else tuning.current("norm")):
        yield request.param


@pytest.fixture(params=["rows", "split"])
def many_programs(request: pytest.FixtureRequest) -> Iterator[str]:
    """Backward schedules with several programs, partial tiles and (split) several row groups on small
    shapes: row mode with two-row tiles for every op, or split mode with column blocks narrower than
    the chunks."""
    if request.param == "split":
        cfg = norm_config(max_fused_cols=16, loop_block=16, split_col_block=8, split_tile_rows=2)
    else:
        cfg = tuning.current("norm")
        cfg = replace(cfg, rms_norm=replace(cfg.rms_norm, bwd_tiling=TWO_ROW_TILES, bwd_tilings=()),
                      layer_norm=replace(cfg.layer_norm, bwd_tiling=TWO_ROW_TILES, bwd_tilings=()))
    with tuning.override(norm=cfg):
        yield request.param


def many_rows() -> int:
    """More two-row tiles than a row-mode launch has programs on the device under test, and odd (the
    last tile is cut short)."""
    if not torch.cuda.is_available():
        return 37
    return 4 * torch.cuda.get_device_properties(0).multi_processor_count + 1


def assert_schedule_covers_tails(mode: str, n_rows: int, n_cols: int, element_size: int) -> None:
    """The schedule the backward uses for (n_rows, n_cols) on the device under test has what the
    many_programs tests mean to exercise."""
    device = torch.device(device_under_test())
    rows = tuning.current("norm").rows
    launch = _rows.row_launch(n_cols, element_size, 8, rows)
    if mode == "split":
        s = _rows.split_schedule(n_rows, n_cols, device, launch, rows)
        assert not launch.single_pass and s.groups > 1 and s.chunks > 1 and s.col_blocks > s.chunks
        assert (n_rows % s.rows_per_group) % s.tile  # the last group ends in a partial tile
    else:
        s = _rows.row_schedule(n_rows, device, launch, TWO_ROW_TILES, rows)
        assert launch.single_pass and s.tile == 2 and s.prefetch and n_rows % 2
        assert triton.cdiv(n_rows, 2) > s.programs
