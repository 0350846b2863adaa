"""Peak memory of one call, measured the best way the device allows, and labelled with that way.

CUDA: the caching allocator's peak (`torch.cuda.reset_peak_memory_stats` around the call) minus what
was allocated before it. CPU has no allocator statistics, so the call runs under `torch.profiler`
with `profile_memory=True` and the peak of the running sum of the recorded tensor allocations is
taken: PyTorch's CPU tensor allocations only, not the process's resident memory.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kernel_pytorch.benchmark.timer import resolve_device

CUDA_METHOD = "cuda allocator peak minus allocated before"
CPU_METHOD = "cpu: torch.profiler allocation trace (PyTorch tensor allocations, not process RSS)"


@dataclass(frozen=True)
class MemoryMeasurement:
    """Peak bytes a call allocated on top of what was live before it (None: not measurable here)."""

    peak_bytes: int | None
    method: str

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / 2**20

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryMeasurement:
        return cls(peak_bytes=d.get("peak_bytes"), method=d["method"])


def peak_memory(fn: Callable[[], Any], device: torch.device | str | None = None) -> MemoryMeasurement:
    """Run `fn` once and report the peak memory it allocated (its returned tensors included).

    Args:
        fn: zero-argument callable; run it once beforehand so lazy initialisation is not counted.
        device: where it runs (default: current CUDA device, else CPU).
    """
    dev = resolve_device(device)
    gc.collect()
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = fn()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            del out
        return MemoryMeasurement(peak_bytes=int(peak), method=CUDA_METHOD)
    return _cpu_peak(fn)


def _allocation_deltas(node: Any, out: list[tuple[int, int]]) -> None:
    fields = node.extra_fields
    if type(fields).__name__.endswith("Allocation") and str(getattr(fields, "device", "cpu")).startswith("cpu"):
        out.append((int(node.start_time_ns), int(fields.alloc_size)))
    for child in node.children:
        _allocation_deltas(child, out)


# Kineto, the profiler behind CPU peak memory, prints "USDT: ... profiler_start/stop" lines to stderr
# on every profile: USDT (5) is its highest log severity, and torch's default quieting (ERROR, 4) lets it
# through. Kineto reads KINETO_LOG_LEVEL once, when the first profile of the process starts it.
_KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
_ABOVE_USDT = "6"


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Start kineto, if this measurement is what starts it, with its log level above USDT; a level the
    user set is left alone. The variable is removed again afterwards (kineto has read it by then)."""
    if _KINETO_LOG_LEVEL in os.environ:
        yield
        return
    os.environ[_KINETO_LOG_LEVEL] = _ABOVE_USDT
    try:
        yield
    finally:
        os.environ.pop(_KINETO_LOG_LEVEL, None)


def _cpu_peak(fn: Callable[[], Any]) -> MemoryMeasurement:
    from torch.profiler import ProfilerActivity, profile

    try:
        with _quiet_kineto(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
            del out
        # the event tree carries every allocation and free with its size; the public event list
        # folds allocations into their ops, which loses the order needed for a peak
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except Exception as exc:  # the tree is a profiler internal: report, do not fail a benchmark
        return MemoryMeasurement(peak_bytes=None, method=f"unavailable on cpu ({type(exc).__name__}: {exc})")
    deltas: list[tuple[int, int]] = []
    for root in roots:
        _allocation_deltas(root, deltas)
    deltas.sort(key=lambda d: d[0])
    live = peak = 0
    for _, size in deltas:
        live += size
        peak = max(peak, live)
    return MemoryMeasurement(peak_bytes=int(peak), method=CPU_METHOD)


__all__ = ["CPU_METHOD", "CUDA_METHOD", "MemoryMeasurement", "peak_memory"]
