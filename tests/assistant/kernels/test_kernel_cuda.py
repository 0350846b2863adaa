"""Kernel efficiency on a GPU: measured values (kernels per step, GPU activity, achieved rates against
the measured ceilings, the verdict of both passes, an SDPA fix timed on the device). Skipped without
CUDA (see tests/conftest.py); kept consistent with the CPU tests by reading."""

from __future__ import annotations

import functools

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.assistant.findings import Report
from kernel_pytorch.models import build_model

pytestmark = pytest.mark.cuda


@functools.cache
def _report() -> Report:
    model, inputs = build_model("llama-tiny", device="cuda", dtype=torch.bfloat16)
    assistant = kp.CompilerOptimizationAssistant(
        kp.AnalysisOptions(train=True, vary_scalars=False),
        sections=["compile_time", "kernel_efficiency", "optimization_suggestions"],
    )
    return assistant.analyze_component(model, inputs, name="llama-tiny")


def test_cuda_kernel_summary_has_kernels_rates_and_ceilings() -> None:
    summaries = {f.data["run"]: f.data for f in _report().kernel_efficiency if f.id == "kernel.summary"}
    assert set(summaries) == {"eager fwd", "compiled fwd", "eager fwd+bwd", "compiled fwd+bwd"}
    for data in summaries.values():
        assert data["device_type"] == "cuda" and data["kernel_count"] >= 1 and data["kernel_ms"] > 0
        ceil = data["ceilings"]
        assert ceil is not None and ceil["copy_gbps"] > 100 and ceil["matmul_tflops"] > 1
    compiled = summaries["compiled fwd"]
    assert any(k["where"] == "generated" for k in compiled["kernels"])  # Inductor's Triton kernels
    rated = [k for k in summaries["eager fwd"]["kernels"] if k["pct_of_copy"] is not None or k["pct_of_matmul"]]
    assert rated and all(0 < (k["pct_of_matmul"] or k["pct_of_copy"]) < 200 for k in rated)
    # fewer kernels compiled than eager: Inductor fuses the elementwise ops
    assert compiled["kernel_count"] < summaries["eager fwd"]["kernel_count"]


def test_cuda_verdict_and_launch_bound_are_measured() -> None:
    report = _report()
    (verdict,) = [f for f in report.kernel_efficiency if f.id == "verdict.compile"]
    assert [p["pass"] for p in verdict.data["passes"]] == ["fwd", "fwd+bwd"]
    assert all(p["compile_s"] > 0 and p["eager_ms"] > 0 and p["compiled_ms"] > 0 for p in verdict.data["passes"])
    # the tiny Llama's kernels are a few microseconds each: the eager GPU waits on the host
    launch = [f for f in report.kernel_efficiency if f.id == "kernel.launch-bound"]
    assert launch and all(f.data["idle_fraction"] >= 0.3 and "reduce-overhead" in f.suggestion for f in launch)


def test_cuda_sdpa_repeat_kv_fix_timed_on_the_gpu() -> None:
    (gqa,) = [f for f in _report().kernel_efficiency if f.id == "kernel.sdpa-repeat-kv"]
    assert gqa.data["measured"] and gqa.data["ms_as_made"] > 0 and gqa.data["ms_fixed"] > 0
    assert gqa.data["same_output"]
