"""The compile verdict: "could not measure reliably" when the timing cannot decide, and rounds that waited
for a CPU left out of the CPU timing."""

from __future__ import annotations

import pytest

from kernel_pytorch.assistant import paired_cpu as paired_module
from kernel_pytorch.assistant.paired_cpu import PAIRED_ROUNDS, PairedStats, paired_cpu
from kernel_pytorch.assistant.profile import RuntimeProfile
from kernel_pytorch.assistant.verdict import RELIABLE_SPREAD, pass_verdict, verdict_findings
from kernel_pytorch.benchmark.timer import Timing


def _timing(ms: float, spread: float) -> Timing:
    return Timing(ms, ms * (1 - spread), ms * (1 + spread), ms * (1 - spread), ms * (1 + spread), 20, "test")


def _rt(eager: Timing, compiled: Timing, paired: PairedStats | None = None) -> RuntimeProfile:
    return RuntimeProfile("cpu", "cpu", None, timings={"eager fwd": eager, "compiled fwd": compiled},
                          paired={"fwd": paired} if paired else {})


def test_overlapping_bands_are_no_difference_when_narrow_and_unreliable_when_wide() -> None:
    narrow = pass_verdict(_rt(_timing(10.0, 0.05), _timing(10.2, 0.05)), "fwd")
    assert narrow is not None and narrow["verdict"] == "no difference" and narrow["unreliable_why"] is None
    wide = _rt(_timing(10.0, 0.9), _timing(5.0, 0.9))  # 2x apart, but the bands span 1-19 ms and 0.5-9.5 ms
    v = pass_verdict(wide, "fwd")
    assert v is not None and v["verdict"] == "unreliable" and "too wide" in v["unreliable_why"]
    (f,) = verdict_findings(None, wide)
    assert f.title.startswith("Could not measure the fwd step reliably") and "q20-q80" in f.title
    assert f.data["verdict"] == "unreliable" and f.data["gain_ms"] is None and "too wide" in f.evidence
    assert RELIABLE_SPREAD < 0.9


def test_a_timing_that_mostly_waited_for_a_cpu_gives_no_verdict() -> None:
    busy = PairedStats(rounds=40, kept=3, wait_ms=120.0)
    v = pass_verdict(_rt(_timing(564.0, 0.03), _timing(828.0, 0.02), busy), "fwd")  # narrow, apart: yet the scheduler's
    assert v is not None and v["verdict"] == "unreliable" and "busy" in v["unreliable_why"]
    calm = PairedStats(rounds=40, kept=38, wait_ms=0.01)
    v = pass_verdict(_rt(_timing(564.0, 0.03), _timing(828.0, 0.02), calm), "fwd")
    assert v is not None and v["verdict"] == "eager" and v["rounds"] == [38, 40]


def test_paired_cpu_leaves_out_the_rounds_that_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    waited = [0.0]
    calls = [0]

    def slow_and_waiting() -> None:  # every third call "waits for a CPU" for a second and looks slow
        calls[0] += 1
        if calls[0] % 3 == 0:
            waited[0] += 1.0

    monkeypatch.setattr(paired_module, "runqueue_wait_s", lambda: waited[0])
    eager, compiled, stats = paired_cpu(lambda: None, slow_and_waiting)
    assert stats.rounds > stats.kept >= PAIRED_ROUNDS[0] and eager.reps == compiled.reps == stats.kept
    assert stats.wait_ms is not None and stats.wait_ms > 0 and "rounds kept" in eager.method
    def always_waiting() -> float:
        waited[0] += 1.0
        return waited[0]

    monkeypatch.setattr(paired_module, "runqueue_wait_s", always_waiting)
    monkeypatch.setattr(paired_module, "PAIRED_MAX_S", 0.2)
    _, _, stats = paired_cpu(lambda: None, lambda: None)  # every call waited: nothing kept, said so
    assert stats.kept == 0 and not stats.reliable
