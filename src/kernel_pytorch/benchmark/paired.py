"""Timing several callables in turns, so that a drift in the device's speed falls on each alike.

A GPU at its power cap changes its clock from one second to the next (an H200 training step moves
between about 1300 and 1950 MHz), so two providers timed one after the other can differ by more than
the effect being measured. `time_interleaved` runs every callable `per_round` times in a row, round
after round, reversing the order every other round (A B, B A, A B, ...), and synchronises after each
call. Each callable's `Timing` pools all its calls; `round_ratios` gives the ratio of two callables'
medians in each round, whose spread says how much of a difference is noise.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

from kernel_pytorch.benchmark.timer import Timing, summarize


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], *, rounds: int, per_round: int, sync: Callable[[], None],
) -> tuple[dict[str, Timing], list[dict[str, float]]]:
    """Each callable timed in turns (module docstring).

    Args:
        fns: name -> a zero-argument callable (one training step, say), at least one.
        rounds: how many rounds; per_round: calls of each callable per round, one after another.
        sync: waits for the device (torch.cuda.synchronize, or nothing on the CPU).
    Returns:
        (name -> `Timing` over its rounds * per_round calls, each round's name -> median ms).
    """
    if not fns or rounds < 1 or per_round < 1:
        raise ValueError("time_interleaved needs at least one callable, one round and one call per round")
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    medians: list[dict[str, float]] = []
    for r in range(rounds):
        this_round: dict[str, float] = {}
        for name in names if r % 2 == 0 else names[::-1]:
            times = []
            for _ in range(per_round):
                sync()
                t = time.perf_counter()
                fns[name]()
                sync()
                times.append((time.perf_counter() - t) * 1e3)
            samples[name].extend(times)
            this_round[name] = statistics.median(times)
        medians.append(this_round)
    method = f"wall clock per call, synchronised; {rounds} rounds of {per_round} calls each, in turns"
    return {n: summarize(samples[n], method) for n in names}, medians


def round_ratios(medians: list[dict[str, float]], baseline: str, candidate: str) -> list[float]:
    """How many times faster `candidate` ran than `baseline` in each round (baseline's median over the candidate's)."""
    return [m[baseline] / m[candidate] for m in medians]


__all__ = ["round_ratios", "time_interleaved"]
