"""Timing with one result type on every device.

GPU: CUDA events around each repetition after a warm-up, the L2 cache flushed between repetitions,
optionally several input copies rotated so a tiny working set cannot stay cache-resident, the median
of many repetitions (CUDA-graph replay, which removes the CPU launch cost so it can be read off
separately, is `graph_timer.py`). CPU: `torch.utils.benchmark.Timer.blocked_autorange`, whose per-block times feed
the same `Timing`.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

Fn = Callable[[], Any]

# Repetition counts for the CUDA-event loop: enough samples for a stable median even for
# millisecond kernels, few enough that a 100 ms budget on a microsecond kernel stays bounded.
MIN_REPS = 10
MAX_REPS = 2000
# Fallback L2 size when the device properties do not report one (H100: 50 MiB).
_DEFAULT_L2_BYTES = 50 * 2**20
# Rotated input copies together stay under this (a copy's own inputs can exceed the bytes a call
# counts as moved: a cache read only in part, the fp32 logits a loss keeps).
MAX_ROTATION_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Timing:
    """Summary of repeated timings of one callable, in milliseconds per call.

    `q20_ms`/`q80_ms` bound the middle 60% of the samples: the spread reported beside the median.
    """

    median_ms: float
    q20_ms: float
    q80_ms: float
    min_ms: float
    max_ms: float
    reps: int
    method: str

    @property
    def spread_ms(self) -> float:
        """Width of the q20..q80 band."""
        return self.q80_ms - self.q20_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timing:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})

    def __str__(self) -> str:
        return (
            f"{self.median_ms:.4g} ms (q20-q80 {self.q20_ms:.4g}-{self.q80_ms:.4g}, n={self.reps}, "
            f"{self.method})"
        )


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted, non-empty sequence."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    frac = pos - lo
    return float(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)


def summarize(samples_ms: Sequence[float], method: str) -> Timing:
    """Build a `Timing` from per-call samples in milliseconds (at least one)."""
    if not samples_ms:
        raise ValueError("no timing samples")
    s = sorted(float(v) for v in samples_ms)
    return Timing(
        median_ms=float(statistics.median(s)),
        q20_ms=_quantile(s, 0.2),
        q80_ms=_quantile(s, 0.8),
        min_ms=s[0],
        max_ms=s[-1],
        reps=len(s),
        method=method,
    )


def speedup(baseline: Timing, candidate: Timing) -> tuple[float, float, float]:
    """How many times faster `candidate` is than `baseline`: (median ratio, low, high).

    The low/high bounds pair the slow end of one band with the fast end of the other
    (baseline q20 / candidate q80 and baseline q80 / candidate q20), so a speedup whose band
    straddles 1.0 is not a measured win.
    """
    if candidate.median_ms <= 0 or candidate.q20_ms <= 0 or candidate.q80_ms <= 0:
        raise ValueError("candidate timing must be positive")
    return (
        baseline.median_ms / candidate.median_ms,
        baseline.q20_ms / candidate.q80_ms,
        baseline.q80_ms / candidate.q20_ms,
    )


def resolve_device(device: torch.device | str | None) -> torch.device:
    """`device` as a torch.device; None means the current CUDA device when there is one, else CPU."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def l2_cache_bytes(device: torch.device) -> int:
    """L2 size of a CUDA device (0 for CPU)."""
    if device.type != "cuda":
        return 0
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or _DEFAULT_L2_BYTES)


def rotation_copies(working_set_bytes: int, device: torch.device | str | None, max_copies: int = 32,
                    max_total_bytes: int = MAX_ROTATION_BYTES) -> int:
    """How many copies of the inputs to rotate through so that each call starts with cold caches.

    On CUDA: enough copies to span twice the L2; 1 when one working set already does (or on CPU).

    Args:
        working_set_bytes: bytes one call reads and writes.
        device: where the call runs.
        max_copies: upper bound (memory guard for very small working sets).
        max_total_bytes: the copies' working sets together stay under this (at least one copy).
    """
    dev = resolve_device(device)
    if dev.type != "cuda" or working_set_bytes <= 0:
        return 1
    need = math.ceil(2 * l2_cache_bytes(dev) / working_set_bytes)
    return max(1, min(max_copies, need, max_total_bytes // working_set_bytes))


def free_device_memory(device: torch.device | str | None, *, collect: bool = True) -> None:
    """Return what the last measurement held to the device: with `collect`, collect Python's reference
    cycles first (an exception's frames keep tensors, graphs and compiled callables alive; a collection
    takes up to a second in a process that has compiled, so callers ask for it after failures and
    between shapes), then hand the CUDA allocator's cached blocks back (freed graph pools included), so
    the next measurement starts from the same free memory."""
    if collect:
        gc.collect()
    dev = resolve_device(device)
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def callables(fn: Fn | Sequence[Fn]) -> list[Fn]:
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if not fns or not all(callable(f) for f in fns):
        raise TypeError("fn must be a callable or a non-empty sequence of callables")
    return fns


def time_fn(
    fn: Fn | Sequence[Fn],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    flush_l2: bool = True,
    cpu_min_run_time: float = 0.2,
) -> Timing:
    """Median time per call of `fn`.

    Args:
        fn: a zero-argument callable, or a sequence of them (the same work on different input
            copies); repetition i calls `fn[i % len(fn)]`, which rotates the working set.
        device: where the work runs; CUDA uses events, anything else torch.utils.benchmark.
        warmup_ms: CUDA: time spent calling before measuring (after one untimed first call).
        rep_ms: CUDA: target total time of the measured repetitions.
        flush_l2: CUDA: zero a buffer larger than L2 before each repetition (outside the events).
        cpu_min_run_time: CPU: seconds `blocked_autorange` measures for.
    Returns:
        A `Timing` in milliseconds per call.
    """
    fns = callables(fn)
    dev = resolve_device(device)
    if dev.type == "cuda":
        return _time_cuda(fns, dev, warmup_ms, rep_ms, flush_l2)
    return _time_cpu(fns, cpu_min_run_time)


def _time_cpu(fns: list[Fn], min_run_time: float) -> Timing:
    import torch.utils.benchmark as tb

    state = {"i": 0}

    def call() -> None:
        i = state["i"]
        state["i"] = i + 1
        fns[i % len(fns)]()

    for f in fns:  # first calls (lazy init, caches) stay out of the measurement
        f()
    # keep torch's own thread count: Timer defaults to one thread, which would misreport CPU ops
    timer = tb.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=min_run_time)
    samples = [t * 1e3 for t in m.times]
    rotated = f", {len(fns)} input copies" if len(fns) > 1 else ""
    return summarize(samples, f"torch.utils.benchmark blocked_autorange (cpu{rotated})")


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    # 4x L2 (at least 256 MiB) guarantees the previous repetition's lines are evicted
    nbytes = max(4 * l2_cache_bytes(dev), 256 * 2**20)
    return torch.empty(nbytes // 4, dtype=torch.int32, device=dev)


def _time_cuda(fns: list[Fn], dev: torch.device, warmup_ms: float, rep_ms: float, flush_l2: bool) -> Timing:
    with torch.cuda.device(dev):
        cache = _flush_buffer(dev) if flush_l2 else None
        for f in fns:  # first call: compilation, autotuning, allocator growth
            f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n_est = 5
        start.record()
        for i in range(n_est):
            if cache is not None:
                cache.zero_()
            fns[i % len(fns)]()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / n_est, 1e-4)
        n_warm = max(1, int(warmup_ms / estimate))
        n_rep = max(MIN_REPS, min(MAX_REPS, int(rep_ms / estimate)))
        for i in range(n_warm):
            fns[i % len(fns)]()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            if cache is not None:
                # the memset runs on the GPU while the CPU queues the next call, so launch
                # latency is mostly hidden, as it is inside a real model's stream of kernels
                cache.zero_()
            starts[i].record()
            fns[i % len(fns)]()
            ends[i].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    parts = ["cuda events", "L2 flushed" if flush_l2 else "L2 warm"]
    if len(fns) > 1:
        parts.append(f"{len(fns)} input copies")
    return summarize(samples, ", ".join(parts))


__all__ = [
    "MAX_ROTATION_BYTES",
    "Fn",
    "Timing",
    "callables",
    "free_device_memory",
    "l2_cache_bytes",
    "resolve_device",
    "rotation_copies",
    "speedup",
    "summarize",
    "time_fn",
]
