"""Timing a callable replayed from a CUDA graph: no CPU launch cost and no L2 flush, so the figure beside
the event-timed one (`timer.time_fn`) says what launching costs. The graph's size and the replays are
planned from one call's time (`graph_plan`), and a failed capture gives its memory and the caller's
stream back whatever torch version runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from kernel_pytorch.benchmark.timer import Fn, Timing, callables, free_device_memory, resolve_device, summarize

# CUDA-graph timing: about this much replaying per timed callable, however slow one call is (20 calls
# per graph x 53 replays of a 100 ms call would be 106 s), and replays of at least this long (a
# replay's own launch, a few us, then stays under 1%).
GRAPH_BUDGET_MS = 2000.0
GRAPH_MIN_REPLAY_MS = 1.0
GRAPH_MIN_REPLAYS = 5


def graph_plan(call_ms: float | None, n_fns: int, calls_per_graph: int = 20, replays: int = 50,
               budget_ms: float = GRAPH_BUDGET_MS) -> tuple[int, int]:
    """(calls captured in one graph, timed replays) for `time_cuda_graph`.

    Without an estimate of one call's time: `calls_per_graph` rounded up to a multiple of `n_fns`, and
    `replays`. With one (`call_ms`, e.g. the median of the eager timing just taken): no more calls per
    graph than make a replay last GRAPH_MIN_REPLAY_MS (at least one round of the rotated copies), and no
    more replays than fit in `budget_ms` (at least GRAPH_MIN_REPLAYS): a slow call is replayed a few
    times, not a thousand.
    """
    rounds = math.ceil(max(calls_per_graph, n_fns) / n_fns)
    if call_ms is not None and call_ms > 0:
        rounds = max(1, min(rounds, math.ceil(GRAPH_MIN_REPLAY_MS / (call_ms * n_fns))))
        replays = max(GRAPH_MIN_REPLAYS, min(replays, int(budget_ms / (rounds * n_fns * call_ms))))
    return rounds * n_fns, replays


def time_cuda_graph(
    fn: Fn | Sequence[Fn],
    *,
    device: torch.device | str | None = None,
    calls_per_graph: int = 20,
    replays: int = 50,
    call_ms: float | None = None,
    budget_ms: float = GRAPH_BUDGET_MS,
) -> Timing:
    """Time per call when `fn` is replayed from a CUDA graph (no CPU launch cost, no L2 flush).

    The graph holds `calls_per_graph` calls (rotating over `fn` when it is a sequence, so rotate
    enough copies to exceed L2 for a cold-cache figure); each replay is timed with events and divided
    by the calls it holds. Given `call_ms`, fewer calls and replays where calls are slow (`graph_plan`).
    The graph and its memory are released before returning, on failure too.

    Args:
        fn: zero-argument callable(s) whose CUDA work is capturable (static shapes, no host syncs).
        device: a CUDA device (default: the current one).
        calls_per_graph: calls captured in one graph (rounded up to a multiple of len(fn)).
        replays: timed replays.
        call_ms: an estimate of one call's time (e.g. its eager median), or None.
        budget_ms: with `call_ms`, about how long the replays may take in all.
    Raises:
        RuntimeError: capture failed (the message says why), or no CUDA device.
    """
    fns = callables(fn)
    dev = resolve_device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise RuntimeError("CUDA-graph replay needs a CUDA device")
    n_calls, replays = graph_plan(call_ms, len(fns), calls_per_graph, replays, budget_ms)
    failure = None
    with torch.cuda.device(dev):
        caller_stream = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(caller_stream)
        # warm-up on a side stream, as capture requires (autograd and the allocator set up lazily)
        with torch.cuda.stream(side):
            for _ in range(2):
                for f in fns:
                    f()
        caller_stream.wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()  # the graph's own pool, named so a failed capture can free it
        first_error = None
        try:
            with torch.cuda.graph(graph, pool=pool):
                try:
                    for i in range(n_calls):
                        fns[i % len(fns)]()
                except Exception as exc:
                    # the cause (a host sync, say): capture_end's own error would replace it
                    first_error = f"{type(exc).__name__}: {exc}"
                    raise
        except Exception as exc:
            # only the message leaves: the exception's frames would keep the graph and the captured
            # tensors alive until a garbage collection happens to run
            failure = f"CUDA-graph capture failed: {first_error or f'{type(exc).__name__}: {exc}'}"
        if failure is None:
            try:
                samples = _replay(graph, replays, n_calls)
            finally:
                graph.reset()
        else:
            _abandon_capture(graph, pool, dev, caller_stream)
        del graph
    if failure is not None:
        free_device_memory(dev)
        raise RuntimeError(failure)
    copies = f", {len(fns)} input copies" if len(fns) > 1 else ""
    return summarize(samples, f"cuda graph replay ({n_calls} calls per graph{copies})")


def _abandon_capture(graph: torch.cuda.CUDAGraph, pool: Any, dev: torch.device,
                     caller_stream: torch.cuda.Stream) -> None:
    """Undo what a failed capture leaves behind, whichever torch version runs.

    A capture_end that raised skips restoring the caller's stream. Where it raised before ending the
    allocator's routing into the graph's pool (torch releases that pool in CUDAGraph.reset only after a
    finished capture in some versions), the allocator still counts a capture as underway, which defers
    every later free's stream events, and the pool is never released: the memory stays reserved for the
    rest of the process (a suite's later rows ran out of memory that way). Ending the routing succeeds
    only in that case (torch raises "not currently recording" otherwise), and then the pool is ours to
    release.
    """
    torch.cuda.set_stream(caller_stream)
    try:
        graph.reset()
    except Exception:  # a half-made graph may refuse; the pool is handled below
        pass
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if end is None or release is None:
        return
    try:
        end(dev.index, pool)
    except Exception:  # torch ended the capture itself, and reset() released the pool
        return
    try:
        release(dev.index, pool)
    except Exception:  # released already: nothing left to free
        pass


def _replay(graph: torch.cuda.CUDAGraph, replays: int, n_calls: int) -> list[float]:
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / n_calls for s, e in zip(starts, ends)]


__all__ = ["GRAPH_BUDGET_MS", "GRAPH_MIN_REPLAYS", "GRAPH_MIN_REPLAY_MS", "graph_plan", "time_cuda_graph"]
