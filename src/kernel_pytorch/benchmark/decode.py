"""Timing a decode loop: the time per step of consecutive single-token steps, and the frames Dynamo
compiles meanwhile (a decode loop that recompiles per step shows up as frames compiled after warm-up).

A decode step depends on the step before it and is short enough for host launch cost to matter, so its
honest time is that of a run of consecutive steps on one stream: CUDA events around `steps` calls in a
row (launch gaps the GPU waits through are included; the L2 is not flushed, since a step reads the
weights and the cache, far more than L2 holds), divided by `steps`. With torch.compile's
mode="reduce-overhead" each call already replays a CUDA graph, so timing the call is timing the replay
plus what the compiled wrapper does on the host. `time_cuda_graph` is the figure without any host cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kernel_pytorch.benchmark.timer import Timing, resolve_device, summarize


def time_steps(step: Callable[[int], Any], *, steps: int, reps: int, warmup: int = 1,
               reset: Callable[[], Any] | None = None, device: torch.device | str | None = None) -> Timing:
    """Milliseconds per step of a decode loop.

    Args:
        step: `step(j)` runs decode step j (0 <= j < steps) of a run, e.g. the token at position start + j.
        steps: consecutive steps per run; the run's time / steps is one sample.
        reps: timed runs (samples); `warmup` untimed runs first.
        reset: called before every run, outside the timed region (on CUDA its kernels are queued before
            the start event), e.g. to rewind the cache's write position to the run's start.
        device: CUDA: events; anything else: wall clock.
    Returns:
        A `Timing` in ms per step over `reps` samples.
    """
    if steps < 1 or reps < 1:
        raise ValueError(f"steps and reps must be >= 1 (got {steps}, {reps})")
    dev = resolve_device(device)
    cuda = dev.type == "cuda"

    def run() -> None:
        for j in range(steps):
            step(j)

    for _ in range(warmup):
        if reset is not None:
            reset()
        run()
    samples: list[float] = []
    if cuda:
        with torch.cuda.device(dev):
            torch.cuda.synchronize()
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(reps)]
            for start, end in events:
                if reset is not None:
                    reset()
                start.record()
                run()
                end.record()
            torch.cuda.synchronize()
            samples = [s.elapsed_time(e) / steps for s, e in events]
        method = f"cuda events around {steps} consecutive steps, L2 warm"
    else:
        for _ in range(reps):
            if reset is not None:
                reset()
            t0 = time.perf_counter()
            run()
            samples.append((time.perf_counter() - t0) * 1e3 / steps)
        method = f"wall clock around {steps} consecutive steps ({dev.type})"
    return summarize(samples, method)


def compiled_frames() -> int:
    """Frames Dynamo has compiled in this process (first compiles and recompiles; a running count, so
    take the difference around the calls of interest)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def cudagraph_skips() -> int:
    """Times Inductor fell back from CUDA graphs (a running count, like `compiled_frames`)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


__all__ = ["compiled_frames", "cudagraph_skips", "time_steps"]
