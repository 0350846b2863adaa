"""benchmarks/bench_e2e.py --quick on CPU: every row kind is written to e2e.{json,md}, a failing or
missing provider becomes a row with its reason, and the time budget skips rows rather than overrunning."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.results import BenchmarkResults

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_e2e.py"


def _bench():  # noqa: ANN202 (the script as a module)
    spec = importlib.util.spec_from_file_location("bench_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_cpu_run(tmp_path: Path) -> None:
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--providers", "eager,ours,liger,bogus", "--no-long",
                       "--steps", "1", "--profile", "ours", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    assert results.smoke and (tmp_path / "e2e.md").is_file()
    status = {(r.op.split()[0], r.provider): r.status for r in results.rows}
    assert status[("train", "eager")] == status[("train", "ours")] == "ok"
    assert status[("train", "bogus")] == "error"  # one failure, the other rows still run
    assert status[("train", "liger")] in ("not installed", "ok")
    assert status[("generate", "ours")] == status[("generate", "hf static cache + compile")] == "ok"
    ours = results.find(provider="ours", pass_name="fwd+bwd+adamw")[0]
    assert "tok/s" in ours.note and ours.pct_of_matmul is not None and ours.peak_mem_bytes
    assert "Self CPU" in (tmp_path / "e2e_profile_ours.txt").read_text()


def test_time_budget_skips_rows(tmp_path: Path) -> None:
    bench = _bench()
    bench.main(["--quick", "--device", "cpu", "--providers", "eager", "--budget-s", "0", "--out", str(tmp_path)])
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    assert {r.status for r in results.rows} == {"skipped"}
    assert any("time budget" in n for n in results.notes)


def test_idle_summary_merges_overlaps_and_names_the_gaps() -> None:
    """Kernels at 0-10, 5-20 (overlapping), 50-60, 61-70: a span of 70 us, 39 us busy, 31 us idle in a
    30 us gap after the second kernel and a 1 us one."""
    bench = _bench()
    text = bench.idle_summary([(50.0, 60.0, "c"), (0.0, 10.0, "a"), (5.0, 20.0, "b"), (61.0, 70.0, "d")])
    first = text.splitlines()[0]
    assert "span 0.07 ms" in first and "kernels running 0.04 ms" in first and "idle 0.03 ms" in first
    assert "2 gaps" in first and "0.03 ms in gaps of 20 us or more" in first
    assert text.splitlines()[2].split() == ["30.0", "b", "->", "c"]
    assert "no kernels" in bench.idle_summary([])


def test_host_phases_times_each_phase_and_the_back_to_back_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase's host time is measured around that phase alone: a forward that takes 20 ms reads
    20 ms and the optimizer's 4 ms do not leak into it; the back-to-back line counts whole steps. The
    phases advance a fake clock, so the readings are exact whatever else the machine is doing."""
    import types

    import torch

    bench = _bench()
    now = [0.0]
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = {"fwd": 0, "upd": 0}
    x = torch.ones(3, requires_grad=True)

    def forward() -> torch.Tensor:
        calls["fwd"] += 1
        now[0] += 0.020
        return (x * 2).sum()

    def update() -> None:
        calls["upd"] += 1
        now[0] += 0.004

    def step() -> torch.Tensor:
        loss = forward()
        loss.backward()
        update()
        return loss.detach()

    text = bench.host_phases(forward, update, step, torch.device("cpu"), reps=3)
    assert text.splitlines() == [
        "host per synchronised step (median of 3, ms): issuing forward 20.00, backward 0.00, optimizer 4.00; "
        "then waiting for the device 0.00; step 24.00",
        "3 steps back to back, one sync at the end: 24.00 ms per step",
    ]
    assert calls == {"fwd": 6, "upd": 6}


def test_ours_compile_takes_the_recommended_inductor_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """ours+compile compiles with optimize's INDUCTOR_OPTIONS; ours+compile-reuse and torch.compile with
    Inductor's defaults (torch.compile recorded, not run)."""
    import torch

    from kernel_pytorch.optimize import INDUCTOR_OPTIONS

    bench = _bench()
    calls: list[dict] = []

    def record(model: torch.nn.Module, **kwargs: object) -> torch.nn.Module:
        calls.append(kwargs)
        return model

    monkeypatch.setattr(bench, "hf_model", lambda size, dev, dtype: torch.nn.Linear(2, 2))
    monkeypatch.setattr(bench, "ours", lambda model, size, dev: model)
    monkeypatch.setattr(torch, "compile", record)
    size, dev = bench.Size(), torch.device("cpu")
    for provider in ("ours+compile", "ours+compile-reuse", "torch.compile"):
        bench.build(provider, size, dev, torch.float32)
    assert calls == [{"options": INDUCTOR_OPTIONS}, {}, {}]


def test_provider_suffixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """'+adamw' picks our optimizer; '+nocache', '+inorm' and '+opnorm' leave the model's provider as it is, and
    the norm suffixes set the optimized model's RMSNorms (reference math everywhere, or our op under compile)."""
    import torch

    import kernel_pytorch as kp

    bench = _bench()
    assert bench.optimizer_of("ours+compile+adamw+opnorm") == ("ours+compile", True)
    assert bench.optimizer_of("torch.compile+nocache") == ("torch.compile", False)
    assert bench.optimizer_of("ours+compile+adamw+inorm") == ("ours+compile", True)
    monkeypatch.setattr(bench, "hf_model", lambda size, dev, dtype: torch.nn.Sequential(kp.nn.RMSNorm(4)))
    monkeypatch.setattr(bench, "ours", lambda model, size, dev: model)
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    size, dev = bench.Size(), torch.device("cpu")
    default = bench.build("ours+compile+adamw", size, dev, torch.float32)[0]
    assert (default.backend, default.compiled_norm) == ("auto", "inductor")
    inorm = bench.build("ours+compile+adamw+inorm", size, dev, torch.float32)[0]
    opnorm = bench.build("ours+compile+opnorm", size, dev, torch.float32)[0]
    assert inorm.backend == "reference" and (opnorm.backend, opnorm.compiled_norm) == ("auto", "op")


def test_two_pass_suffix_turns_the_one_read_kernel_off_for_its_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """'+twopass' is dropped from the model's provider and runs its row with the fused loss's one-read
    kernel off (and on again after); other rows keep it on."""
    import torch

    from kernel_pytorch.ops import tuning

    def one_read() -> bool:
        return tuning.current("fused_linear_cross_entropy").one_read

    bench = _bench()
    assert bench.optimizer_of("ours+compile+adamw+twopass") == ("ours+compile", True)
    seen = []
    monkeypatch.setattr(bench, "_train_row", lambda provider, *args: seen.append((provider, one_read())))
    for provider in ("ours+compile+adamw+twopass", "ours+compile+adamw"):
        bench.train_row(provider, bench.Size(), torch.device("cpu"), torch.float32, 1, 8, 1, 1, None)
        assert one_read()
    assert seen == [("ours+compile+adamw+twopass", False), ("ours+compile+adamw", True)]


def test_paired_providers_step_in_turns(tmp_path: Path) -> None:
    """--paired: two providers in one process, a row each with the pooled steps, and the ratio note; Liger and
    a third provider are refused."""
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--providers", "", "--no-long", "--no-inference",
                       "--paired", "eager,ours", "--paired-rounds", "2x1", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    rows = {r.provider: r for r in results.rows if r.op.startswith("paired train step")}
    assert set(rows) == {"eager", "ours"} and all(r.status == "ok" and r.reps == 2 for r in rows.values())
    assert "in turns with ours, 2 rounds of 1 steps" in rows["eager"].note
    assert any(n.startswith("paired (eager and ours in one process, in turns): ours ") for n in results.notes)
    with pytest.raises(ValueError, match="two providers"):
        bench.main(["--quick", "--device", "cpu", "--paired", "eager,ours,liger", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="cannot be paired"):
        bench.paired_rows(("eager", "liger"), bench.QUICK, bench.resolve_device("cpu"), None, 1, 1, 0, None)


def test_generate_rows_and_reference_backends() -> None:
    """--generate-providers picks rows, an 'ours' one may end in ' + inorm' or ' + ref', anything else is an
    error naming the known rows; reference_backends sets every module that has a backend, or those of kinds."""
    import argparse

    import torch

    import kernel_pytorch as kp

    bench = _bench()
    args = argparse.Namespace(generate_providers=None, static_generate_only=True)
    assert bench.generate_rows(args) == bench.GENERATE_PROVIDERS[1:]
    args.generate_providers = "ours + static cache + compile + ref, hf static cache + compile"
    assert bench.generate_rows(args) == ("ours + static cache + compile + ref", "hf static cache + compile")
    args.generate_providers = "hf static cache + compile + ref"
    with pytest.raises(ValueError, match="unknown generate provider"):
        bench.generate_rows(args)
    model = torch.nn.Sequential(kp.nn.RMSNorm(4), kp.nn.GatedMLP(4, 8), torch.nn.Linear(4, 4))
    assert bench.reference_backends(model, (kp.nn.RMSNorm,)) == 1 and model[1].backend == "auto"
    assert bench.reference_backends(model) == 2 and model[1].backend == "reference"


def test_target_check_on_the_committed_run() -> None:
    """The target note from benchmarks/results/probes/e2e/adamw_h200.json (H200, 2026-11-29, six providers in one
    run): each ours row's tokens/s over torch.compile's and peak over Liger's; then the same rows made to pass,
    and a run without Liger, which is not judged."""
    import dataclasses

    bench = _bench()
    results = BenchmarkResults.load(SCRIPT.parent / "results" / "probes" / "e2e" / "adamw_h200.json")
    op = "train step 4x2048"
    notes = bench.target_check(results, op)
    assert len(notes) == 4 and all(n.endswith(": not met") for n in notes)
    assert any("ours+compile+adamw 1.169x and 0.917x" in n for n in notes)
    assert any("ours+adamw 1.111x and 0.896x" in n for n in notes)
    ours = results.find(provider="ours+adamw", op=op)[0]
    fast = dataclasses.replace(ours, provider="ours-fast", median_ms=ours.median_ms * 0.9)
    results.rows.append(fast)
    assert bench.target_check(results, op)[-1].endswith("ours-fast 1.235x and 0.896x: met")
    results.rows[:] = [r for r in results.rows if r.provider != "liger"]
    assert all("not judged" in n for n in bench.target_check(results, op))
