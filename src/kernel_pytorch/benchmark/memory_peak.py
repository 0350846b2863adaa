"""What is live at the peak of a call, read from the CUDA caching allocator's own trace.

`torch.cuda.memory._record_memory_history` logs every allocation and free with the Python stack that
made it; `live_at_peak` replays that trace, finds the moment the bytes allocated during the call were
highest, and groups what was live then by the frame that allocated it (the first frame outside torch's
own Python: a model's line, one of our functional/ops files, Inductor's generated code), largest first.
What was allocated before recording started (weights, optimizer state) is the baseline, one number.
`allocated_over_time` replays the same trace into the bytes allocated over the call's time (a memory
timeline). `record_trace(fn)` does the recording around one call on CUDA; `record_peak(fn)` reads its peak.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kernel_pytorch.benchmark.timer import resolve_device

# frames from these parts of torch say how, not where: the allocation is named by its first other frame
_TORCH_INTERNAL = ("/torch/nn/", "/torch/autograd/", "/torch/_ops.py", "/torch/_tensor.py", "/torch/utils/",
                   "/torch/_dynamo/", "/torch/_functorch/", "/torch/_library/", "/torch/optim/",
                   "/torch/_compile.py", "/torch/_inductor/runtime/", "/torch/cuda/", "/torch/overrides.py",
                   "/torch/_prims_common/", "/torch/_refs/", "/torch/_decomp/", "/torch/fx/")


@dataclass(frozen=True)
class PeakGroup:
    """Bytes live at the peak that one frame allocated (`count` allocations); `frame` is
    "file:line in function", "<torch only> file:line in function" (the innermost frame, when every
    Python frame is torch's own) or "<no python frame>" for allocations made from C++ alone."""

    frame: str
    nbytes: int
    count: int


@dataclass(frozen=True)
class PeakBreakdown:
    """`baseline`: bytes allocated before the call; `peak`: the highest bytes allocated during it on top
    of the baseline; `groups`: what was live at that moment, largest first (they sum to `peak`)."""

    baseline: int
    peak: int
    groups: tuple[PeakGroup, ...]

    def table(self, rows: int = 25) -> str:
        """A plain-text table of the largest groups, MiB."""
        mib = 2**20
        lines = [f"allocated before the call: {self.baseline / mib:.1f} MiB; "
                 f"peak during it: +{self.peak / mib:.1f} MiB (total {(self.baseline + self.peak) / mib:.1f} MiB)",
                 "live at the peak, by allocating frame:",
                 f"{'MiB':>10} {'allocs':>7}  frame"]
        for g in self.groups[:rows]:
            lines.append(f"{g.nbytes / mib:10.1f} {g.count:7d}  {g.frame}")
        rest = self.groups[rows:]
        if rest:
            lines.append(f"{sum(g.nbytes for g in rest) / mib:10.1f} {sum(g.count for g in rest):7d}  "
                         f"({len(rest)} more frames)")
        return "\n".join(lines)


def _frame(frames: Iterable[Mapping[str, Any]]) -> str:
    inner = None  # the innermost torch-internal frame, named when no other frame is found
    for f in frames:  # innermost first, as the allocator records them
        name = str(f.get("filename", ""))
        if not name.endswith(".py"):
            continue
        short = "/".join(name.split("/")[-3:])
        if any(part in name for part in _TORCH_INTERNAL):
            inner = inner or f"{short}:{f.get('line')} in {f.get('name')}"
            continue
        return f"{short}:{f.get('line')} in {f.get('name')}"
    return f"<torch only> {inner}" if inner else "<no python frame>"


def live_at_peak(trace: Iterable[Mapping[str, Any]], baseline: int = 0) -> PeakBreakdown:
    """Replay one device's allocator trace (`torch.cuda.memory._snapshot()["device_traces"][i]`): the
    peak of the running sum of allocations minus frees, and the live allocations at it, grouped."""
    live: dict[int, Mapping[str, Any]] = {}
    now = best = 0
    best_live: dict[int, Mapping[str, Any]] = {}
    for event in trace:
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            live[addr] = event
            now += int(event["size"])
            if now > best:
                best, best_live = now, dict(live)
        elif action in ("free_requested", "free_completed") and addr in live:
            now -= int(live.pop(addr)["size"])
    groups: dict[str, list[int]] = {}
    for event in best_live.values():
        g = groups.setdefault(_frame(event.get("frames", ())), [0, 0])
        g[0] += int(event["size"])
        g[1] += 1
    ordered = sorted((PeakGroup(f, b, c) for f, (b, c) in groups.items()), key=lambda g: -g.nbytes)
    return PeakBreakdown(baseline=baseline, peak=best, groups=tuple(ordered))


@dataclass(frozen=True)
class Timeline:
    """Bytes allocated during a call, over its time: `t_ms[i]` from the first event (the allocator's own
    clock; the event's position where a trace has no times) and `nbytes[i]` on top of `baseline`. Long
    traces are reduced to one sample per time bucket, each the bucket's highest value, so `peak` (the
    highest of the whole trace) is always one of the samples."""

    baseline: int
    t_ms: tuple[float, ...]
    nbytes: tuple[int, ...]

    @property
    def peak(self) -> int:
        return max(self.nbytes, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "peak": self.peak, "t_ms": list(self.t_ms), "nbytes": list(self.nbytes)}


def allocated_over_time(trace: Iterable[Mapping[str, Any]], baseline: int = 0, points: int = 500) -> Timeline:
    """Replay an allocator trace (as `live_at_peak` does) into the running bytes allocated after each
    alloc or free, reduced to at most `points` samples (each time bucket's highest value)."""
    if points < 1:
        raise ValueError(f"points must be >= 1 (got {points})")
    events = list(trace)
    timed = bool(events) and all("time_us" in e for e in events)  # µs on the allocator's clock
    sizes: dict[int, int] = {}
    now = 0
    series: list[tuple[float, int]] = []
    for i, event in enumerate(events):
        action, addr = event.get("action"), event.get("addr")
        if action == "alloc":
            sizes[addr] = int(event["size"])
            now += sizes[addr]
        elif action in ("free_requested", "free_completed") and addr in sizes:
            now -= sizes.pop(addr)
        else:
            continue
        series.append((float(event["time_us"]) * 1e-3 if timed else float(i), now))
    if not series:
        return Timeline(baseline, (), ())
    start, span = series[0][0], series[-1][0] - series[0][0]
    buckets: dict[int, tuple[float, int]] = {}
    for t, nbytes in series:
        b = min(int((t - start) / span * points), points - 1) if span > 0 else 0
        if b not in buckets or nbytes > buckets[b][1]:
            buckets[b] = (t, nbytes)
    kept = [buckets[b] for b in sorted(buckets)]
    return Timeline(baseline, tuple(t - start for t, _ in kept), tuple(n for _, n in kept))


def record_trace(fn: Callable[[], Any], device: torch.device | str | None = None,
                 max_entries: int = 1_000_000) -> tuple[int, list[dict[str, Any]]]:
    """Run `fn()` once on CUDA with the allocator's history recorded (Python stacks): (the bytes allocated
    before the call, the call's allocator trace). Raises ValueError off CUDA, where there is no such trace."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device: the allocator trace is CUDA's (got {dev})")
    torch.cuda.synchronize(dev)
    baseline = torch.cuda.memory_allocated(dev)
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        fn()
        torch.cuda.synchronize(dev)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return baseline, snapshot["device_traces"][dev.index]


def record_peak(fn: Callable[[], Any], device: torch.device | str | None = None,
                max_entries: int = 1_000_000) -> PeakBreakdown:
    """What was live at the peak of one call of `fn()` on CUDA (`record_trace`, then `live_at_peak`)."""
    baseline, trace = record_trace(fn, device, max_entries)
    return live_at_peak(trace, baseline)


__all__ = ["PeakBreakdown", "PeakGroup", "Timeline", "allocated_over_time", "live_at_peak", "record_peak",
           "record_trace"]
