"""benchmarks/bench_prefill.py on the CPU: the pipeline (floors, providers, the logits check, failure rows,
the summary) at the tiny config, eager."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.results import BenchmarkResults

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_prefill.py"


def _bench():  # noqa: ANN202 (the script as a module)
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_prefill", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gemm_and_attention_flops_count_every_projection() -> None:
    bench = _bench()
    s = bench.QUICK  # hidden 64, intermediate 128, 2 layers, 4/2 heads of 16, vocab 256
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 64 * 128 + 64 * 128 + 128 * 64
    assert bench.gemm_flops(s, 10) == 2 * (10 * per_layer * 2 + 64 * 256)
    assert bench.attention_flops(s, 4) == 2 * 2 * 4 * 16 * (4 + 3 + 2 + 1) * 2


def test_quick_cpu_run(tmp_path: Path) -> None:
    bench = _bench()
    rc = bench.main(["--quick", "--device", "cpu", "--no-compile", "--out", str(tmp_path), "--tokens", "32",
                     "--providers", "hf-eager,ours,bogus,gemm-floor,hf-compile,gemm+attention-floor"])
    assert rc == 1  # the bogus provider failed; every other row still ran
    results = BenchmarkResults.load(tmp_path / "prefill.json")
    rows = {(r.provider, r.pass_name): r for r in results.rows}
    timed = {p: rows[(p, "prefill (wall clock per call)")] for p in bench.PROVIDERS}
    assert all(r.status == "ok" and r.median_ms > 0 and r.shape == [1, 32] for r in timed.values())
    assert rows[("bogus", "prefill (wall clock per call)")].status == "error"
    assert all(rows[(p, "prefill (CUDA-graph replay)")].status == "skipped" for p in bench.PROVIDERS)
    # the floors ran first, so every provider's row says how far it is from both
    assert [r.provider for r in results.rows][:4] == ["gemm-floor"] * 2 + ["gemm+attention-floor"] * 2
    assert "gemm-floor" in timed["ours"].note and "gemm+attention-floor" in timed["hf-eager"].note
    data = json.loads((tmp_path / "prefill.json").read_text())
    checked = [s for s in data["prefill"] if "check" in s]
    assert {s["provider"] for s in checked} == {"hf-eager", "hf-compile", "ours"}
    assert all(s["check"]["passed"] and s["check"]["reference"] == "fp64" for s in checked)
    md = (tmp_path / "prefill.md").read_text()
    assert "## Prefill summary" in md and "ours: " in md and "of the GEMM floor" in md


def test_wrong_logits_fail_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    right = bench.hf_prefill

    def wrong(provider: str, *args: object):  # noqa: ANN202
        p = right(provider, *args)
        if provider == "ours":
            call = p.call
            p.call = lambda: call() * 1.001  # 0.1% off: far beyond fp32's error
        return p

    monkeypatch.setattr(bench, "hf_prefill", wrong)
    assert bench.main(["--quick", "--device", "cpu", "--no-compile", "--out", str(tmp_path), "--tokens", "16",
                       "--providers", "hf-eager,ours"]) == 1
    data = json.loads((tmp_path / "prefill.json").read_text())
    eager, ours = data["prefill"]
    assert eager["check"]["passed"] and not ours["check"]["passed"]
    statuses = {r["provider"]: r["status"] for r in data["rows"] if r["pass"].endswith("per call)")}
    assert statuses == {"hf-eager": "ok", "ours": "failed: correctness"}


def test_tokens_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        _bench().main(["--quick", "--device", "cpu", "--tokens", "0"])
