"""A benchmark run in sections, kept to a wall-time budget, that never loses a finished row.

    runner = SectionRunner(BenchmarkResults(name="deploy", device=...), out_dir, budget_s=150)
    code = runner.run([("files", files), ("aoti", aoti)], bare_row)   # 0 ok, 1 a section failed, 130 interrupted

Every row goes through `runner.add`, which writes `<out>/<name>.{json,md}` at once, so a run stopped by
SIGINT (Ctrl-C, `timeout -s INT`) keeps what finished; the results are then marked PARTIAL. A section that
would start after the budget is spent gets a "skipped: budget" row (`runner.skip`, which a section also
calls for its own steps); a section that raises gets an "error" row with the message, and the next one
runs. The budget counts from `start` (default: when the runner is made; a script passes its own start
time so that its imports count too).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_pytorch._errors import short_error
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row

SKIPPED_BUDGET = "skipped: budget"


@dataclass
class SectionRunner:
    """The results of a sectioned run, where they are written, and the budget they keep to."""

    results: BenchmarkResults
    out: Path
    budget_s: float
    start: float = field(default_factory=time.perf_counter)
    echo: bool = True  # print each row as it is added
    errors: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        """Seconds of the budget left (negative once overrun)."""
        return self.budget_s - self.elapsed()

    def write(self) -> None:
        self.results.write(self.out)

    def add(self, row: Row) -> Row:
        """Add `row` and write the results at once."""
        self.results.add(row)
        self.write()
        if self.echo:
            shown = f"{row.median_ms:.4g} ms" if row.median_ms is not None else "-"
            print(f"{row.op:>24} {row.provider:>22} {row.pass_name:>18}: {row.status} {shown} {row.note}", flush=True)
        return row

    def skip(self, row: Row, need: str = "") -> Row:
        """Add `row` as skipped for the budget; `need` says what the step would have needed."""
        row.status = "skipped"
        row.note = f"{SKIPPED_BUDGET} ({self.elapsed():.0f} s of {self.budget_s:.0f} s spent{need})"
        return self.add(row)

    def fail(self, section: str, row: Row, exc: BaseException) -> Row:
        """Record a section's failure: an "error" row with the message, and the exit code goes to 1."""
        text = short_error(exc, 600)
        self.errors.append(f"{section}: {text}")
        row.status, row.note = "error", text
        return self.add(row)

    def run(self, sections: Sequence[tuple[str, Callable[[], Any]]], bare_row: Callable[[str], Row]) -> int:
        """Run each (name, fn) in order within the budget, each in its own try/except.

        Args:
            sections: the sections, in the order to run them; each adds its own rows through `add`.
            bare_row: a row for a section that is skipped or fails as a whole (op = its name, say).
        Returns:
            130 when interrupted by SIGINT (the results say PARTIAL), else 1 when a section failed or
            `errors` holds anything, else 0.
        """
        interrupted: list[int] = []

        def on_sigint(signum: int, frame: Any) -> None:
            interrupted.append(signum)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_sigint)
        code = 0
        try:
            for name, fn in sections:
                if self.left() <= 0:
                    self.skip(bare_row(name))
                    continue
                began = time.perf_counter()
                try:
                    fn()
                    self.results.notes.append(f"section {name}: done in {time.perf_counter() - began:.0f} s")
                except Exception as exc:  # noqa: BLE001 (one section's failure must not lose the others)
                    if interrupted:  # e.g. a compile worker killed by the same SIGINT: an interruption
                        raise KeyboardInterrupt from exc
                    self.fail(name, bare_row(name), exc)
                self.write()
        except KeyboardInterrupt:
            self.results.notes.append(f"{PARTIAL_NOTE} at {self.elapsed():.0f} s: the rows above are what "
                                      "finished before the signal")
            code = 130
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.errors:
            self.results.notes.append("errors: " + " | ".join(self.errors))
        self.results.notes.append(f"wall time {self.elapsed():.0f} s of a {self.budget_s:.0f} s budget")
        self.write()
        return code or (1 if self.errors else 0)


__all__ = ["SKIPPED_BUDGET", "SectionRunner"]
