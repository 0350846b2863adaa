"""benchmarks/bench_decode.py --quick on CPU (every provider's logits checked against a higher-precision
reference within hf-eager's error budget, kernel_pytorch's own int4 row among them; a wrong or failing
provider a row with its reason, the budget and SIGINT honoured), and benchmark.decode's loop timer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark.decode import compiled_frames, time_steps
from kernel_pytorch.benchmark.results import BenchmarkResults
from tests.benchmark.scripts import load_bench


def _bench():  # noqa: ANN202 (the script as a module)
    pytest.importorskip("transformers")
    return load_bench("bench_decode")


def test_time_steps_runs_consecutive_steps_after_reset() -> None:
    calls: list[object] = []
    timing = time_steps(calls.append, steps=3, reps=4, warmup=1, reset=lambda: calls.append("reset"), device="cpu")
    assert timing.reps == 4 and timing.median_ms >= 0 and "3 consecutive steps" in timing.method
    assert calls == ["reset", 0, 1, 2] * 5
    with pytest.raises(ValueError):
        time_steps(calls.append, steps=0, reps=1, device="cpu")


def test_compiled_frames_counts_compiles() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 2 + 1, backend="eager")
    before = compiled_frames()
    f(torch.randn(3))
    f(torch.randn(3))
    assert compiled_frames() - before == 1
    torch._dynamo.reset()


def test_quick_cpu_run(tmp_path: Path) -> None:
    bench = _bench()
    rc = bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--steps", "2", "--reps", "1",
                     "--providers", "hf-eager,hf-compile,ours,ours-nn,ours+int8,ours+int4-kp,bogus"])
    assert rc == 1  # the bogus provider failed; every other row still ran
    results = BenchmarkResults.load(tmp_path / "decode.json")
    assert results.smoke
    status = {(r.provider, r.shape[0]): r.status for r in results.rows}
    assert status[("bogus", 2)] == "error"
    for key in [("hf-eager", 2), ("hf-compile", 2), ("ours", 2), ("ours-nn", 2), ("ours", 1), ("ours+int4-kp", 2),
                ("ours+int4-kp", 1)]:  # our own kernels need no torchao
        assert status[key] == "ok", key
    assert status[("ours+int8", 2)] in ("ok", "not installed") and status[("ours+int8", 1)] == status[("ours+int8", 2)]
    data = json.loads((tmp_path / "decode.json").read_text())
    assert set(data["versions"]) == {"torch", "triton", "transformers", "torchao"}
    checked = [s for s in data["decode"] if s["status"] == "ok" and s["provider"] != "hf-eager"]
    assert checked and all(s["check"]["passed"] and s["check"]["reference"] == "fp64" for s in checked)
    assert all(s["check"]["max_abs_err"] <= s["check"]["allowed"] for s in checked)
    assert all(s["tokens_per_s"] > 0 and s["recompiles"] == 0 for s in checked)
    assert any("logits check: one step against the same model and cache in fp64" in n for n in results.notes)
    md = (tmp_path / "decode.md").read_text()
    assert "## Decode summary" in md and "tok/s" in md and "transformers" in md
    assert "- batch 2: ours " in md and "x hf-compile" in md and "recompiles during the timed steps" in md
    # the quantized rows' accuracy against ours unquantized: measured once, shown in both rows and the table
    accuracy = {(s["provider"], s["batch"]): s.get("accuracy") for s in data["decode"]}
    acc = accuracy[("ours+int4-kp", 2)]
    assert acc is not None and "error" not in acc, acc
    assert accuracy[("ours+int4-kp", 1)] == acc and acc["measured_at_batch"] == 2
    assert 0 <= acc["agreement"] <= 1 and acc["new_tokens"] == bench.QUICK.new_tokens
    assert len(acc["first_divergence"]) == 2 and acc["kl"] > 0 and acc["max_rel_err"] > 0
    assert acc["err_over_rtol"] < 2 and acc["expected_rtol"] == pytest.approx(acc["max_rel_err"] / acc["err_over_rtol"])
    assert acc["stream_tokens"] == 2 * (bench.QUICK.stream - 1) and acc["linear_layers"] > 0
    assert 0.1 < acc["linear_bytes_ratio"] < 0.2  # int4 in groups against fp32 (the CPU run's dtype)
    assert all(accuracy[("ours", b)] is None for b in (1, 2))
    rows = {(r.provider, r.shape[0]): r for r in results.rows}
    assert "greedy agreement" in rows[("ours+int4-kp", 2)].note and "mean KL" in rows[("ours+int4-kp", 1)].note
    assert "measured with its B=2 row" in rows[("ours+int4-kp", 1)].note
    assert "## Quantized accuracy" in md and "| ours+int4-kp | " in md


def test_check_logits_budget_and_quant_rule() -> None:
    bench = _bench()
    hi = torch.linspace(-4, 4, 2 * 64, dtype=torch.float64).reshape(2, 1, 64)
    eager = (hi + 0.01).to(torch.float32)  # eager's own error: 0.01
    ref = bench.Reference(hi, eager)
    floor = torch.finfo(torch.float32).eps * 4
    ok, text, info = bench.check_logits((hi - 0.015).float(), ref, None)  # 1.5 x eager's error: within 2x
    assert ok and "budget" in text and info["allowed"] == pytest.approx(0.02 + floor, rel=1e-4)
    assert info["max_abs_err"] == pytest.approx(0.015, rel=1e-4) and info["vs_eager"] == pytest.approx(0.025, rel=1e-4)
    assert not bench.check_logits((hi + 0.03).float(), ref, None)[0]  # 3x eager's error
    nan = (hi + 0.0).float()
    nan[0, 0, 0] = float("nan")
    assert not bench.check_logits(nan, ref, None)[0]
    # quantized with rtol 0.02: 2 x eager's 0.01 + floor + 2 x 0.02 x max|ref| (4) = 0.18 against the reference
    assert bench.check_logits((hi + 0.17).float(), ref, 0.02)[0]
    ok, text, info = bench.check_logits((hi + 0.19).float(), ref, 0.02)
    assert not ok and "expected_rtol" in text and info["allowed"] == pytest.approx(0.18 + floor, rel=1e-4)
    assert bench.check_logits(eager, None, None)[0]  # no reference: not checked


def test_wrong_provider_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    right = bench.nn_decoder

    def wrong(*args: object, **kwargs: object):  # noqa: ANN202
        dec = right(*args, **kwargs)
        forward = dec.forward
        dec.forward = lambda ids, pos, cpos: forward(ids, pos, cpos) * 1.001  # 0.1% off: far beyond fp32's
        return dec

    monkeypatch.setattr(bench, "nn_decoder", wrong)
    assert bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--steps", "2", "--reps", "1",
                       "--providers", "hf-eager,ours-nn"]) == 1
    data = json.loads((tmp_path / "decode.json").read_text())
    eager, nn_row = data["decode"]
    assert eager["status"] == "ok" and eager["check"]["passed"]
    assert nn_row["status"] == "failed: correctness" and not nn_row["check"]["passed"]
    assert nn_row["check"]["max_abs_err"] > nn_row["check"]["allowed"]
    assert "FAILED" in (tmp_path / "decode.md").read_text()


def test_compiled_decode_does_not_recompile(tmp_path: Path) -> None:
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--backend", "eager", "--steps", "2",
                       "--providers", "hf-eager,ours-nn"]) == 0
    nn_row = json.loads((tmp_path / "decode.json").read_text())["decode"][1]
    assert nn_row["provider"] == "ours-nn" and nn_row["frames_compiled_warmup"] == 1 and nn_row["recompiles"] == 0
    assert nn_row["check"]["passed"]


def test_budget_and_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--budget-s", "0",
                       "--providers", "hf-eager,ours"]) == 0
    results = BenchmarkResults.load(tmp_path / "decode.json")
    assert {r.status for r in results.rows} == {"skipped"}
    assert any("time budget" in n for n in results.notes)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "measure", interrupted)
    assert bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--providers", "hf-eager"]) == 130
    assert BenchmarkResults.load(tmp_path / "decode.json").partial
