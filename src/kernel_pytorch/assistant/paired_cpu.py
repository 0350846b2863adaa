"""CPU timing of the eager and the compiled step, interleaved, with the rounds that waited for a CPU left out.

On a machine whose cores other processes also use, a step can wait to be scheduled: with as many
intra-op threads as cores, every parallel region waits for its slowest thread, so a 1 ms forward can
take hundreds of milliseconds, and the two sides of a comparison suffer differently (the compiled code
enters more parallel regions than eager's small ops). Such a timing measures the scheduler, not the
model. Linux counts, per thread, the time spent runnable but not running (`/proc/self/task/*/schedstat`,
second field); a call during which the process's threads waited longer than `WAIT_SHARE` of the call
is disturbed, and a round (one call of each side) with a disturbed call is left out. When fewer than
`PAIRED_ROUNDS[0]` rounds are left the timing says so (`PairedStats.reliable`), and the compile verdict
says it could not measure reliably instead of giving one. Elsewhere every round is kept.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel_pytorch.benchmark.timer import Timing, summarize

PAIRED_ROUNDS = (7, 50)  # at least / at most this many undisturbed rounds ...
PAIRED_MIN_S = 1.0  # ... and at least this long in all, when the rounds allow
PAIRED_MAX_S = 5.0  # past this, stop looking for undisturbed rounds (once the minimum of rounds ran)
WAIT_SHARE = 0.1  # a call whose threads waited for a CPU longer than this share of it is disturbed


@dataclass(frozen=True)
class PairedStats:
    """How an interleaved timing went.

    Attributes:
        rounds: rounds run (one call of each side per round).
        kept: rounds in the timings (the others waited for a CPU); == rounds where waits are not counted.
        wait_ms: the mean time per round the process's threads waited for a CPU, over every round
            (None: not counted on this system).
    """

    rounds: int
    kept: int
    wait_ms: float | None

    @property
    def reliable(self) -> bool:
        return self.kept >= PAIRED_ROUNDS[0]

    def describe(self) -> str:
        if self.wait_ms is None:
            return f"{self.rounds} rounds"
        return (f"{self.kept} of {self.rounds} rounds kept; the others waited for a CPU "
                f"(mean wait {self.wait_ms:.3f} ms per round)")


def runqueue_wait_s() -> float | None:
    """Seconds the threads of this process have spent runnable but not running, summed (None where the
    kernel does not report it). Threads that ended are not counted: callers take differences."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


def paired_cpu(a: Callable[[], Any], b: Callable[[], Any]) -> tuple[Timing, Timing, PairedStats]:
    """Timings of `a` and `b` called alternately (which goes first alternates too), after two warm calls
    each, from the rounds no call of which waited for a CPU (see the module docstring): at least
    PAIRED_ROUNDS[0] such rounds and PAIRED_MIN_S, at most PAIRED_ROUNDS[1] rounds, and no longer than
    PAIRED_MAX_S once PAIRED_ROUNDS[0] rounds ran. When too few rounds were undisturbed, the timings
    are of every round (`PairedStats.reliable` is then False)."""
    for _ in range(2):
        a(), b()
    counted = runqueue_wait_s() is not None
    kept: tuple[list[float], list[float]] = ([], [])
    every: tuple[list[float], list[float]] = ([], [])
    waited = 0.0
    start = time.perf_counter()
    rounds = 0
    while True:
        elapsed = time.perf_counter() - start
        n = len(kept[0])
        if rounds >= PAIRED_ROUNDS[0] and (n >= PAIRED_ROUNDS[1] or (n >= PAIRED_ROUNDS[0] and elapsed >= PAIRED_MIN_S)
                                           or elapsed >= PAIRED_MAX_S):
            break
        order = ((0, a), (1, b)) if rounds % 2 == 0 else ((1, b), (0, a))
        ms = [0.0, 0.0]
        clean = True
        for i, fn in order:
            w0 = runqueue_wait_s() if counted else None
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            ms[i] = (t1 - t0) * 1e3
            if w0 is not None:
                wait = (runqueue_wait_s() or w0) - w0
                waited += wait
                clean = clean and wait <= WAIT_SHARE * (t1 - t0)
        for i in (0, 1):
            every[i].append(ms[i])
            if clean:
                kept[i].append(ms[i])
        rounds += 1
    stats = PairedStats(rounds, len(kept[0]), waited * 1e3 / rounds if counted else None)
    source = kept if stats.reliable else every
    method = f"perf_counter, eager and compiled interleaved (cpu; {stats.describe()})"
    return summarize(source[0], method), summarize(source[1], method), stats


__all__ = ["PAIRED_ROUNDS", "PairedStats", "paired_cpu", "runqueue_wait_s"]
