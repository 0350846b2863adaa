"""Timing several callables in turns, so that a drift in the machine's speed falls on each alike.

A GPU at its power cap changes its clock from one second to the next (an H200 training step moves
between about 1300 and 1950 MHz), and a CPU shared with other processes slows down when they run, so
two callables timed one after the other can differ by more than the effect being measured. `run_rounds`
is the one loop: round after round, every callable's turn (by default `per_round` calls in a row, each
synchronised) in an order reversed every other round (A B, B A, A B, ...). `time_interleaved` pools each
callable's calls into a `Timing` and gives each round's medians, whose spread says how much of a
difference is noise.

On a machine whose cores other processes also use, a call can wait to be scheduled: with as many
intra-op threads as cores, every parallel region waits for its slowest thread, so a 1 ms forward can
take hundreds of milliseconds, and the two sides of a comparison suffer differently. Such a timing
measures the scheduler. Linux counts, per thread, the time spent runnable but not running
(`/proc/self/task/*/schedstat`, second field); with `count_waits`, a turn during which the process's
threads waited longer than `WAIT_SHARE` of it disturbs its round, and `paired_cpu` leaves disturbed
rounds out (when too few are left it says so: `PairedStats.reliable`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kernel_pytorch.benchmark.timer import Timing, summarize

Slot = Callable[[Callable[[], object]], list[float]]  # one callable's turn in a round -> its calls' ms

WAIT_SHARE = 0.1  # a turn whose threads waited for a CPU longer than this share of it is disturbed


@dataclass(frozen=True)
class Rounds:
    """How many rounds: at least `least`; then stop at `most` kept rounds, or at `least` kept rounds once
    `min_s` seconds ran, or once `max_s` seconds ran. `Rounds(n)` is exactly n rounds."""

    least: int
    most: int | None = None  # None: `least`
    min_s: float = 0.0
    max_s: float = 0.0

    def done(self, ran: int, kept: int, elapsed_s: float) -> bool:
        most = self.least if self.most is None else self.most
        return ran >= self.least and (kept >= most or (kept >= self.least and elapsed_s >= self.min_s)
                                      or elapsed_s >= self.max_s)


# the eager-against-compiled CPU timing of the analyser: at least 7 and at most 50 undisturbed rounds and
# at least 1 s when the rounds allow; past 5 s no more looking for undisturbed rounds (a 2-core machine
# shared with other processes: the compile verdict compares the rounds' q20-q80 bands)
CPU_PAIR_ROUNDS = Rounds(least=7, most=50, min_s=1.0, max_s=5.0)


# the eager-against-compiled GPU timing of the analyser: turns of back-to-back calls (`paired_cuda`), at least
# 5 and at most 20 rounds, at least 0.4 s when the rounds allow, none started past 3 s
CUDA_PAIR_ROUNDS = Rounds(least=5, most=20, min_s=0.4, max_s=3.0)
CUDA_TURN_MS = 20.0  # the GPU time one turn aims at: long enough to keep the queue full, short against drift


@dataclass(frozen=True)
class Round:
    """One round: each callable's call times (ms), and whether a turn waited for a CPU."""

    ms: Mapping[str, list[float]]
    disturbed: bool


@dataclass(frozen=True)
class PairedStats:
    """How an interleaved CPU timing went.

    Attributes:
        rounds: rounds run (one turn of each callable per round).
        kept: rounds in the timings (the others waited for a CPU); == rounds where waits are not counted.
        wait_ms: the mean time per round the process's threads waited for a CPU, over every round
            (None: not counted on this system).
        least: the undisturbed rounds a reliable timing needs.
    """

    rounds: int
    kept: int
    wait_ms: float | None
    least: int = CPU_PAIR_ROUNDS.least

    @property
    def reliable(self) -> bool:
        return self.kept >= self.least

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


def _no_sync() -> None:
    pass


def run_rounds(
    fns: Mapping[str, Callable[[], object]], *, rounds: int | Rounds, per_round: int = 1,
    sync: Callable[[], None] = _no_sync, warmup: int = 0, slot: Slot | None = None, count_waits: bool = False,
) -> tuple[list[Round], float | None]:
    """Each callable timed in turns (module docstring).

    Args:
        fns: name -> a zero-argument callable (one training step, say), at least one.
        rounds: how many rounds (`Rounds` for a count that depends on the undisturbed rounds and the time).
        per_round: calls of each callable per turn, one after another, each between two `sync()`s.
        sync: waits for the device (torch.cuda.synchronize, or nothing on the CPU).
        warmup: untimed calls of each callable first, in turns.
        slot: times one turn instead (callable -> its calls' ms), e.g. a `time_fn` median.
        count_waits: mark rounds in which a turn waited for a CPU (`Round.disturbed`, Linux only).
    Returns:
        (the rounds, the seconds the process's threads waited for a CPU over all of them; None when
        not counted).
    """
    limits = rounds if isinstance(rounds, Rounds) else Rounds(rounds)
    if not fns or limits.least < 1 or per_round < 1:
        raise ValueError("time_interleaved needs at least one callable, one round and one call per round")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    turn = slot or (lambda fn: _calls(fn, per_round, sync))
    counted = count_waits and runqueue_wait_s() is not None
    out: list[Round] = []
    kept, waited = 0, 0.0
    start = time.perf_counter()
    while not limits.done(len(out), kept, time.perf_counter() - start):
        ms: dict[str, list[float]] = {}
        clean = True
        for name in names if len(out) % 2 == 0 else names[::-1]:
            w0 = runqueue_wait_s() if counted else None
            t0 = time.perf_counter()
            ms[name] = turn(fns[name])
            took = time.perf_counter() - t0
            if w0 is not None:
                wait = (runqueue_wait_s() or w0) - w0
                waited += wait
                clean = clean and wait <= WAIT_SHARE * took
        out.append(Round({n: ms[n] for n in names}, disturbed=not clean))
        kept += clean
    return out, waited if counted else None


def _calls(fn: Callable[[], object], n: int, sync: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(n):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], *, rounds: int, per_round: int, sync: Callable[[], None],
) -> tuple[dict[str, Timing], list[dict[str, float]]]:
    """Each callable timed in turns, every call counted (`run_rounds`).

    Returns:
        (name -> `Timing` over its rounds * per_round calls, each round's name -> median ms).
    """
    done, _ = run_rounds(fns, rounds=rounds, per_round=per_round, sync=sync)
    method = f"wall clock per call, synchronised; {rounds} rounds of {per_round} calls each, in turns"
    timings = {n: summarize([ms for r in done for ms in r.ms[n]], method) for n in fns}
    return timings, [{n: statistics.median(ms) for n, ms in r.ms.items()} for r in done]


def paired_cpu(
    fns: Mapping[str, Callable[[], object]], *, rounds: Rounds = CPU_PAIR_ROUNDS,
) -> tuple[dict[str, Timing], PairedStats]:
    """Callables timed in turns on the CPU, one call each per round after two warm calls each, from the
    rounds in which no call waited for a CPU (module docstring). When fewer than `rounds.least` rounds
    were undisturbed, the timings are of every round (`PairedStats.reliable` is then False)."""
    done, waited = run_rounds(fns, rounds=rounds, warmup=2, count_waits=True)
    clean = [r for r in done if not r.disturbed]
    stats = PairedStats(len(done), len(clean), None if waited is None else waited * 1e3 / len(done), rounds.least)
    source = clean if stats.reliable else done
    method = f"perf_counter, {' and '.join(fns)} interleaved (cpu; {stats.describe()})"
    return {n: summarize([ms for r in source for ms in r.ms[n]], method) for n in fns}, stats


def _cuda_turns(device: object, turn_ms: float) -> Slot:
    """A slot timing one turn on the GPU: n calls back to back, each between two CUDA events, one
    synchronise at the end (n from the callable's first turn: about `turn_ms` of its calls)."""
    import torch

    counts: dict[int, int] = {}

    def turn(fn: Callable[[], object]) -> list[float]:
        with torch.cuda.device(device):  # type: ignore[arg-type]
            n = counts.get(id(fn), 3)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            torch.cuda.synchronize()
            for begin, end in events:
                begin.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            ms = [begin.elapsed_time(end) for begin, end in events]
        if id(fn) not in counts:
            counts[id(fn)] = max(1, min(200, round(turn_ms / max(statistics.median(ms), 1e-3))))
        return ms

    return turn


def paired_cuda(
    fns: Mapping[str, Callable[[], object]], device: object, *, rounds: Rounds = CUDA_PAIR_ROUNDS,
    turn_ms: float = CUDA_TURN_MS,
) -> tuple[dict[str, Timing], PairedStats]:
    """Callables timed in turns on a CUDA device: per turn about `turn_ms` of one callable's calls back to
    back (the host queues the next call while the GPU runs this one, as in a training loop), each call
    between CUDA events, L2 warm; the order reversed every other round, so a clock or load drift falls on
    each alike. Turns in which the process waited for a CPU mark their round (`paired_cpu`); the first
    round sizes the turns and is not counted."""
    slot = _cuda_turns(device, turn_ms)
    for fn in fns.values():  # warm calls, then the turn that sizes the others
        fn(), fn()
        slot(fn)
    done, waited = run_rounds(fns, rounds=rounds, slot=slot, count_waits=True)
    clean = [r for r in done if not r.disturbed]
    stats = PairedStats(len(done), len(clean), None if waited is None else waited * 1e3 / len(done), rounds.least)
    source = clean if stats.reliable else done
    method = f"cuda events, back-to-back calls, {' and '.join(fns)} in turns ({stats.describe()})"
    return {n: summarize([ms for r in source for ms in r.ms[n]], method) for n in fns}, stats


def round_ratios(medians: list[dict[str, float]], baseline: str, candidate: str) -> list[float]:
    """How many times faster `candidate` ran than `baseline` in each round (baseline's median over the candidate's)."""
    return [m[baseline] / m[candidate] for m in medians]


__all__ = [
    "CPU_PAIR_ROUNDS",
    "CUDA_PAIR_ROUNDS",
    "CUDA_TURN_MS",
    "WAIT_SHARE",
    "PairedStats",
    "Round",
    "Rounds",
    "paired_cpu",
    "paired_cuda",
    "round_ratios",
    "run_rounds",
    "runqueue_wait_s",
    "time_interleaved",
]
