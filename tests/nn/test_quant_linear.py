"""nn.QuantizedLinear: from_linear within the rounding bound of the float layer, the reference's output,
state_dict round trip into an empty layer, dtype casts that leave the parts alone, gradients of x and
the bias, torch.compile(fullgraph=True) of a model of them; GatedMLP and MLP with quantized projections."""

from __future__ import annotations

import copy

import pytest
import torch

from kernel_pytorch.nn import MLP, GatedMLP, QuantizedLinear
from kernel_pytorch.reference import quant_matmul as R
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.quant_helpers import assert_matmul_close, magnitude, reference

DEV = device_under_test()
K, N = 64, 24


def _linear(dtype: torch.dtype = torch.float32, bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(K, N, bias=bias, device=DEV, dtype=dtype)


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_from_linear_within_the_rounding_bound(scheme: str) -> None:
    """|y_q - y| <= sum_k |x_k| x (half a step of W[n, k]) (+ fp32's own roundings)."""
    linear = _linear()
    layer = QuantizedLinear.from_linear(linear, scheme, group_size=32)
    assert layer.bias is linear.bias and layer.qweight.device == linear.weight.device
    x = randn(5, K, device=DEV)
    with torch.no_grad():
        err = (layer(x) - linear(x)).double().abs()
    w = linear.weight.detach().double()
    half_step = 0.5 * (1 + 2.0 ** -7) * R.rounding_step(linear.weight, scheme, 32) + 2.0 ** -21 * w.abs()
    xa = x.double().abs()
    bound = xa @ half_step.t() + 2.0 ** -18 * (xa @ w.abs().t() + linear.bias.detach().double().abs())
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float(err.max()) > 0  # quantized: not the float layer


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_matches_the_reference_and_round_trips_its_state(scheme: str) -> None:
    layer = QuantizedLinear.from_linear(_linear(torch.bfloat16), scheme, group_size=32)
    parts = layer.parts()
    x = randn(2, 3, K, dtype=torch.bfloat16, device=DEV)
    with torch.no_grad():
        y = layer(x)
    assert_matmul_close(y, reference(scheme, x, parts, 32, layer.bias), magnitude(scheme, x, parts, 32, layer.bias),
                        K, "y")
    keys = {"qweight", "scale", "bias"} | ({"zero"} if scheme == "int4" else set())
    assert set(layer.state_dict()) == keys
    empty = QuantizedLinear(K, N, scheme=scheme, group_size=32, device=DEV, dtype=torch.bfloat16)
    empty.load_state_dict(layer.state_dict())
    with torch.no_grad():
        assert torch.equal(empty(x), y)
    assert f"scheme='{scheme}'" in repr(layer) and ("group_size=32" in repr(layer)) == (scheme == "int4")
    assert torch.equal(layer.dequantize(torch.float32), R.dequantize(parts, scheme, 32))


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_dtype_casts_leave_the_parts_alone(scheme: str) -> None:
    layer = QuantizedLinear.from_linear(_linear(), scheme, group_size=32)
    dtypes = {n: t.dtype for n, t in layer.parts().items()}
    scale = layer.scale.clone()
    layer.to(torch.bfloat16)
    assert {n: t.dtype for n, t in layer.parts().items()} == dtypes and torch.equal(layer.scale, scale)
    assert layer.bias.dtype == torch.bfloat16 and layer.dtype == torch.bfloat16
    with torch.no_grad():
        assert layer(randn(2, K, dtype=torch.bfloat16, device=DEV)).dtype == torch.bfloat16
    assert copy.deepcopy(layer).scheme == scheme


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_gradients_reach_x_and_bias(scheme: str) -> None:
    layer = QuantizedLinear.from_linear(_linear(), scheme, group_size=32)
    x = randn(3, K, device=DEV).requires_grad_()
    layer(x).sum().backward()
    w = layer.dequantize(torch.float32)
    torch.testing.assert_close(x.grad, torch.ones(3, N, device=DEV) @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, torch.full((N,), 3.0, device=DEV))


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(K, K, device=DEV)
        self.b = torch.nn.Linear(K, N, bias=False, device=DEV)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_a_model_of_them_compiles_without_breaks() -> None:
    torch.manual_seed(0)
    model = _Block()
    model.a = QuantizedLinear.from_linear(model.a, "int4", group_size=32)
    model.b = QuantizedLinear.from_linear(model.b, "fp8")
    x = randn(4, K, device=DEV)
    with torch.no_grad():
        eager = model(x)
        compiled, breaks = compile_and_count_breaks(model, x)
    assert breaks == 0
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fuse", [False, True], ids=["split", "packed"])
def test_gated_mlp_runs_quantized_projections_as_modules(fuse: bool) -> None:
    torch.manual_seed(0)
    mlp = GatedMLP(K, 32, "silu", fuse_gate_up=fuse, device=DEV, down_multiplier=0.5)
    names = ("gate_up_proj", "down_proj") if fuse else ("gate_proj", "up_proj", "down_proj")
    for name in names:
        setattr(mlp, name, QuantizedLinear.from_linear(getattr(mlp, name), "int8"))
    x = randn(3, K, device=DEV)
    if fuse:
        gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    else:
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    expected = mlp.down_proj(torch.nn.functional.silu(gate) * up) * 0.5
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)


def test_mlp_runs_quantized_projections_as_modules() -> None:
    torch.manual_seed(0)
    mlp = MLP(K, 32, "gelu", device=DEV)
    mlp.fc1 = QuantizedLinear.from_linear(mlp.fc1, "int4", group_size=32)
    mlp.fc2 = QuantizedLinear.from_linear(mlp.fc2, "int8")
    x = randn(3, K, device=DEV)
    torch.testing.assert_close(mlp(x), mlp.fc2(torch.nn.functional.gelu(mlp.fc1(x))), rtol=1e-5, atol=1e-5)


def test_errors() -> None:
    with pytest.raises(ValueError, match="scheme must be one of"):
        QuantizedLinear(K, N, scheme="int2")
    with pytest.raises(ValueError, match="K must be even"):
        QuantizedLinear(63, N, scheme="int4")
    layer = QuantizedLinear.from_linear(_linear(), "int8")
    with pytest.raises(TypeError, match="needs a torch.nn.Linear"):
        QuantizedLinear.from_linear(layer, "int8")  # type: ignore[arg-type]
    linear = _linear()
    linear.weight = torch.nn.Parameter(torch.ones(N, K, dtype=torch.int8, device=DEV), requires_grad=False)
    with pytest.raises(TypeError, match="already quantized"):
        QuantizedLinear.from_linear(linear, "int8")


@pytest.mark.cuda
@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_cuda_compiled_with_dynamic_rows_and_graphs(scheme: str) -> None:
    """On the GPU: torch.compile(dynamic=True) traces the launch with a symbolic M (every M then runs the
    plan of the first call's, correct at any M), and mode="reduce-overhead" replays CUDA graphs."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 512, device="cuda", dtype=torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, scheme, group_size=64)
    parts = layer.parts()
    for mode in ("default", "reduce-overhead"):
        compiled = torch.compile(layer, dynamic=True, mode=mode, fullgraph=True)
        for m in (1, 8, 100, 3):
            x = randn(m, 1024, dtype=torch.bfloat16, device="cuda")
            with torch.no_grad():
                y = compiled(x)
            assert_matmul_close(y, reference(scheme, x, parts, 64, layer.bias),
                                magnitude(scheme, x, parts, 64, layer.bias), 1024, f"{mode} m={m}")
