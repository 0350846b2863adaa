"""What is live at the peak of a call, read from the CUDA caching allocator's own trace.

`torch.cuda.memory._record_memory_history` logs every allocation and free with the Python stack that
made it; `live_at_peak` replays that trace, finds the moment the bytes allocated during the call were
highest, and groups what was live then by the frame that allocated it (the first frame outside torch's
own Python: a model's line, one of our functional/ops files, Inductor's generated code), largest first.
What was allocated before recording started (weights, optimizer state) is the baseline, one number.
`record_peak(fn)` does the recording around one call on CUDA.
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


def record_peak(fn: Callable[[], Any], device: torch.device | str | None = None,
                max_entries: int = 1_000_000) -> PeakBreakdown:
    """Run `fn()` once on CUDA with the allocator's history recorded (Python stacks) and return what was
    live at its peak. Raises ValueError off CUDA, where there is no such allocator trace."""
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
    return live_at_peak(snapshot["device_traces"][dev.index], baseline)


__all__ = ["PeakBreakdown", "PeakGroup", "live_at_peak", "record_peak"]
