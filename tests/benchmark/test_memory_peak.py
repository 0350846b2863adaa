"""live_at_peak on a hand-written allocator trace (the CUDA recording itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.benchmark.memory_peak import live_at_peak, record_peak


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_record_peak_needs_cuda() -> None:
    with pytest.raises(ValueError, match="device must be a CUDA device"):
        record_peak(lambda: None, "cpu")


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
