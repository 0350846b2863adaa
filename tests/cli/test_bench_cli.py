"""`kernel-pytorch bench`: runs on a CPU-only machine, writes JSON, markdown and PNGs; where it writes
(a fresh directory by default, never over earlier results without --overwrite); smoke labels; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.results import BenchmarkResults
from kernel_pytorch.benchmark.suites import runner
from kernel_pytorch.cli.main import main


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path / "cache"))


def test_quick_cpu_bench_writes_everything(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "results"
    assert main(["bench", "norm", "--out", str(out), "--quick", "--providers", "ours,eager"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"norm.json", "norm.md", "norm_rms_norm.png", "norm_layer_norm.png", "norm_add_rms_norm.png",
            "norm_roofline.png"} <= names
    r = BenchmarkResults.load(out / "norm.json")
    assert r.ceilings is not None and r.ceilings.source == "measured"
    assert r.device.startswith("cpu") and {row.provider for row in r.rows} == {"ours", "eager"}
    assert json.loads((out / "norm.json").read_text())["rows"]
    printed = capsys.readouterr().out
    assert "norm:" in printed and "wrote" in printed


def test_list_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--list"]) == 0
    assert "norm" in capsys.readouterr().out.split()
    assert main(["bench", "nope", "--out", str(tmp_path)]) == 2
    assert main(["bench", "norm", "--out", str(tmp_path), "--providers", "bogus", "--quick"]) == 2
    assert not (tmp_path / "norm.json").exists()


@pytest.fixture
def fixed_ceilings(monkeypatch: pytest.MonkeyPatch) -> None:
    # the runs below check where results go, not the ceilings: skip measuring them
    fake = Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                    matmul_dtype="float32", torch_version="", measured_at="now")
    monkeypatch.setattr(runner, "measure_ceilings", lambda *a, **k: fake)


@pytest.mark.usefixtures("fixed_ceilings")
def test_default_output_is_a_fresh_directory_and_quick_runs_are_labelled_smoke(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "norm", "--quick", "--providers", "ours", "--no-plots", "--device", "cpu"]
    assert main(argv) == 0
    assert main(argv) == 0  # a second run in the same second gets its own directory
    runs = sorted((tmp_path / "bench-results").iterdir())
    assert len(runs) == 2 and all(d.name.startswith("norm-cpu-") for d in runs)
    r = BenchmarkResults.load(runs[0] / "norm.json")
    assert r.smoke and json.loads((runs[0] / "norm.json").read_text())["smoke"] is True
    assert any("smoke run" in n for n in r.notes)
    md = (runs[0] / "norm.md").read_text()
    assert "Smoke run" in md.splitlines()[2] and "not speedups" in md
    assert "smoke run" in capsys.readouterr().out


@pytest.mark.usefixtures("fixed_ceilings")
def test_existing_results_are_not_overwritten_without_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    committed = tmp_path / "results"
    committed.mkdir()
    (committed / "norm.json").write_text("committed")
    (committed / "norm_rms_norm.png").write_text("committed")
    argv = ["bench", "norm", "--out", str(committed), "--quick", "--providers", "ours", "--no-plots"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds results" in err and "norm.json" in err and "--overwrite" in err
    assert (committed / "norm.json").read_text() == "committed" and not (committed / "norm.md").exists()
    assert main([*argv, "--overwrite"]) == 0
    assert BenchmarkResults.load(committed / "norm.json").smoke


def test_an_interrupted_suite_is_written_partial_and_no_other_suite_starts(tmp_path, monkeypatch, capsys) -> None:
    """Ctrl-C or `timeout -s INT` during the first suite: its rows so far are written, marked PARTIAL,
    and the next suite does not start."""
    from kernel_pytorch.benchmark.suites import runner
    from kernel_pytorch.cli.main import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "measure", interrupted)
    code = main(["bench", "norm", "mlp", "--quick", "--device", "cpu", "--no-plots", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 130 and "[PARTIAL: interrupted]" in out
    assert (tmp_path / "norm.json").exists() and not (tmp_path / "mlp.json").exists()
    assert "PARTIAL: interrupted after 0" in (tmp_path / "norm.md").read_text()
