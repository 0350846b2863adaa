"""The results schema: JSON round trip, markdown rendering and the speedup column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.results import SCHEMA_VERSION, SMOKE_HEADING, BenchmarkResults, Row
from kernel_pytorch.benchmark.timer import Timing


def _results() -> BenchmarkResults:
    ceil = Ceilings(device="dev", copy_gbps=3000.0, copy_bytes=2**30, matmul_tflops=700.0,
                    matmul_shape=(8192, 8192, 8192), matmul_dtype="bfloat16", torch_version="2.x",
                    measured_at="2026-01-01T00:00:00+00:00")
    r = BenchmarkResults(name="unit", device="dev", ceilings=ceil)
    for provider, ms in (("eager", 2.0), ("ours", 0.5)):
        row = Row(op="rms_norm", shape=[16384, 4096], config="Llama-3-8B", dtype="bfloat16",
                  provider=provider, pass_name="fwd", bytes=2 * 16384 * 4096 * 2)
        row.set_timing(Timing(ms, ms * 0.9, ms * 1.1, ms * 0.8, ms * 1.2, 50, "cuda events"))
        row.gbps = row.bytes / (ms * 1e-3) / 1e9
        r.add(row)
    r.add(Row(op="rms_norm", shape=[16384, 4096], config="Llama-3-8B", dtype="bfloat16", provider="liger",
              pass_name="fwd", status="not installed"))
    r.notes.append("a note")
    return r


def test_json_round_trip(tmp_path: Path) -> None:
    r = _results()
    path = r.save(tmp_path / "sub" / "unit.json")
    back = BenchmarkResults.load(path)
    assert back == r
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA_VERSION
    assert {"device", "torch", "triton", "date", "ceilings", "rows"} <= set(raw)
    assert raw["rows"][0]["pass"] == "fwd" and "pass_name" not in raw["rows"][0]
    raw["schema"] = SCHEMA_VERSION + 1
    with pytest.raises(ValueError, match="schema"):
        BenchmarkResults.from_dict(raw)


def test_speedup_and_markdown(tmp_path: Path) -> None:
    r = _results()
    ours = r.find(provider="ours")[0]
    assert r.speedup_vs(ours) == pytest.approx(4.0)
    assert r.speedup_vs(r.find(provider="liger")[0]) is None
    md = r.to_markdown()
    assert "## rms_norm" in md and "| shape |" in md
    line = next(x for x in md.splitlines() if "| ours |" in x)
    assert "4.00x" in line and "0.5" in line
    assert "not installed" in md and "copy 3000 GB/s" in md
    js, mdp = r.write(tmp_path)
    assert js.name == "unit.json" and mdp.read_text().startswith("# unit")


def test_smoke_runs_are_labelled(tmp_path: Path) -> None:
    r = _results()
    assert not r.smoke and "Smoke run" not in r.to_markdown()
    r.smoke = True
    js, md = r.write(tmp_path)
    assert json.loads(js.read_text())["smoke"] is True and BenchmarkResults.load(js) == r
    assert md.read_text().splitlines()[2] == SMOKE_HEADING and "not speedups" in SMOKE_HEADING
    older = json.loads(js.read_text())
    del older["smoke"]  # files written before the flag read as full runs
    assert not BenchmarkResults.from_dict(older).smoke
