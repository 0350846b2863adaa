"""`kernel-pytorch bench`: runs on a CPU-only machine, writes JSON, markdown and PNGs; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.results import BenchmarkResults
from kernel_pytorch.cli.main import main


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path / "cache"))


def test_quick_cpu_bench_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "results"
    assert main(["bench", "norms", "--out", str(out), "--quick", "--providers", "ours,eager"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"norms.json", "norms.md", "norms_rms_norm.png", "norms_layer_norm.png", "norms_add_rms_norm.png",
            "norms_roofline.png"} <= names
    r = BenchmarkResults.load(out / "norms.json")
    assert r.ceilings is not None and r.ceilings.source == "measured"
    assert r.device.startswith("cpu") and {row.provider for row in r.rows} == {"ours", "eager"}
    assert json.loads((out / "norms.json").read_text())["rows"]
    printed = capsys.readouterr().out
    assert "norms:" in printed and "wrote" in printed


def test_list_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--list"]) == 0
    assert "norms" in capsys.readouterr().out.split()
    assert main(["bench", "nope", "--out", str(tmp_path)]) == 2
    assert main(["bench", "norms", "--out", str(tmp_path), "--providers", "bogus", "--quick"]) == 2
    assert not (tmp_path / "norms.json").exists()
