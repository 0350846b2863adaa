"""Fixtures for the op tests."""

from __future__ import annotations

import pytest

from kernel_pytorch.ops import _triton


@pytest.fixture(params=["fused", "looped"])
def row_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both kernel paths: whole row in registers, and the column-block loop (forced on
    small rows by lowering the fused limit)."""
    if request.param == "looped":
        monkeypatch.setattr(_triton, "MAX_FUSED_COLS", 16)
        monkeypatch.setattr(_triton, "LOOP_BLOCK", 16)
    return request.param
