"""The copy bandwidth the estimates stand on: cached for this device, host and torch version and said so
(when, where, from which file), else assumed; read from the cache the environment names, each call."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from kernel_pytorch.assistant.estimates import ASSUMED_CPU_GBPS, copy_bandwidth
from kernel_pytorch.benchmark import ceilings as C


def test_the_bandwidth_says_where_a_cached_figure_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path / "empty"))
    assumed = copy_bandwidth("cpu")
    assert assumed.source == "assumed" and assumed.gbps == ASSUMED_CPU_GBPS and "assumed" in assumed.label
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path / "measured"))
    measured = C.measure_ceilings("cpu", force=True)  # as an earlier process would have left it
    cached = copy_bandwidth("cpu")
    assert cached.source == "measured" and cached.gbps == measured.copy_gbps
    for part in (measured.measured_at, platform.node(), str(tmp_path / "measured" / "ceilings.json")):
        assert part in cached.label, cached.label
    # read each time: another cache directory gives its own answer, nothing is kept from the call before
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path / "empty"))
    assert copy_bandwidth("cpu") == assumed
