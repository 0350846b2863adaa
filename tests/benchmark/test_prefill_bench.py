"""benchmarks/bench_prefill.py --quick on CPU: the floor rows, every provider's last-position logits checked
against a higher-precision reference, a failing or wrong provider a row with its reason, the paired rows, the
budget and SIGINT honoured; and the floor's GEMM shapes and FLOPs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark.results import BenchmarkResults
from tests.benchmark.scripts import load_bench


def _bench():  # noqa: ANN202 (the script as a module)
    pytest.importorskip("transformers")
    return load_bench("bench_prefill")


def _run(bench, tmp_path: Path, *args: str) -> tuple[int, dict, BenchmarkResults]:  # noqa: ANN001
    rc = bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), *args])
    path = tmp_path / "prefill_cpu.json"
    return rc, json.loads(path.read_text()), BenchmarkResults.load(path)


def test_gemm_shapes_and_flops() -> None:
    bench = _bench()
    import prefill_floor  # on the path once the script is loaded

    size = bench.Size()  # the benchmark's config
    shapes = prefill_floor.gemm_shapes(size)
    assert len(shapes) == 7 * 8 + 1 and shapes[-1] == ("lm_head", 1, 128256, 2048)
    assert shapes[:7] == [("q", 4096, 2048, 2048), ("k", 4096, 1024, 2048), ("v", 4096, 1024, 2048),
                          ("o", 4096, 2048, 2048), ("gate", 4096, 5632, 2048), ("up", 4096, 5632, 2048),
                          ("down", 4096, 2048, 5632)]
    per_layer = 2 * 4096 * 2048 * (2048 + 1024 + 1024 + 2048 + 3 * 5632)
    assert bench.gemm_flops(size) == 8 * per_layer + 2 * 2048 * 128256
    assert bench.attention_flops(size) == 8 * 16 * 2 * 4096 * 4096 * 128


def test_quick_cpu_run(tmp_path: Path) -> None:
    bench = _bench()
    providers = "gemm-floor,gemm+sdpa-floor,hf-eager,hf-compile,ours,bogus"
    rc, data, results = _run(bench, tmp_path, "--providers", providers, "--paired", "hf-eager,ours")
    assert rc == 1  # the bogus provider failed; every other row still ran
    assert results.smoke and results.name == "prefill"
    rows = {(r.provider, r.pass_name): r for r in results.rows}
    status = {p: next(r.status for r in results.rows if r.provider == p) for p in
              ("gemm-floor", "gemm+sdpa-floor", "hf-eager", "hf-compile", "ours", "bogus")}
    assert status.pop("bogus") == "error" and set(status.values()) == {"ok"}
    assert "unknown provider 'bogus'" in rows[("bogus", "prefill (eager)")].note
    assert rows[("gemm-floor", "GEMMs alone (floor)")].flops == bench.gemm_flops(bench.QUICK)
    assert rows[("gemm+sdpa-floor", "GEMMs + causal SDPA (floor)")].ok
    summary = {s["provider"]: s for s in data["prefill"]}
    floor = summary["gemm-floor"]["ms"]
    for p in ("hf-eager", "hf-compile", "ours"):
        s = summary[p]
        c = s["check"]
        assert c["passed"] and c["reference"] == "fp64" and 0 < c["max_abs_err"] <= c["allowed"], (p, c)
        assert s["tokens_per_s"] == pytest.approx(bench.QUICK.tokens / (s["ms"] / 1e3))
        assert s["pct_of_gemm_floor"] == pytest.approx(100 * floor / s["ms"])
        assert s["pct_of_gemm_sdpa_floor"] == pytest.approx(100 * summary["gemm+sdpa-floor"]["ms"] / s["ms"])
        assert s["recompiles"] == 0
        assert s["gemm_tflops"] > 0 and s["graph_ms"] is None and s["graph_note"] == "CUDA-graph replay: CUDA only"
        assert "CUDA-graph replay: CUDA only" in rows[(p, "prefill (eager)")].note
    assert "check" not in summary["gemm-floor"]  # GEMMs alone have no logits
    paired = [r for r in results.rows if r.pass_name.endswith("(paired)")]
    assert {r.provider for r in paired} == {"hf-eager", "ours"} and all(r.ok and r.median_ms > 0 for r in paired)
    assert any("logits check: the last position's logits" in n for n in results.notes)
    assert set(data["versions"]) == {"torch", "triton", "transformers", "torchao"}
    md = (tmp_path / "prefill_cpu.md").read_text()
    assert "## Prefill summary" in md and "x the GEMM floor" in md and "x hf-compile" in md and "## Paired" in md
    assert "| gemm+sdpa-floor |" in md and "target (at least as fast as hf-compile" in md


def test_wrong_provider_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    right = bench.hf_prefill

    def wrong(provider: str, *args: object):  # noqa: ANN202
        pre = right(provider, *args)
        if provider == "ours":
            run = pre.run
            pre.run = lambda: run() * 1.001  # 0.1% off: far beyond fp32's error
        return pre

    monkeypatch.setattr(bench, "hf_prefill", wrong)
    rc, data, results = _run(bench, tmp_path, "--providers", "hf-eager,ours")
    assert rc == 1
    eager, ours = data["prefill"]
    assert eager["status"] == "ok" and eager["check"]["passed"]
    assert ours["status"] == "failed: correctness" and not ours["check"]["passed"]
    assert ours["check"]["max_abs_err"] > ours["check"]["allowed"]
    assert "FAILED" in (tmp_path / "prefill_cpu.md").read_text()


def test_compiled_provider_and_budget_and_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    torch._dynamo.reset()
    rc, data, _ = _run(bench, tmp_path, "--providers", "hf-eager,hf-compile", "--backend", "eager")
    assert rc == 0 and data["prefill"][1]["check"]["passed"] and data["prefill"][1]["recompiles"] == 0
    assert any(r.pass_name == "prefill (compiled, backend eager)" for r in BenchmarkResults.load(
        tmp_path / "prefill_cpu.json").rows)
    rc, _, results = _run(bench, tmp_path, "--budget-s", "0", "--providers", "gemm-floor,hf-eager")
    assert rc == 0 and {r.status for r in results.rows} == {"skipped"}

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "measure", interrupted)
    rc, _, results = _run(bench, tmp_path, "--providers", "gemm-floor")
    assert rc == 130 and results.partial
