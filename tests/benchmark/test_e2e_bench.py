"""benchmarks/bench_e2e.py --quick on CPU: every row kind is written to e2e.{json,md}, a failing or
missing provider becomes a row with its reason, and the time budget skips rows rather than overrunning;
the provider syntax (benchmarks/e2e/providers.py): every variant parses and maps onto its config, and a
misspelt or replaced name is an error naming the right one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark.results import BenchmarkResults
from tests.benchmark.scripts import load_bench

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_e2e.py"
sys.path.insert(0, str(SCRIPT.parent))  # the e2e helpers, as the script imports them

from e2e import models, profiling, providers  # noqa: E402
from e2e.providers import VARIANTS, Provider, Variant, parse  # noqa: E402


def _bench():  # noqa: ANN202 (the script as a module)
    return load_bench("bench_e2e")


def test_quick_cpu_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    real_build = bench.build

    def build(provider: Provider, *args: object) -> object:
        if provider.label == "eager+no_cache":
            raise RuntimeError("a failing provider")
        return real_build(provider, *args)

    monkeypatch.setattr(bench, "build", build)
    trained = "eager,ours,liger,eager+no_cache,ours+two_pass_ce+adamw"
    assert bench.main(["--quick", "--device", "cpu", "--providers", trained, "--no-long", "--steps", "1",
                       "--profile", "ours", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    assert results.smoke and (tmp_path / "e2e.md").is_file()
    status = {(r.op.split()[0], r.provider): r.status for r in results.rows}
    assert status[("train", "eager")] == status[("train", "ours")] == "ok"
    assert status[("train", "eager+no_cache")] == "error"  # one failure, the other rows still run
    assert status[("train", "ours+adamw+two_pass_ce")] == "ok"  # labelled with the variants in the table's order
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
    text = profiling.idle_summary([(50.0, 60.0, "c"), (0.0, 10.0, "a"), (5.0, 20.0, "b"), (61.0, 70.0, "d")])
    first = text.splitlines()[0]
    assert "span 0.07 ms" in first and "kernels running 0.04 ms" in first and "idle 0.03 ms" in first
    assert "2 gaps" in first and "0.03 ms in gaps of 20 us or more" in first
    assert text.splitlines()[2].split() == ["30.0", "b", "->", "c"]
    assert "no kernels" in profiling.idle_summary([])


def test_host_phases_times_each_phase_and_the_back_to_back_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase's host time is measured around that phase alone: a forward that takes 20 ms reads
    20 ms and the optimizer's 4 ms do not leak into it; the back-to-back line counts whole steps. The
    phases advance a fake clock, so the readings are exact whatever else the machine is doing."""
    import types

    import torch

    now = [0.0]
    monkeypatch.setattr(profiling, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
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

    text = profiling.host_phases(forward, update, step, torch.device("cpu"), reps=3)
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

    calls: list[dict] = []

    def record(model: torch.nn.Module, **kwargs: object) -> torch.nn.Module:
        calls.append(kwargs)
        return model

    monkeypatch.setattr(models, "hf_model", lambda size, dev, dtype: torch.nn.Linear(2, 2))
    monkeypatch.setattr(models, "ours", lambda model, size, dev: model)
    monkeypatch.setattr(torch, "compile", record)
    size, dev = models.Size(), torch.device("cpu")
    for provider in ("ours+compile", "ours+compile-reuse", "torch.compile"):
        models.build(provider, size, dev, torch.float32)
    assert calls == [{"options": INDUCTOR_OPTIONS}, {}, {}]


# every named variant, the Variant it makes, and a base it applies to
VARIANT_FIELDS = {
    "adamw": ("torch.compile", Variant(optimizer="kernel_pytorch")),
    "no_cache": ("torch.compile", Variant(use_cache=False)),
    "reference_norms": ("ours+compile", Variant(norms="reference")),
    "op_norms": ("ours+compile", Variant(norms="op")),
    "reference": ("ours", Variant(reference=True)),
    "two_pass_ce": ("ours+compile", Variant(ce_kernel="two_pass")),
    "packed": ("torch.compile", Variant(packed=True)),
    "fsdp2": ("torch.compile", Variant(shard="fsdp2")),
    "tp": ("ours+compile", Variant(shard="tp")),
}


def test_every_variant_parses_to_its_fields_and_label() -> None:
    """Each named variant sets its fields of `Variant`; the label is the base and the variants in the table's
    order whatever order they were written in, and parses back to the same provider; no variant name is also
    a piece of a base's name."""
    assert set(VARIANT_FIELDS) == {v.name for v in VARIANTS}
    for name, (base, variant) in VARIANT_FIELDS.items():
        provider = parse(f"{base}+{name}")
        assert provider == Provider(base, (name,)) and provider.variant == variant
        assert parse(provider.label) == provider
    both = parse("ours+compile+two_pass_ce+adamw")
    assert both.label == "ours+compile+adamw+two_pass_ce" and both.base == "ours+compile"
    assert both.variant == Variant(optimizer="kernel_pytorch", ce_kernel="two_pass")
    assert parse("ours+compile+adamw").label == "ours+compile+adamw"  # the committed results' label
    assert parse("ours+compile-reuse+adamw").base == "ours+compile-reuse"
    assert parse("ours + static cache + compile+reference", "generate").base == "ours + static cache + compile"
    pieces = {piece for base in providers.TRAIN_BASES for piece in base.replace("-", "+").split("+")}
    assert not pieces & set(VARIANT_FIELDS)
    help_text = providers.describe()
    assert all(name in help_text for name in (*VARIANT_FIELDS, *providers.TRAIN_BASES, *providers.GENERATE_BASES))


def test_the_docs_table_lists_every_variant() -> None:
    """docs/benchmarks.md's variant table has one row per named variant, with the Variant field it sets."""
    import re

    doc = (SCRIPT.parents[1] / "docs" / "benchmarks.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| [^|]+ \| `([^`]+)` \|", doc, re.M))
    assert rows == {v.name: ", ".join(f"{k}={val!r}".replace("'", '"') for k, val in v.fields) for v in VARIANTS}


@pytest.mark.parametrize(("text", "kind", "match"), [
    ("bogus", "train", "unknown training provider 'bogus'"),
    ("ours+compile+fast", "train", "unknown variant 'fast'"),
    ("ours+compile+twopass", "train",
     r"'\+twopass' is the former name of '\+two_pass_ce': 'ours\+compile\+two_pass_ce'"),
    ("ours+compile+adamw+inorm", "train", r"'ours\+compile\+adamw\+reference_norms'"),
    ("ours+compile+opnorm", "train", r"'\+op_norms'"),
    ("torch.compile+nocache", "train", r"'\+no_cache'"),
    ("ours + static cache + compile + ref", "generate", r"former name of '\+reference' \(no spaces\)"),
    ("ours + static cache + compile + inorm", "generate", r"'\+reference_norms'"),
    ("ours+compile + adamw", "train", r"write '\+adamw' \(no spaces\)"),
    ("torch.compile+two_pass_ce", "train", "not optimized"),
    ("hf static cache + compile+reference", "generate", "not optimized"),
    ("ours+adamw", "generate", "applies to train rows only"),
    ("ours+compile+reference_norms+op_norms", "train", "set the same field"),
    ("ours+compile+adamw+adamw", "train", "'adamw' is given twice"),
    ("ours+compile+reference+op_norms", "train", "contradicts"),
])
def test_bad_providers_are_errors_naming_the_right_spelling(text: str, kind: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse(text, kind)


def test_bad_provider_stops_the_run_before_any_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A provider that does not parse is a usage error (exit status 2) naming the new spelling; no row runs."""
    bench = _bench()
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--quick", "--device", "cpu", "--providers", "eager,ours+twopass", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "'ours+two_pass_ce'" in capsys.readouterr().err
    assert not (tmp_path / "e2e.json").exists()


def test_variants_map_onto_the_tuning_configs() -> None:
    """`two_pass_ce` turns the fused loss's one-read kernel off while its `tuning()` block runs, and on again
    after; the other variants leave every kernel config as it is."""
    from kernel_pytorch.ops import tuning

    before = tuning.families()
    assert parse("ours+compile+two_pass_ce").variant.tuning_changes() == {
        "fused_linear_cross_entropy": {"one_read": False}}
    with parse("ours+compile+two_pass_ce").variant.tuning():
        assert tuning.current("fused_linear_cross_entropy").one_read is False
        assert tuning.current("cross_entropy") == before["cross_entropy"]
    assert tuning.families() == before
    for name, (base, _) in VARIANT_FIELDS.items():
        if name != "two_pass_ce":
            variant = parse(f"{base}+{name}").variant
            assert variant.tuning_changes() == {}
            with variant.tuning():
                assert tuning.families() == before


def test_variants_set_the_models_modules_call_and_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`adamw` picks our optimizer, `no_cache` passes use_cache=False to every call, the norm variants set the
    optimized model's RMSNorms (reference math everywhere, or our op under compile), `reference` every module
    with a backend; a base's model is built the same with or without them."""
    import torch

    import kernel_pytorch as kp

    monkeypatch.setattr(models, "hf_model", lambda size, dev, dtype: torch.nn.Sequential(
        kp.nn.RMSNorm(4), kp.nn.GatedMLP(4, 8)))
    monkeypatch.setattr(models, "ours", lambda model, size, dev: model)
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    size, dev = models.Size(), torch.device("cpu")
    default = models.build("ours+compile+adamw", size, dev, torch.float32)
    assert (default[0].backend, default[0].compiled_norm, default[1].backend) == ("auto", "inductor", "auto")
    inorm = models.build("ours+compile+adamw+reference_norms", size, dev, torch.float32)
    opnorm = models.build("ours+compile+op_norms", size, dev, torch.float32)
    ref = models.build("ours+reference", size, dev, torch.float32)
    assert (inorm[0].backend, inorm[1].backend) == ("reference", "auto")
    assert (opnorm[0].backend, opnorm[0].compiled_norm) == ("auto", "op")
    assert (ref[0].backend, ref[1].backend) == ("reference", "reference")
    assert isinstance(models.make_optimizer("ours+adamw", default, dev), kp.optim.AdamW)
    assert type(models.make_optimizer("ours", default, dev)) is torch.optim.AdamW
    assert parse("torch.compile+no_cache").variant.call_kwargs() == {"use_cache": False}
    assert parse("torch.compile+adamw").variant.call_kwargs() == {}


def test_train_row_runs_under_its_providers_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `two_pass_ce` row runs with the fused loss's one-read kernel off (and on again after); other rows
    keep it on."""
    import torch

    from kernel_pytorch.ops import tuning

    def one_read() -> bool:
        return tuning.current("fused_linear_cross_entropy").one_read

    bench = _bench()
    seen = []
    monkeypatch.setattr(bench, "_train_row", lambda provider, *args: seen.append((provider.label, one_read())))
    for text in ("ours+compile+adamw+two_pass_ce", "ours+compile+adamw"):
        bench.train_row(parse(text), models.Size(), torch.device("cpu"), torch.float32, 1, 8, 1, 1, None)
        assert one_read()
    assert seen == [("ours+compile+adamw+two_pass_ce", False), ("ours+compile+adamw", True)]


def test_paired_providers_step_in_turns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--device", "cpu", "--paired", "eager,ours,liger", "--out", str(tmp_path)])
    assert "--paired takes two providers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="cannot be paired"):
        bench.paired_rows((parse("eager"), parse("liger")), models.QUICK, bench.resolve_device("cpu"), None, 1, 1, 0,
                          None)


def test_generate_rows_and_reference_backends() -> None:
    """--generate-providers picks rows, an 'ours' one may take +reference_norms or +reference, anything else is
    an error naming the known rows; reference_backends sets every module that has a backend, or those of kinds."""
    import argparse

    import torch

    import kernel_pytorch as kp

    bench = _bench()
    args = argparse.Namespace(generate_providers=None, static_generate_only=True)
    assert [p.label for p in bench.generate_rows(args)] == list(providers.GENERATE_PROVIDERS[1:])
    args.generate_providers = "ours + static cache + compile+reference, hf static cache + compile"
    assert [p.label for p in bench.generate_rows(args)] == ["ours + static cache + compile+reference",
                                                            "hf static cache + compile"]
    args.generate_providers = "hf static cache"
    with pytest.raises(ValueError, match="unknown generate provider"):
        bench.generate_rows(args)
    model = torch.nn.Sequential(kp.nn.RMSNorm(4), kp.nn.GatedMLP(4, 8), torch.nn.Linear(4, 4))
    assert providers.reference_backends(model, (kp.nn.RMSNorm,)) == 1 and model[1].backend == "auto"
    assert providers.reference_backends(model) == 2 and model[1].backend == "reference"


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


def test_fsdp2_rows_in_a_world_of_one(tmp_path: Path) -> None:
    """+fsdp2 without a launcher: FSDP2's recipe in a world of one process (the process group made and left
    by the run), the rows judged against the baselines sharded alike."""
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--providers", "eager+fsdp2,ours+fsdp2", "--no-long",
                       "--no-inference", "--steps", "1", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    assert {r.provider: r.status for r in results.rows} == {"eager+fsdp2": "ok", "ours+fsdp2": "ok"}
    assert any("FSDP2 over a world of 1 process" in n for n in results.notes)
    assert any("torch.compile+fsdp2's tokens/s" in n for n in results.notes)
    assert not torch.distributed.is_initialized()


def test_tp_rows_in_a_world_of_one(tmp_path: Path) -> None:
    """+tp without a launcher: the tensor-parallel plan over a world of one process, our styles on the
    optimized model and torch's on the plain one, the rows judged against the baselines sharded alike; Liger
    has no tensor-parallel path (its row says so)."""
    bench = _bench()
    assert bench.main(["--quick", "--device", "cpu", "--providers", "eager+tp,ours+tp,liger+tp", "--no-long",
                       "--no-inference", "--steps", "1", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    status = {r.provider: r for r in results.rows}
    assert status["eager+tp"].ok and status["ours+tp"].ok
    assert "tensor-parallel group of 1" in status["ours+tp"].note
    assert status["liger+tp"].status in ("not installed", "error")
    assert any("+tp rows: tensor and sequence parallelism" in n for n in results.notes)
    assert any("torch.compile+tp's tokens/s" in n for n in results.notes)
    assert not torch.distributed.is_initialized()


def test_fsdp2_under_torchrun_scales_against_one_process(tmp_path: Path) -> None:
    """torchrun with two CPU processes (gloo): rank 0 alone writes, each row's peak is the largest rank's, and
    --scaling-base gives each row its efficiency against the world-of-one run; a provider without +fsdp2 is
    refused under torchrun."""
    bench = _bench()
    one = tmp_path / "one"
    assert bench.main(["--quick", "--device", "cpu", "--providers", "ours+fsdp2", "--no-long", "--no-inference",
                       "--steps", "1", "--out", str(one)]) == 0
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), "--quick",
           "--device", "cpu", "--steps", "1", "--out", str(tmp_path / "two")]
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    done = subprocess.run([*run, "--providers", "ours+fsdp2", "--scaling-base", str(one / "e2e.json")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = BenchmarkResults.load(tmp_path / "two" / "e2e.json")
    assert [r.provider for r in results.rows] == ["ours+fsdp2"] and results.rows[0].ok
    assert "largest of the ranks'" in results.rows[0].peak_mem_method
    assert any("world of 2 process(es) (torchrun" in n for n in results.notes)
    assert any(n.startswith("scaling efficiency, ours+fsdp2") for n in results.notes)
    assert "one GPU's: left out under torchrun" in " ".join(results.notes)
    assert done.stdout.count("timed ours+fsdp2") == 1  # rank 0 prints
    refused = subprocess.run([*run, "--providers", "eager"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "every training provider takes +fsdp2 or +tp; not: eager" in refused.stderr


class _Unpicklable(RuntimeError):
    """An exception that cannot cross a process boundary, like Dynamo's and Inductor's."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.module = os  # a module attribute: pickle refuses it


def _fails_unpicklably(text: str) -> None:
    raise _Unpicklable(text)


def test_a_row_failing_in_its_child_names_the_real_error(capfd: pytest.CaptureFixture) -> None:
    from e2e.child import ChildFailure, failure_name, in_child

    with pytest.raises(ChildFailure) as info:
        in_child(_fails_unpicklably, ("no valid triton configs for head_dim 256",))
    assert failure_name(info.value) == "_Unpicklable"
    assert str(info.value) == "no valid triton configs for head_dim 256"
    assert "Traceback" in capfd.readouterr().err  # the child's whole traceback is in the run's log
    row = _bench()._failed({"op": "train step", "shape": [4, 2048], "config": "Gemma3", "dtype": "bfloat16",
                            "provider": "ours", "pass_name": "fwd+bwd"}, info.value)
    assert row.status == "error" and row.note == "_Unpicklable: no valid triton configs for head_dim 256"
