"""The timer's statistics and speedup maths, its CPU path, and (on a GPU) events, flushing and graphs."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.benchmark.graph_timer import GRAPH_BUDGET_MS, graph_plan, time_cuda_graph
from kernel_pytorch.benchmark.memory import CUDA_METHOD, peak_memory
from kernel_pytorch.benchmark.timer import Timing, rotation_copies, speedup, summarize, time_fn


def test_summarize_median_and_quantiles() -> None:
    t = summarize([5.0, 1.0, 4.0, 2.0, 3.0], "test")
    assert (t.median_ms, t.min_ms, t.max_ms, t.reps) == (3.0, 1.0, 5.0, 5)
    # linear interpolation over the sorted samples 1..5: q20 at position 0.8, q80 at 3.2
    assert t.q20_ms == pytest.approx(1.8) and t.q80_ms == pytest.approx(4.2)
    assert t.spread_ms == pytest.approx(2.4)
    assert Timing.from_dict(t.to_dict()) == t
    assert summarize([2.5], "one").q20_ms == 2.5
    with pytest.raises(ValueError):
        summarize([], "none")


def test_speedup_is_baseline_over_candidate_with_crossed_bands() -> None:
    base = Timing(median_ms=2.0, q20_ms=1.8, q80_ms=2.4, min_ms=1.5, max_ms=3.0, reps=10, method="x")
    cand = Timing(median_ms=1.0, q20_ms=0.9, q80_ms=1.2, min_ms=0.8, max_ms=1.5, reps=10, method="x")
    mid, low, high = speedup(base, cand)
    assert mid == pytest.approx(2.0)
    assert low == pytest.approx(1.8 / 1.2) and high == pytest.approx(2.4 / 0.9)
    back, _, _ = speedup(cand, base)
    assert back == pytest.approx(0.5)


@pytest.fixture
def one_thread():
    # with two OpenMP threads on a busy two-core machine, barrier waits swamp small kernels
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_cpu_timing_orders_work_and_rotates_inputs(one_thread: None) -> None:
    small, big = torch.randn(32, 32), torch.randn(512, 512)
    t_small = time_fn(lambda: small @ small, device="cpu", cpu_min_run_time=0.02)
    t_big = time_fn(lambda: big @ big, device="cpu", cpu_min_run_time=0.02)
    assert 0 < t_small.median_ms < t_big.median_ms
    assert "cpu" in t_small.method
    calls = [0, 0]

    def make(i: int):
        def f() -> None:
            calls[i] += 1
        return f

    t = time_fn([make(0), make(1)], device="cpu", cpu_min_run_time=0.01)
    assert calls[0] > 1 and calls[1] > 1 and abs(calls[0] - calls[1]) <= 1
    assert "2 input copies" in t.method
    assert rotation_copies(10**6, "cpu") == 1
    with pytest.raises(TypeError):
        time_fn([], device="cpu")


def test_graph_plan_bounds_the_replaying_of_slow_calls() -> None:
    # no estimate, or fast calls: 20 calls per graph (whole rounds of the copies), 50 replays
    assert graph_plan(None, 1) == (20, 50) and graph_plan(None, 3) == (21, 50)
    assert graph_plan(0.01, 32) == (32, 50)
    # a 50 ms call over 2 copies: one round per graph, replays within the budget (was 20 x 53 calls)
    calls, replays = graph_plan(50.0, 2)
    assert calls == 2 and replays == int(GRAPH_BUDGET_MS / 100.0)
    assert calls * replays * 50.0 <= GRAPH_BUDGET_MS
    assert graph_plan(1000.0, 1) == (1, 5)  # never fewer than 5 replays
    assert graph_plan(0.1, 1) == (10, 50)  # a replay of >= 1 ms: its own launch stays negligible


def test_cpu_peak_memory_sees_a_known_allocation() -> None:
    n = 1 << 20
    m = peak_memory(lambda: torch.empty(n, dtype=torch.uint8).fill_(1), "cpu")
    assert m.peak_bytes is not None and m.peak_bytes >= n
    assert "cpu" in m.method


@pytest.mark.cuda
def test_cuda_events_scale_with_work_and_graphs_remove_launch_cost() -> None:
    x = torch.randn(4096, 4096, device="cuda")
    one = time_fn(lambda: x.mul_(1.0), device="cuda")
    four = time_fn(lambda: [x.mul_(1.0) for _ in range(4)], device="cuda")
    assert "cuda events" in one.method and "L2 flushed" in one.method
    assert 3.0 < four.median_ms / one.median_ms < 5.0
    tiny = torch.randn(16, device="cuda")
    eager = time_fn(lambda: tiny.add_(1.0), device="cuda", flush_l2=False)
    graph = time_cuda_graph(lambda: tiny.add_(1.0), device="cuda")
    assert "cuda graph" in graph.method and graph.reps == 50
    # per call, not per replay of the 20 captured calls; and no launch gaps to inflate it
    assert 0 < graph.median_ms < 2 * eager.median_ms


@pytest.mark.cuda
def test_cuda_rotation_and_peak_memory() -> None:
    from kernel_pytorch.benchmark.timer import l2_cache_bytes

    dev = torch.device("cuda")
    assert rotation_copies(1 << 20, dev) == min(32, -(-2 * l2_cache_bytes(dev) // (1 << 20)))
    assert rotation_copies(1 << 32, dev) == 1
    assert rotation_copies(1 << 20, dev, max_total_bytes=3 << 20) == 3  # the copies' bytes bounded
    n = 64 << 20
    m = peak_memory(lambda: torch.empty(n, dtype=torch.uint8, device=dev), dev)
    assert m.method == CUDA_METHOD and n <= m.peak_bytes < n + (2 << 20)


class _FakeGraph:
    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1


class _FakeStream:
    def wait_stream(self, other: object) -> None:
        return None


class _FakeCapture:
    """torch.cuda.graph as a failing capture behaves: capture_end raises too, skipping the stream's exit."""

    def __init__(self, graph: _FakeGraph, pool: object) -> None:
        self.pool = pool

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


@pytest.mark.parametrize("torch_ends_the_capture", [False, True])
def test_a_failed_capture_frees_its_pool_and_restores_the_stream(monkeypatch: pytest.MonkeyPatch,
                                                                 torch_ends_the_capture: bool) -> None:
    """The CUDA calls stubbed: the failure path's logic runs here. Where torch left the allocator routing
    into the pool (the end call succeeds), the pool is released by us; where torch ended it, not again."""
    import contextlib

    import kernel_pytorch.benchmark.graph_timer as T

    calls: dict[str, list] = {"set_stream": [], "end": [], "release": [], "empty_cache": []}
    graphs: list[_FakeGraph] = []
    caller = _FakeStream()

    def new_graph() -> _FakeGraph:
        graphs.append(_FakeGraph())
        return graphs[-1]

    def end(device: int, pool: object) -> None:
        calls["end"].append(pool)
        if torch_ends_the_capture:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    cuda = torch.cuda
    for name, value in {
        "device": lambda dev: contextlib.nullcontext(), "stream": lambda s: contextlib.nullcontext(),
        "current_stream": lambda: caller, "Stream": _FakeStream,
        "synchronize": lambda: None, "CUDAGraph": new_graph, "graph_pool_handle": lambda: ("pool", 7),
        "graph": _FakeCapture, "set_stream": lambda s: calls["set_stream"].append(s),
        "empty_cache": lambda: calls["empty_cache"].append(True),
    }.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda d, p: calls["release"].append(p), raising=False)

    warmed: list[int] = []

    def sync_in_capture() -> None:
        warmed.append(1)
        if len(warmed) > 2:  # two warm-up calls pass, the captured one syncs
            raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="capture failed: RuntimeError: operation not permitted") as info:
        T.time_cuda_graph(sync_in_capture, device=torch.device("cuda", 0))
    assert info.value.__cause__ is None and info.value.__context__ is None  # no frames kept alive
    assert calls["set_stream"] == [caller] and graphs[0].resets == 1
    assert calls["end"] == [("pool", 7)] and calls["empty_cache"] == [True]
    assert calls["release"] == ([] if torch_ends_the_capture else [("pool", 7)])
