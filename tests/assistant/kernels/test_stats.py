"""Kernel statistics from torch.profiler: work attributed per op, placement, GPU busy time, the merged
Chrome trace, and the CPU ops of a real profiled run."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.assistant.kernels.profiler import profile_steps
from kernel_pytorch.assistant.kernels.stats import cpu_kernels, gpu_activity, op_cost, place
from kernel_pytorch.assistant.kernels.traces import merge_traces


def test_op_cost_of_matmuls_convolutions_attention_norms_elementwise() -> None:
    assert op_cost("aten::mm", [[8, 16], [16, 4]], ["float", "float"]) == (2 * 8 * 4 * 16, 4 * (128 + 64 + 32))
    flops, nbytes = op_cost("aten::addmm", [[4], [8, 16], [16, 4]], ["float"] * 3)
    assert flops == 2 * 8 * 4 * 16 and nbytes == 4 * (4 + 128 + 64 + 32)
    assert op_cost("aten::bmm", [[2, 8, 16], [2, 16, 4]], ["c10::BFloat16"] * 2)[0] == 2 * 2 * 8 * 4 * 16
    # convolution: its output size from stride/padding/dilation
    conv = op_cost("aten::convolution", [[1, 3, 8, 8], [6, 3, 3, 3], [6]], ["float"] * 3,
                   [None, None, None, [1, 1], [1, 1], [1, 1]])
    assert conv[0] == 2.0 * (1 * 6 * 8 * 8) * 3 * 9
    q = [2, 4, 32, 16]
    sdpa = op_cost("aten::_scaled_dot_product_flash_attention_for_cpu", [q, q, q], ["float"] * 3)
    assert sdpa[0] == 4.0 * 2 * 4 * 32 * 32 * 16
    assert op_cost("aten::native_layer_norm", [[4, 64], [], [64], [64]], ["float", "", "float", "float"])[0] == 5 * 256
    assert op_cost("aten::add", [[4, 8], [4, 8], []], ["float", "float", "Scalar"]) == (32, 4 * 96)
    assert op_cost("aten::mm", [[8, 16], [4, 4]], ["float"] * 2) == (None, None)  # shapes that do not multiply


def test_placement() -> None:
    assert place("triton_poi_fused_add_0", True) == "generated"
    assert place("aten::mm", False) == "eager"
    assert place("aten::mm", True) == "extern"
    assert place("aten::nonzero", True) == "fallback"


def test_gpu_activity_counts_idle_gaps_between_kernels() -> None:
    act = gpu_activity([(0.0, 10.0), (5.0, 15.0), (35.0, 40.0)], steps=1)
    assert act is not None
    assert act.busy_ms == pytest.approx(0.020) and act.span_ms == pytest.approx(0.040)
    assert act.idle_fraction == pytest.approx(0.5)
    assert gpu_activity([], 1) is None


def test_cpu_profile_lists_the_ops_doing_work_per_step(tmp_path) -> None:
    lin = torch.nn.Linear(32, 64)
    x = torch.randn(16, 32)
    with torch.no_grad():
        run = profile_steps(lambda: torch.relu(lin(x)), 3, "cpu", "eager", "fwd", str(tmp_path))
    ops = {k.base_op for k in run.kernels}
    assert "addmm" in ops and ops & {"relu", "clamp_min"}  # relu runs as clamp_min below it
    assert "linear" not in ops  # dispatch around addmm, not a kernel of its own
    addmm = next(k for k in run.kernels if k.base_op == "addmm")
    assert addmm.calls == 1 and addmm.flops == 2 * 16 * 64 * 32 and addmm.where == "eager"
    assert run.kernel_count == pytest.approx(sum(k.calls for k in run.kernels)) and run.trace is not None
    assert cpu_kernels([], 1) == ()


def test_merge_traces_keeps_each_run_apart() -> None:
    a = {"traceEvents": [{"ph": "X", "name": "k", "pid": 7, "tid": 1, "ts": 100.0, "dur": 5.0},
                         {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "CPU"}}]}
    b = {"traceEvents": [{"ph": "X", "name": "k", "pid": 7, "tid": 1, "ts": 50.0, "dur": 5.0}]}
    merged = merge_traces([("eager fwd", a), ("compiled fwd", b)])
    xs = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    assert xs[0]["pid"] != xs[1]["pid"] and xs[1]["ts"] > xs[0]["ts"] + xs[0]["dur"]
    names = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert "eager fwd: CPU" in names and any(n.startswith("compiled fwd") for n in names)
    assert merged["otherData"]["runs"] == ["eager fwd", "compiled fwd"]


def test_profiler_events_without_dtypes_count_bytes_at_the_models_dtype() -> None:
    """torch releases before 2.13 record no input dtypes on FunctionEvent: the model's dtype stands in."""

    class OldEvent:  # what such a release's FunctionEvent offers: shapes, no input_dtypes
        name, input_shapes, concrete_inputs, kwinputs = "aten::mm", [[16, 32], [32, 64]], [], {}
        cpu_parent, cpu_children, kernels, device_type = None, [], [], None
        self_cpu_time_total = cpu_time_total = 10.0

    from kernel_pytorch.assistant.kernels.stats import _Merge

    for dtype, size in ((torch.bfloat16, 2), (torch.float32, 4)):
        merge = _Merge(dtype)
        merge.add("aten::mm", OldEvent(), 10.0, "eager")
        (stat,) = merge.stats(1)
        assert stat.flops == 2 * 16 * 64 * 32 and stat.nbytes == (16 * 32 + 32 * 64 + 16 * 64) * size
    merge = _Merge()
    merge.add("aten::mm", OldEvent(), 10.0, "eager")
    assert merge.stats(1)[0].nbytes is None  # no dtype known: no byte count rather than a guess
