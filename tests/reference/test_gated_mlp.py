"""The gated MLP references with Falcon-H1's multipliers, on CPU: `gated_mlp` against transformers'
FalconH1MLP (output and every gradient), `gated_down` and its backward against autograd in fp64, and the
multipliers' rounding as torch's `tensor * float`."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.reference.gated_act import scaled
from kernel_pytorch.reference.mlp import linear
from tests.grid import randn
from tests.ops.act_helpers import gate_input
from tests.ops.norm_helpers import assert_close

transformers = pytest.importorskip("transformers")

H, I = 16, 24  # noqa: E741
MULTIPLIERS = [(0.7, 1.9), (1.9, 0.7)]


def _falcon_h1_mlp(gate_m: float, down_m: float, dtype: torch.dtype, bias: bool = False) -> torch.nn.Module:
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Config, FalconH1MLP

    torch.manual_seed(0)
    config = FalconH1Config(hidden_size=H, intermediate_size=I, mlp_multipliers=[gate_m, down_m], mlp_bias=bias)
    return FalconH1MLP(config).to(dtype)


@pytest.mark.parametrize(("gate_m", "down_m"), MULTIPLIERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gated_mlp_is_falcon_h1_mlp(dtype: torch.dtype, gate_m: float, down_m: float) -> None:
    """Output, dx and every weight gradient within the table of FalconH1MLP's eager autograd."""
    hf = _falcon_h1_mlp(gate_m, down_m, dtype, bias=True)
    x = randn(2, 3, H, dtype=dtype).requires_grad_()
    params = [hf.gate_proj.weight, hf.up_proj.weight, hf.down_proj.weight]
    biases = {"gate_bias": hf.gate_proj.bias, "up_bias": hf.up_proj.bias, "down_bias": hf.down_proj.bias}
    want = hf(x)
    got = R.gated_mlp(x, *params, "silu", **biases, gate_multiplier=gate_m, down_multiplier=down_m)
    assert_close(got, want, "y")
    dy = randn(*want.shape, dtype=dtype)
    wrt = [x, *params, *biases.values()]
    for i, (g, e) in enumerate(zip(torch.autograd.grad(got, wrt, dy), torch.autograd.grad(want, wrt, dy))):
        assert_close(g, e, f"grad {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_rounds_as_torch_does(dtype: torch.dtype) -> None:
    t = randn(64, 33, dtype=dtype, scale=3.0)
    for m in (0.7, 1.9, 0.8838834764831844):
        assert torch.equal(scaled(t, m), t * m)
    assert scaled(t, 1.0) is t


@pytest.mark.parametrize(("gate_m", "down_m"), MULTIPLIERS)
def test_gated_down_backward_is_its_gradient(gate_m: float, down_m: float) -> None:
    gate_up = torch.cat([gate_input(5, I, dtype=torch.float64, device="cpu"),
                         randn(5, I, dtype=torch.float64)], -1).requires_grad_()
    weight = randn(H, I, dtype=torch.float64, scale=I ** -0.5).requires_grad_()
    bias = randn(H, dtype=torch.float64).requires_grad_()
    dy = randn(5, H, dtype=torch.float64)
    y = R.gated_down_packed(gate_up, weight, bias, "gelu_tanh", gate_m, down_m)
    want = torch.autograd.grad(y, (gate_up, weight, bias), dy)
    got = R.gated_down_packed_backward(dy, gate_up.detach(), weight.detach(), "gelu_tanh", gate_m, down_m, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_gated_mlp_is_linears_around_gated_down() -> None:
    """gated_mlp = gated_down of the gate/up projections, multipliers included, bit for bit."""
    x = randn(2, 3, H, dtype=torch.bfloat16)
    wg, wu = randn(I, H, dtype=torch.bfloat16, scale=H ** -0.5), randn(I, H, dtype=torch.bfloat16, scale=H ** -0.5)
    wd = randn(H, I, dtype=torch.bfloat16, scale=I ** -0.5)
    want = R.gated_down(linear(x, wg), linear(x, wu), wd, None, "silu", 0.7, 1.9)
    assert torch.equal(R.gated_mlp(x, wg, wu, wd, "silu", gate_multiplier=0.7, down_multiplier=1.9), want)
    packed = torch.cat([wg, wu])
    assert torch.equal(R.gated_mlp_packed(x, packed, wd, "silu", gate_multiplier=0.7, down_multiplier=1.9), want)
