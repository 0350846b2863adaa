"""benchmarks/bench_deploy.py --quick on CPU: the sections write deploy.{json,md} with numbers, the time
budget skips rather than overruns, a failing section is recorded and the next one runs, and an interrupted
run keeps its rows, marked PARTIAL. The AOTI build (~45 s on CPU for llama-tiny) is left out here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kernel_pytorch.benchmark.results import BenchmarkResults

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_deploy.py"


@pytest.fixture
def bench():  # noqa: ANN201 (the script as a module, fresh for each test: tests patch its sections)
    spec = importlib.util.spec_from_file_location("bench_deploy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _run(bench, tmp_path: Path, *args: str) -> tuple[int, BenchmarkResults]:  # noqa: ANN001
    code = bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), *args])
    return code, BenchmarkResults.load(tmp_path / "deploy.json")


def test_quick_files_and_quant(bench, tmp_path: Path) -> None:  # noqa: ANN001
    code, results = _run(bench, tmp_path, "--sections", "files,quant")
    assert code == 0 and results.smoke and (tmp_path / "deploy.md").is_file()
    assert any(n.startswith("versions: torch") and "torchao" in n for n in results.notes)
    assert any("page cache was WARM" in n for n in results.notes)
    for provider in ("kernel_pytorch.save", "torch.save"):
        for pass_name in ("save", "load"):
            (row,) = results.find(provider=provider, pass_name=pass_name)
            assert row.ok and row.median_ms > 0 and row.bytes > 0 and row.gbps > 0
    assert "loaded == saved: yes" in results.find(provider="kernel_pytorch.save", pass_name="load")[0].note
    quant = [r for r in results.rows if r.provider.startswith("kernel_pytorch.save ") or r.status == "not installed"]
    if importlib.util.find_spec("torchao") is None:
        assert [r.note for r in quant] == ["torchao not installed"]
    else:
        assert {r.provider for r in quant} == {"kernel_pytorch.save int8", "kernel_pytorch.save fp8"}
        assert all(r.ok and r.bytes for r in quant)
        (int8,) = results.find(provider="kernel_pytorch.save int8", pass_name="save")
        assert "the size of the float32 checkpoint" in int8.note


def test_aoti_section_keeps_to_the_budget(bench, tmp_path: Path) -> None:  # noqa: ANN001
    # eager is timed; the build and the compile need more budget than is given, so they are skipped
    code, results = _run(bench, tmp_path, "--sections", "aoti,compile", "--aoti-min-s", "1e9",
                         "--compile-min-s", "1e9")
    assert code == 0
    eager = results.find(provider="eager", pass_name="fwd (no_grad)")
    assert len(eager) == 2 and all(r.ok and r.median_ms > 0 and r.peak_mem_bytes is not None for r in eager)
    assert {r.status for r in results.find(provider="eager", pass_name="fwd (cuda graph)")} == {"not available"}
    skipped = [r for r in results.rows if r.provider in ("aoti", "torch.compile")]
    assert skipped and all(r.status == "skipped" and r.note.startswith("skipped: budget") for r in skipped)


def test_spent_budget_skips_every_section(bench, tmp_path: Path) -> None:  # noqa: ANN001
    code, results = _run(bench, tmp_path, "--budget-s", "0")
    assert code == 0 and [r.op for r in results.rows] == ["files", "aoti", "compile", "quant"]
    assert all(r.status == "skipped" and "budget" in r.note for r in results.rows)


def test_a_failing_section_is_recorded_and_the_next_runs(bench, tmp_path: Path) -> None:  # noqa: ANN001
    def broken(run) -> None:  # noqa: ANN001
        raise RuntimeError("disk full")

    def fine(run) -> None:  # noqa: ANN001
        run.add(run.row("checkpoint save", "fine", "save", median_ms=1.0))

    bench.SECTION_FNS.update(files=broken, quant=fine)
    code, results = _run(bench, tmp_path, "--sections", "files,quant")
    assert code == 1
    assert [(r.op, r.status) for r in results.rows] == [("files", "error"), ("checkpoint save", "ok")]
    assert "disk full" in results.rows[0].note and any("errors: files" in n for n in results.notes)


def test_an_interrupted_run_keeps_its_rows(bench, tmp_path: Path) -> None:  # noqa: ANN001
    def interrupted(run) -> None:  # noqa: ANN001
        run.add(run.row("checkpoint save", "first", "save", median_ms=1.0))
        raise KeyboardInterrupt

    bench.SECTION_FNS.update(files=interrupted)
    code, results = _run(bench, tmp_path, "--sections", "files,quant")
    assert code == 130 and results.partial
    assert [r.provider for r in results.rows] == ["first"]  # quant never started
