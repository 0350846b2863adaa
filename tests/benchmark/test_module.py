"""benchmark_module on the CPU: both passes timed and measured; a pass that cannot run is reported."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernel_pytorch.benchmark.module import benchmark_module, make_pass, upstream_gradients
from tests.grid import randn


def test_both_passes_are_measured() -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    r = benchmark_module(model, (randn(16, 32),), cpu_min_run_time=0.01,
                         nbytes_per_pass={"fwd": 1e6}, flops_per_pass={"fwd": 2 * 16 * 32 * 64 * 2})
    assert set(r.passes) == {"fwd", "fwd+bwd"}
    fwd, bwd = r.passes["fwd"], r.passes["fwd+bwd"]
    assert fwd.error is None and bwd.error is None
    assert 0 < fwd.timing.median_ms and 0 < bwd.timing.median_ms
    assert fwd.memory.peak_bytes is not None and bwd.memory.peak_bytes >= fwd.memory.peak_bytes
    assert fwd.roofline.gbps == pytest.approx(1e6 / (fwd.timing.median_ms * 1e-3) / 1e9)
    assert "fwd+bwd" in str(r) and r.to_dict()["passes"]["fwd"]["timing"]["median_ms"] > 0


def test_a_pass_without_gradients_is_reported_not_raised() -> None:
    class Ids(nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return ids * 2

    r = benchmark_module(Ids(), (torch.arange(8),), cpu_min_run_time=0.01)
    assert r.passes["fwd"].error is None
    assert "fwd+bwd needs" in r.passes["fwd+bwd"].error


def test_fwd_bwd_differentiates_inputs_and_parameters_with_a_fixed_gradient() -> None:
    lin = nn.Linear(4, 3)
    x = randn(2, 4)
    grads = make_pass(lin, (x,), "fwd+bwd", seed=7)()
    g = upstream_gradients([torch.empty(2, 3)], 7)[0]
    assert torch.allclose(grads[0], g @ lin.weight)  # d input
    assert torch.allclose(grads[1], g.t() @ x)  # d weight
    assert lin.weight.grad is None  # autograd.grad: nothing accumulates
    with pytest.raises(ValueError):
        make_pass(lin, (x,), "bwd")


@pytest.mark.cuda
def test_cuda_rotation_and_graph_replay() -> None:
    lin = nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = randn(64, 1024, dtype=torch.bfloat16, device="cuda")
    r = benchmark_module(lin, (x,), rotate=True, cuda_graph=True)
    for p in r.passes.values():
        assert p.error is None and p.graph_error is None, (p.error, p.graph_error)
        assert "input copies" in p.timing.method and "cuda graph" in p.graph_timing.method
        assert p.memory.peak_bytes >= x.numel() * 2


def test_pass_closure_with_ones_passes_a_losss_upstream_gradient() -> None:
    """ones=True: d(loss)/dx as loss.backward() gives it; the default draws a fixed random upstream."""
    from kernel_pytorch.benchmark.module import pass_closure

    x = randn(4, 3).requires_grad_()
    (g_ones,) = pass_closure(lambda: (x * x).sum(), [x], "fwd+bwd", ones=True)()
    assert torch.equal(g_ones, 2 * x.detach())
    (g_rand,) = pass_closure(lambda: (x * x).sum(), [x], "fwd+bwd", seed=3)()
    assert not torch.equal(g_rand, g_ones)
