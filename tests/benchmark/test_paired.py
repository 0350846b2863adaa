"""benchmark.paired: callables timed in turns, the order reversed every other round, every call counted; on
the CPU, the rounds that waited for a CPU left out."""

from __future__ import annotations

import dataclasses

import pytest

from kernel_pytorch.benchmark import paired as paired_module
from kernel_pytorch.benchmark.paired import (
    CPU_PAIR_ROUNDS,
    Rounds,
    paired_cpu,
    round_ratios,
    run_rounds,
    time_interleaved,
)


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


def test_paired_cpu_leaves_out_the_rounds_that_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    waited = [0.0]
    calls = [0]

    def slow_and_waiting() -> None:  # every third call "waits for a CPU" for a second and looks slow
        calls[0] += 1
        if calls[0] % 3 == 0:
            waited[0] += 1.0

    monkeypatch.setattr(paired_module, "runqueue_wait_s", lambda: waited[0])
    timings, stats = paired_cpu({"eager": lambda: None, "compiled": slow_and_waiting})
    eager, compiled = timings["eager"], timings["compiled"]
    assert stats.rounds > stats.kept >= CPU_PAIR_ROUNDS.least and eager.reps == compiled.reps == stats.kept
    assert stats.wait_ms is not None and stats.wait_ms > 0 and "rounds kept" in eager.method
    assert eager.method.startswith("perf_counter, eager and compiled interleaved (cpu; ")

    def always_waiting() -> float:
        waited[0] += 1.0
        return waited[0]

    monkeypatch.setattr(paired_module, "runqueue_wait_s", always_waiting)
    short = dataclasses.replace(CPU_PAIR_ROUNDS, max_s=0.2)
    _, stats = paired_cpu({"a": lambda: None, "b": lambda: None}, rounds=short)
    # every call waited: nothing kept, said so
    assert stats.kept == 0 and not stats.reliable


def test_rounds_stop_rules_and_a_turn_of_its_own() -> None:
    assert Rounds(3).done(3, 0, 0.0) and not Rounds(3).done(2, 2, 99.0)
    assert not CPU_PAIR_ROUNDS.done(7, 7, 0.5) and CPU_PAIR_ROUNDS.done(7, 7, 1.0) and CPU_PAIR_ROUNDS.done(7, 50, 0.0)
    assert CPU_PAIR_ROUNDS.done(9, 2, 5.0) and not CPU_PAIR_ROUNDS.done(9, 2, 4.9)
    order: list[str] = []
    done, waited = run_rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=2, warmup=1,
                              slot=lambda fn: [fn() or 1.0])
    assert order == ["a", "b", "a", "b", "b", "a"] and waited is None
    assert [r.ms for r in done] == [{"a": [1.0], "b": [1.0]}] * 2 and not any(r.disturbed for r in done)


@pytest.mark.cuda
def test_paired_cuda_times_turns_of_back_to_back_calls_in_turns() -> None:
    import torch

    from kernel_pytorch.benchmark.paired import paired_cuda

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    small, big = torch.randn(1 << 16, device=dev), torch.randn(1 << 26, device=dev)
    calls = {"small": 0, "big": 0}

    def step(name: str, x: torch.Tensor) -> None:
        calls[name] += 1
        x.mul_(1.0)

    fns = {"small": lambda: step("small", small), "big": lambda: step("big", big)}
    timings, stats = paired_cuda(fns, dev, rounds=Rounds(4))
    assert stats.rounds == 4 and timings["small"].median_ms < timings["big"].median_ms
    moved = 2 * big.numel() * 4  # read and written per big call
    assert moved / 100e12 * 1e3 < timings["big"].median_ms < moved / 50e9 * 1e3  # between 50 GB/s and 100 TB/s
    # every counted call is one timed sample: 4 turns each, after two warm calls and a sizing turn of 3
    for name in fns:
        assert calls[name] == 2 + 3 + timings[name].reps
    assert timings["small"].reps > timings["big"].reps  # a turn is about the same GPU time for each
    assert "back-to-back" in timings["big"].method
