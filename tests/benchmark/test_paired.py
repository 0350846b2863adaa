"""benchmark.paired: callables timed in turns, the order reversed every other round, every call counted."""

from __future__ import annotations

import pytest

from kernel_pytorch.benchmark.paired import round_ratios, time_interleaved


def test_turns_reverse_every_other_round_and_pool_every_call() -> None:
    calls: list[str] = []
    syncs: list[int] = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    timings, medians = time_interleaved(fns, rounds=3, per_round=2, sync=lambda: syncs.append(1))
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]
    assert len(syncs) == 2 * len(calls)  # before and after every call
    assert timings["a"].reps == timings["b"].reps == 6 and "3 rounds of 2 calls" in timings["a"].method
    assert [sorted(m) for m in medians] == [["a", "b"]] * 3


def test_round_ratios_and_bad_arguments() -> None:
    medians = [{"base": 10.0, "new": 8.0}, {"base": 12.0, "new": 10.0}]
    assert round_ratios(medians, "base", "new") == [1.25, 1.2]
    for kwargs in ({"rounds": 0, "per_round": 1}, {"rounds": 1, "per_round": 0}):
        with pytest.raises(ValueError, match="at least one"):
            time_interleaved({"a": lambda: None}, sync=lambda: None, **kwargs)
    with pytest.raises(ValueError, match="at least one"):
        time_interleaved({}, rounds=1, per_round=1, sync=lambda: None)
