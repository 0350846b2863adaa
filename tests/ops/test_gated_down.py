"""The gated down projection ops (gated_down, gated_down_packed): schemas, opcheck, the registered
autograd and the eager entries (the launchers; Triton's interpreter on CPU) against the reference's
autograd for every activation, with and without a bias, with gate and down multipliers, strided gate/up,
fp64 gradcheck, what the op saves for the backward (gate, up and the weight, never h),
torch.compile(fullgraph=True), torch.export."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import gated_down_eager, gated_down_packed_eager
from tests.grid import device_under_test, randn
from tests.ops.act_helpers import ACTS, gate_input
from tests.ops.norm_helpers import assert_budget, assert_close, assert_compiles_like_eager

DEV = device_under_test()
OPS = torch.ops.kernel_pytorch
ROWS, I, H = 5, 24, 8  # noqa: E741


def _inputs(dtype=torch.float32, bias=True, lead=(ROWS,), gate_scale=3.0):
    """gate_up (gate, up = its strided halves), weight, bias, requiring gradients."""
    gate = gate_input(*lead, I, dtype=torch.float32, device=DEV) * (gate_scale / 3.0)
    gate_up = torch.cat([gate.to(dtype),
                         randn(*lead, I, dtype=dtype, device=DEV)], -1).requires_grad_()
    weight = randn(H, I, dtype=dtype, device=DEV, scale=I ** -0.5).requires_grad_()
    b = randn(H, dtype=dtype, device=DEV).requires_grad_() if bias else None
    return gate_up, weight, b


def _calls(entry: str, gate_up, weight, bias, act, *multipliers: float):
    """(ours, reference, inputs to differentiate) for the split and the packed op; `multipliers`: none
    (the ops' defaults) or (gate_multiplier, down_multiplier)."""
    gate, up = gate_up.chunk(2, -1)  # strided views: the kernels read them in place
    split = OPS.gated_down_fwd if entry == "op" else gated_down_eager
    packed = OPS.gated_down_packed_fwd if entry == "op" else gated_down_packed_eager
    wrt = tuple(t for t in (gate_up, weight, bias) if t is not None)
    return {
        "split": (lambda: split(gate, up, weight, bias, act, *multipliers),
                  lambda: R.gated_down(gate, up, weight, bias, act, *multipliers), wrt),
        "packed": (lambda: packed(gate_up, weight, bias, act, *multipliers),
                   lambda: R.gated_down_packed(gate_up, weight, bias, act, *multipliers), wrt),
    }


def test_schemas() -> None:
    assert str(OPS.gated_down_fwd.default._schema) == (
        "kernel_pytorch::gated_down_fwd(Tensor gate, Tensor up, Tensor weight, Tensor? bias, str act, "
        "float gate_multiplier=1., float down_multiplier=1.) -> Tensor")
    # the registration passes the backward its kept values before the bias's presence flag
    assert str(OPS.gated_down_packed_bwd.default._schema) == (
        "kernel_pytorch::gated_down_packed_bwd(Tensor dy, Tensor gate_up, Tensor weight, str act, "
        "float gate_multiplier, float down_multiplier, bool has_bias) -> (Tensor, Tensor, Tensor)")


def test_opcheck() -> None:
    dtype = torch.bfloat16  # one dtype: opcheck compiles each op (the dtype grid runs above and below)
    gate_up, weight, bias = _inputs(dtype)
    gate, up = (t.contiguous().detach().requires_grad_() for t in gate_up.chunk(2, -1))
    torch.library.opcheck(OPS.gated_down_fwd.default, (gate, up, weight, bias, "silu"))
    torch.library.opcheck(OPS.gated_down_fwd.default, (gate, up, weight, bias, "silu", 0.7, 1.9))
    torch.library.opcheck(OPS.gated_down_packed_fwd.default, (gate_up, weight, None, "gelu_tanh"))
    torch.library.opcheck(OPS.gated_down_packed_fwd.default, (gate_up, weight, None, "gelu_tanh", 1.9, 0.7))
    dy = randn(ROWS, H, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.gated_down_bwd.default,
                          (dy, gate.detach(), up.detach(), weight.detach(), "gelu", 1.0, 1.0, True))
    torch.library.opcheck(OPS.gated_down_bwd.default,
                          (dy, gate.detach(), up.detach(), weight.detach(), "silu", 0.7, 1.9, True))
    torch.library.opcheck(OPS.gated_down_packed_bwd.default,
                          (dy, gate_up.detach(), weight.detach(), "relu", 1.9, 0.7, False))


@pytest.mark.parametrize("entry", ["op", "eager"])
@pytest.mark.parametrize(("act", "dtype"), [*((a, torch.float32) for a in ACTS), ("silu", torch.bfloat16)], ids=str)
def test_autograd_matches_the_reference(entry: str, act: str, dtype: torch.dtype) -> None:
    """Forward and every gradient against the reference's own autograd. bf16 at unit-scale gates: with
    the gates' wide test range, h near 30 flips an ulp (0.125) between the interpreter's activation and
    torch's, and d_weight sums such rows with cancellation, beyond an elementwise table."""
    scale = 1.0 if dtype == torch.bfloat16 else 3.0
    for name, (ours, ref, wrt) in _calls(entry, *_inputs(dtype, gate_scale=scale), act).items():
        out, want = ours(), ref()
        assert_close(out, want, f"{name} y")
        dy = randn(*out.shape, dtype=out.dtype, device=DEV)
        for i, (got, expected) in enumerate(zip(torch.autograd.grad(out, wrt, dy), torch.autograd.grad(want, wrt, dy))):
            assert_close(got, expected, f"{name} {act} grad {i}")


@pytest.mark.parametrize("entry", ["op", "eager"])
@pytest.mark.parametrize(("gate_m", "down_m"), [(0.7, 1.9), (1.9, 0.7)])
def test_multipliers_match_the_reference(entry: str, gate_m: float, down_m: float) -> None:
    """Falcon-H1's multipliers: the gate's inside the activation kernels (d_gate picks it up), the
    down projection's on y (its backward scales dy); fp32 by the table, output and every gradient."""
    for name, (ours, ref, wrt) in _calls(entry, *_inputs(), "silu", gate_m, down_m).items():
        out, want = ours(), ref()
        assert_close(out, want, f"{name} y")
        dy = randn(*out.shape, device=DEV)
        for i, (got, expected) in enumerate(zip(torch.autograd.grad(out, wrt, dy), torch.autograd.grad(want, wrt, dy))):
            assert_close(got, expected, f"{name} grad {i}")


def test_multipliers_in_bf16_within_the_fp64_budget() -> None:
    """bf16 with multipliers, the registered op's autograd: output and every gradient within the fp64
    budget of the bf16 reference (the interpreter truncates the extra roundings of gate * m and y * m
    where the GPU rounds to nearest as the reference does)."""
    gate_up, weight, bias = _inputs(torch.bfloat16, gate_scale=1.0)
    wide = [t.detach().double().requires_grad_() for t in (gate_up, weight, bias)]
    dy = randn(ROWS, H, dtype=torch.bfloat16, device=DEV)
    for name in ("split", "packed"):
        ours, ref, wrt = _calls("op", gate_up, weight, bias, "silu", 0.7, 1.9)[name]
        _, ref64, wrt64 = _calls("op", *wide, "silu", 0.7, 1.9)[name]
        out, want, want64 = ours(), ref(), ref64()
        assert_budget(out, want, want64, f"{name} y")
        for i, (got, expected, e64) in enumerate(zip(torch.autograd.grad(out, wrt, dy),
                                                     torch.autograd.grad(want, wrt, dy),
                                                     torch.autograd.grad(want64, wrt64, dy.double()))):
            assert_budget(got, expected, e64, f"{name} grad {i}")


def test_bias_free_and_leading_dims() -> None:
    gate_up, weight, _ = _inputs(bias=False, lead=(2, 3))
    for entry in ("op", "eager"):
        for name, (ours, ref, wrt) in _calls(entry, gate_up, weight, None, "gelu").items():
            out = ours()
            assert out.shape == (2, 3, H)
            for got, expected in zip(torch.autograd.grad(out.sum(), wrt), torch.autograd.grad(ref().sum(), wrt)):
                assert_close(got, expected, f"{entry} {name}")


def test_gradcheck_fp64() -> None:
    gate_up = torch.cat([gate_input(2, 3, dtype=torch.float64, device=DEV), randn(2, 3, dtype=torch.float64,
                                                                                device=DEV)], -1).requires_grad_()
    weight = randn(2, 3, dtype=torch.float64, device=DEV).requires_grad_()
    bias = randn(2, dtype=torch.float64, device=DEV).requires_grad_()
    torch.autograd.gradcheck(lambda g, u, w, b: OPS.gated_down_fwd(g, u, w, b, "gelu"),
                             (*(t.detach().requires_grad_() for t in gate_up.chunk(2, -1)), weight, bias))
    torch.autograd.gradcheck(lambda gu, w: OPS.gated_down_packed_fwd(gu, w, None, "silu"), (gate_up, weight))
    torch.autograd.gradcheck(lambda gu, w, b: OPS.gated_down_packed_fwd(gu, w, b, "gelu_tanh", 0.7, 1.9),
                             (gate_up, weight, bias))


def _saved_shapes(fn) -> list[tuple[int, ...]]:
    """Shapes of what autograd keeps from fn() for the backward."""
    saved: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fn()
    return saved


@pytest.mark.parametrize("entry", ["op", "eager"])
def test_saves_gate_up_and_the_weight_not_h(entry: str) -> None:
    gate_up, weight, bias = _inputs()
    for multipliers in ((), (0.7, 1.9)):  # the down multiplier saves nothing: its backward scales dy
        for name, (ours, _, _) in _calls(entry, gate_up, weight, bias, "silu", *multipliers).items():
            saved = _saved_shapes(ours)
            want = [(ROWS, I), (ROWS, I), (H, I)] if name == "split" else [(ROWS, 2 * I), (H, I)]
            assert sorted(saved) == sorted(want), (name, multipliers)


def test_compile_fullgraph_no_breaks_same_grads() -> None:
    gate_up, weight, bias = _inputs()

    def f(gate_up, weight, bias):
        gate, up = gate_up.chunk(2, -1)
        return OPS.gated_down_fwd(gate, up, weight, bias, "silu") + OPS.gated_down_packed_fwd(gate_up, weight, None,
                                                                                             "gelu", 0.7, 1.9)

    wrt = (gate_up, weight, bias)
    assert_compiles_like_eager(f, wrt)


def test_export() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(randn(H, I))
            self.bias = torch.nn.Parameter(randn(H))

        def forward(self, gate_up):
            gate, up = gate_up.chunk(2, -1)
            return OPS.gated_down_fwd(gate, up, self.weight, self.bias, "silu") + OPS.gated_down_packed_fwd(
                gate_up, self.weight, None, "gelu_tanh")

    gate_up, m = randn(3, 2 * I), M()
    ep = torch.export.export(m, (gate_up,))
    graph = str(ep.graph)
    assert "kernel_pytorch.gated_down_fwd" in graph and "kernel_pytorch.gated_down_packed_fwd" in graph
    want = R.gated_down(*gate_up.chunk(2, -1), m.weight, m.bias, "silu") + R.gated_down_packed(
        gate_up, m.weight, None, "gelu_tanh")
    assert_close(ep.module()(gate_up), want, "exported")
