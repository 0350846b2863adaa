"""live_at_peak and allocated_over_time on hand-written allocator traces (the CUDA recording itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.benchmark.memory_peak import allocated_over_time, live_at_peak, record_peak, record_trace


def _frames(*where: tuple[str, int, str]) -> list[dict]:
    return [{"filename": f, "line": line, "name": name} for f, line, name in where]


MODEL = ("/x/transformers/models/llama/modeling_llama.py", 80, "forward")
INTERNAL = ("/x/torch/nn/modules/module.py", 1700, "_call_impl")
GENERATED = ("/tmp/torchinductor_root/ab/cab12.py", 42, "call")


def test_peak_is_the_highest_running_sum_and_groups_what_was_live_then() -> None:
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": _frames(INTERNAL, MODEL)},
        {"action": "alloc", "addr": 2, "size": 50, "frames": _frames(GENERATED)},
        {"action": "alloc", "addr": 3, "size": 30, "frames": _frames(INTERNAL, MODEL)},
        {"action": "free_requested", "addr": 2},
        {"action": "free_completed", "addr": 2},  # counted once
        {"action": "segment_alloc", "addr": 9, "size": 10_000},  # segments are not allocations
        {"action": "alloc", "addr": 4, "size": 10, "frames": []},
        {"action": "free_completed", "addr": 1},
    ]
    got = live_at_peak(trace, baseline=1000)
    assert (got.baseline, got.peak) == (1000, 180)
    by_frame = {g.frame: (g.nbytes, g.count) for g in got.groups}
    assert by_frame == {"models/llama/modeling_llama.py:80 in forward": (130, 2),
                        "torchinductor_root/ab/cab12.py:42 in call": (50, 1)}
    assert got.groups[0].nbytes == 130  # largest first
    text = got.table()
    assert "peak during it: +0.0 MiB" in text and "modeling_llama.py:80" in text


def test_a_free_before_any_alloc_and_no_python_frame() -> None:
    got = live_at_peak([{"action": "free_requested", "addr": 7}, {"action": "alloc", "addr": 8, "size": 4}])
    assert got.peak == 4 and got.groups[0].frame == "<no python frame>"


def test_an_allocation_with_only_torch_frames_names_the_innermost() -> None:
    autograd = ("/x/torch/autograd/graph.py", 824, "_engine_run_backward")
    got = live_at_peak([{"action": "alloc", "addr": 1, "size": 8, "frames": _frames(INTERNAL, autograd)}])
    assert got.groups[0].frame == "<torch only> nn/modules/module.py:1700 in _call_impl"


def test_timeline_is_the_running_sum_over_the_allocator_clock() -> None:
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "time_us": 5_000},
        {"action": "alloc", "addr": 2, "size": 50, "time_us": 6_000},
        {"action": "segment_alloc", "addr": 9, "size": 10_000, "time_us": 6_500},  # not an allocation
        {"action": "free_requested", "addr": 1, "time_us": 7_000},
        {"action": "free_completed", "addr": 1, "time_us": 7_100},  # counted once
        {"action": "alloc", "addr": 3, "size": 20, "time_us": 9_000},
    ]
    got = allocated_over_time(trace, baseline=7, points=100)
    assert got.t_ms == (0.0, 1.0, 2.0, 4.0)  # ms from the first event
    assert got.nbytes == (100, 150, 50, 70)
    assert got.peak == live_at_peak(trace).peak == 150
    assert got.to_dict()["baseline"] == 7 and got.to_dict()["peak"] == 150


def test_timeline_of_a_long_trace_keeps_each_buckets_highest_value_and_the_peak() -> None:
    trace, addr = [], 0
    for i in range(10_000):  # a sawtooth: 4 allocations then 4 frees, one peak of 5 in the middle
        if i % 8 < 4:
            addr += 1
            trace.append({"action": "alloc", "addr": addr, "size": 5 if i == 5_000 else 1, "time_us": i})
        else:
            trace.append({"action": "free_requested", "addr": addr - (i % 8 - 4), "time_us": i})
    got = allocated_over_time(trace, points=50)
    assert len(got.t_ms) <= 50 and list(got.t_ms) == sorted(got.t_ms)
    assert got.peak == live_at_peak(trace).peak
    assert max(got.nbytes) == got.peak and min(got.nbytes) >= 3  # every bucket holds a sawtooth's top


def test_timeline_without_times_uses_the_event_order_and_refuses_no_points() -> None:
    got = allocated_over_time([{"action": "alloc", "addr": 1, "size": 3}, {"action": "free_requested", "addr": 1}])
    assert (got.t_ms, got.nbytes) == ((0.0, 1.0), (3, 0))
    assert allocated_over_time([]).peak == 0
    with pytest.raises(ValueError, match="points must be >= 1"):
        allocated_over_time([], points=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_record_peak_needs_cuda() -> None:
    with pytest.raises(ValueError, match="device must be a CUDA device"):
        record_peak(lambda: None, "cpu")
    with pytest.raises(ValueError, match="device must be a CUDA device"):
        record_trace(lambda: None, "cpu")


@pytest.mark.cuda
def test_record_peak_on_cuda_sees_the_call() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    def call() -> None:
        a = torch.empty(2**20, device="cuda", dtype=torch.uint8)
        b = torch.empty(2**21, device="cuda", dtype=torch.uint8)
        del a, b

    got = record_peak(call)
    assert got.peak >= 3 * 2**20
    assert any("test_memory_peak.py" in g.frame for g in got.groups)
    baseline, trace = record_trace(call)
    line = allocated_over_time(trace, baseline)
    assert line.peak >= 3 * 2**20 and line.nbytes[-1] == 0 and line.t_ms[-1] > 0
