"""Where a profiled training step's time goes: the kernels by device time, the gaps where the device sat
idle between kernels, and the host's side of a synchronised step."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from e2e.models import sync


def kernel_gaps(kernels: list[tuple[float, float, str]]) -> tuple[float, float, list[tuple[float, str, str]]]:
    """From (start us, end us, name) of each kernel of a profiled span (at least one): the span, the time
    some kernel ran (overlaps merged) and each gap between kernels as (us, the kernel before, the one after)."""
    kernels = sorted(kernels)
    busy, gaps = 0.0, []
    run_start, run_end, last = kernels[0][0], kernels[0][1], kernels[0][2]
    for start, end, name in kernels[1:]:
        if start > run_end:
            busy += run_end - run_start
            gaps.append((start - run_end, last, name))
            run_start = start
        if end >= run_end:
            run_end, last = end, name
    busy += run_end - run_start
    return run_end - kernels[0][0], busy, gaps


def idle_summary(kernels: list[tuple[float, float, str]], top: int = 12) -> str:
    """Where the device waits (`kernel_gaps`): the span, the time some kernel ran and the idle rest, then
    the longest gaps between kernels with the kernels on either side (what the host was launching when the
    device ran dry)."""
    if not kernels:
        return "device idle: no kernels recorded\n"
    span, busy, gaps = kernel_gaps(kernels)
    gaps.sort(key=lambda g: -g[0])
    long_gaps = sum(g[0] for g in gaps if g[0] >= 20)
    lines = [f"device idle: span {span / 1e3:.2f} ms, kernels running {busy / 1e3:.2f} ms, "
             f"idle {(span - busy) / 1e3:.2f} ms ({len(gaps)} gaps; {long_gaps / 1e3:.2f} ms in gaps of 20 us or more)",
             "longest gaps (us, the kernel before -> the kernel after):"]
    lines += [f"  {gap:9.1f}  {before[:70]} -> {after[:70]}" for gap, before, after in gaps[:top]]
    return "\n".join(lines) + "\n"


def kernel_intervals(prof: Any) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device-side event (kernels, copies, sets) the profiler recorded."""
    from torch.autograd import DeviceType

    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if getattr(e, "device_type", None) == DeviceType.CUDA]


def profile_steps(step: Callable[[], Any], dev: torch.device, path: Path, rows: int = 40) -> None:
    """torch.profiler over two steps: the kernels by total device (or CPU) time, as a text table, and on
    CUDA where the device sat idle between kernels (`idle_summary`)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            step()
        sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    idle = idle_summary(kernel_intervals(prof)) if dev.type == "cuda" else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("two training steps; times are totals over both\n"
                    + prof.key_averages().table(sort_by=key, row_limit=rows) + "\n" + idle)


def host_phases(forward: Callable[[], torch.Tensor], update: Callable[[], None], step: Callable[[], Any],
                dev: torch.device, reps: int = 6) -> str:
    """The host's side of a synchronised step: the wall time the host spends issuing the forward, the
    backward and the optimizer (no sync between them), then waiting for the device; and the same steps
    run back to back with one sync at the end. When issuing takes about as long as the step, or the
    back-to-back step is much shorter than the synchronised one, the device waits on the host."""
    rows = []
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        update()
        t3 = time.perf_counter()
        sync(dev)
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
    med = [statistics.median(col) * 1e3 for col in zip(*rows)]
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    sync(dev)
    back_to_back = (time.perf_counter() - t0) * 1e3 / reps
    return (f"host per synchronised step (median of {reps}, ms): issuing forward {med[0]:.2f}, backward {med[1]:.2f}, "
            f"optimizer {med[2]:.2f}; then waiting for the device {med[3]:.2f}; step {med[4]:.2f}\n"
            f"{reps} steps back to back, one sync at the end: {back_to_back:.2f} ms per step\n")
