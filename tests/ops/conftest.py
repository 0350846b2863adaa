"""Fixtures for the op tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import triton

from kernel_pytorch.ops import layer_norm, rms_norm
from kernel_pytorch.ops._common import rows as _rows
from tests.grid import device_under_test


@pytest.fixture(params=["fused", "looped"])
def row_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test on both kernel paths: whole row in registers, and the column-block loop (forced on
    small rows by lowering the fused limit)."""
    if request.param == "looped":
        monkeypatch.setattr(_rows, "MAX_FUSED_COLS", 16)
        monkeypatch.setattr(_rows, "LOOP_BLOCK", 16)
    # row_launch memoises its answers, which depend on the limits patched here
    _rows.row_launch.cache_clear()
    yield request.param
    _rows.row_launch.cache_clear()


@pytest.fixture(params=["rows", "split"])
def many_programs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Backward schedules with several programs, partial tiles and (split) several row groups on small
    shapes: row mode with two-row tiles for every op, or split mode with column blocks narrower than
    the chunks."""
    if request.param == "split":
        monkeypatch.setattr(_rows, "MAX_FUSED_COLS", 16)
        monkeypatch.setattr(_rows, "LOOP_BLOCK", 16)
        monkeypatch.setattr(_rows, "SPLIT_COL_BLOCK", 8)
        monkeypatch.setattr(_rows, "SPLIT_TILE_ROWS", 2)
    else:
        for mod in (layer_norm, rms_norm):
            monkeypatch.setattr(mod, "BWD_TILING", TWO_ROW_TILES)
        monkeypatch.setattr(rms_norm, "BWD_TILINGS", {})
    _rows.row_launch.cache_clear()
    yield request.param
    _rows.row_launch.cache_clear()


TWO_ROW_TILES = _rows.RowTiling(tile=2, programs_per_sm=1)


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
    launch = _rows.row_launch(n_cols, element_size, 8)
    if mode == "split":
        s = _rows.split_schedule(n_rows, n_cols, device, launch)
        assert not launch.single_pass and s.groups > 1 and s.chunks > 1 and s.col_blocks > s.chunks
        assert (n_rows % s.rows_per_group) % s.tile  # the last group ends in a partial tile
    else:
        s = _rows.row_schedule(n_rows, device, launch, TWO_ROW_TILES)
        assert launch.single_pass and s.tile == 2 and s.prefetch and n_rows % 2
        assert triton.cdiv(n_rows, 2) > s.programs
