"""benchmarks/bench_quant_matmul.py: its arguments, and a --quick CPU run (our rows checked against the
reference before timing, an unknown provider a row with its reason and a nonzero exit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_pytorch.benchmark.results import BenchmarkResults
from tests.benchmark.scripts import load_bench


def _bench():  # noqa: ANN202 (the script as a module)
    return load_bench("bench_quant_matmul")


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _bench().main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--sweep" in text and "--providers" in text and "--group" in text


def test_quick_cpu_run(tmp_path: Path) -> None:
    bench = _bench()
    rc = bench.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--batches", "1,3",
                     "--providers", "bf16,ours-int8,ours-int4,ours-fp8,bogus"])
    assert rc == 1  # the bogus provider's rows are errors; the others ran
    results = BenchmarkResults.load(tmp_path / "quant_matmul.json")
    assert results.smoke and results.ceilings is not None and results.ceilings.source == "measured"
    status = {(r.provider, r.shape[0]): r.status for r in results.rows}
    assert status[("bogus", 1)] == "error"
    for provider in ("bf16", "ours-int8", "ours-int4", "ours-fp8"):
        for m in (1, 3):
            assert status[(provider, m)] == "ok", (provider, m)
    ours = [r for r in results.rows if r.provider.startswith("ours") and r.ok]
    assert all(r.bytes and r.gbps and r.pct_of_copy is not None and "vs reference" in r.note for r in ours)
    int8 = next(r for r in ours if r.provider == "ours-int8")
    assert int8.bytes == 96 * 128 + 96 * 4 + (1 * 128 + 1 * 96) * 2  # int8 weight, fp32 scales, bf16 x and y
    assert "## quant matmul tiny" in (tmp_path / "quant_matmul.md").read_text()


def test_a_failing_measurement_is_its_row_alone(tmp_path: Path) -> None:
    import torch

    bench = _bench()
    results = BenchmarkResults("quant_matmul", "cpu", smoke=True)

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("at 40:20: cannot cast int32 to fp8e4nv")

    layer = bench.Layer(call=broken, check=lambda y, x: (True, ""), nbytes=1)
    row = bench.measure(results, "ours-fp8", "cpu", "tiny", 1, 4, 8, [layer], torch.zeros(1, 8), torch.device("cpu"),
                        True)
    assert results.rows == [row]  # one row, not an empty "ok" row beside an error row
    assert row.status == "error" and row.note == "RuntimeError: at 40:20: cannot cast int32 to fp8e4nv"
