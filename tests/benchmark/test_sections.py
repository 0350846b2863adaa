"""SectionRunner: rows are written as they are added, a spent budget skips, a failing section is recorded
and the next one runs, and SIGINT keeps the rows, marked PARTIAL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from kernel_pytorch.benchmark.results import BenchmarkResults, Row
from kernel_pytorch.benchmark.sections import SKIPPED_BUDGET, SectionRunner


def _row(name: str) -> Row:
    return Row(op=name, shape=[], config="c", dtype="float32", provider="-", pass_name="-")


def _runner(tmp_path: Path, budget_s: float = 60.0) -> SectionRunner:
    return SectionRunner(BenchmarkResults(name="t", device="cpu"), tmp_path, budget_s, echo=False)


def test_failure_is_recorded_and_written(tmp_path: Path) -> None:
    runner = _runner(tmp_path)

    def broken() -> None:
        runner.add(_row("first"))
        assert BenchmarkResults.load(tmp_path / "t.json").rows[0].op == "first"  # written at once
        raise ValueError("no disk")

    code = runner.run([("a", broken), ("b", lambda: runner.add(_row("second")))], _row)
    rows = BenchmarkResults.load(tmp_path / "t.json").rows
    assert code == 1 and [(r.op, r.status) for r in rows] == [("first", "ok"), ("a", "error"), ("second", "ok")]
    assert "ValueError: no disk" in rows[1].note


def test_spent_budget_skips(tmp_path: Path) -> None:
    runner = _runner(tmp_path, budget_s=0)
    assert runner.run([("a", lambda: None)], _row) == 0
    (row,) = BenchmarkResults.load(tmp_path / "t.json").rows
    assert row.status == "skipped" and row.note.startswith(SKIPPED_BUDGET)


def test_sigint_keeps_rows_marked_partial(tmp_path: Path) -> None:
    runner = _runner(tmp_path)

    def interrupted() -> None:
        runner.add(_row("done"))
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.getsignal(signal.SIGINT)
    assert runner.run([("a", interrupted), ("b", lambda: runner.add(_row("never")))], _row) == 130
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is put back
    results = BenchmarkResults.load(tmp_path / "t.json")
    assert results.partial and [r.op for r in results.rows] == ["done"]
