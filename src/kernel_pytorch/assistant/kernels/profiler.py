"""One run of a model step under torch.profiler, reduced to kernel statistics (`stats`): what the eager
and the compiled model run per step, and the run's Chrome trace when one was asked for (`traces`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kernel_pytorch.assistant.kernels.stats import GpuActivity, KernelStat, cpu_kernels, cuda_kernels


@dataclass(frozen=True)
class ProfiledRun:
    """One run of several steps under torch.profiler.

    Attributes:
        label: "eager" or "compiled".
        pass_name: "fwd" or "fwd+bwd".
        device_type: "cuda" or "cpu".
        steps: steps profiled (every number below is per step).
        wall_ms: wall time per step under the profiler (its overhead included).
        kernels: the kernels (CPU: the ops doing the work), slowest first; see `stats`.
        gpu: how busy the GPU was (CUDA only).
        trace: the exported Chrome trace, when one was asked for.
    """

    label: str
    pass_name: str
    device_type: str
    steps: int
    wall_ms: float
    kernels: tuple[KernelStat, ...]
    gpu: GpuActivity | None = None
    trace: str | None = None

    @property
    def kernel_count(self) -> float:
        """Kernels launched per step (CPU: op calls doing work)."""
        return sum(k.calls for k in self.kernels)

    @property
    def kernel_ms(self) -> float:
        """Time per step inside those kernels."""
        return sum(k.ms for k in self.kernels)


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    # Kineto prints a profiler_start/profiler_stop line on stderr per run unless told otherwise; a
    # value the user set is kept
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    yield


_STEP = "kernel_pytorch.profiled_step"  # the marker around each profiled step


def profile_steps(fn: Callable[[], Any], steps: int, device_type: str, label: str, pass_name: str,
                  trace_dir: str | None = None, dtype: torch.dtype | None = None) -> ProfiledRun:
    """`steps` calls of `fn` under torch.profiler (record_shapes=True), reduced to kernel statistics.

    Args:
        fn: one step, already warm (compiled, first calls done).
        steps: how many steps to count (one more runs first, not counted); every number of the
            result is per counted step.
        device_type: "cuda" adds CUDA activity (kernels on the GPU).
        label, pass_name: what the run is ("eager"/"compiled", "fwd"/"fwd+bwd").
        trace_dir: write the Chrome trace there as "<label> <pass>.json".
        dtype: the model's, for the byte counts where this torch's profiler records no input dtypes.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    with _quiet_kineto(), profile(activities=activities, record_shapes=True) as prof:
        # one step more, not counted: the profiler's start-up lands in the first op it records (on a
        # CPU, tens of ms in a matmul that takes microseconds), which would make the ops' time per
        # step exceed the step
        with record_function(_STEP):
            fn()
        if device_type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            with record_function(_STEP):
                fn()
        if device_type == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / steps
    events = list(prof.events())
    marks = sorted(float(e.time_range.start) for e in events if e.name == _STEP)
    if len(marks) > 1:  # the counted steps: everything from the second step's start on
        events = [e for e in events if float(e.time_range.start) >= marks[1]]
    gpu = None
    if device_type == "cuda":
        kernels, gpu = cuda_kernels(events, steps, dtype)
    else:
        kernels = cpu_kernels(events, steps, dtype)
    trace = None
    if trace_dir is not None:
        trace = os.path.join(trace_dir, f"{label} {pass_name}.json")
        prof.export_chrome_trace(trace)
    return ProfiledRun(label, pass_name, device_type, steps, wall, kernels, gpu, trace)


__all__ = ["ProfiledRun", "profile_steps"]
