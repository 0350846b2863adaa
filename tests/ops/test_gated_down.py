"""The gated down projection ops (gated_down, gated_down_packed): schemas, opcheck, the registered
autograd and the eager entries (the launchers; Triton's interpreter on CPU) against the reference's
autograd for every activation, with and without a bias, strided gate/up, fp64 gradcheck, what the op
saves for the backward (gate, up and the weight, never h), torch.compile(fullgraph=True), torch.export."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import gated_down_eager, gated_down_packed_eager
from tests.grid import device_under_test, randn
from tests.ops.act_helpers import ACTS, gate_input
from tests.ops.norm_helpers import assert_close, assert_compiles_like_eager

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


def _calls(entry: str, gate_up, weight, bias, act):
    """(ours, reference, inputs to differentiate) for the split and the packed op."""
    gate, up = gate_up.chunk(2, -1)  # strided views: the kernels read them in place
    split = OPS.gated_down_fwd if entry == "op" else gated_down_eager
    packed = OPS.gated_down_packed_fwd if entry == "op" else gated_down_packed_eager
    wrt = tuple(t for t in (gate_up, weight, bias) if t is not None)
    return {
        "split": (lambda: split(gate, up, weight, bias, act), lambda: R.gated_down(gate, up, weight, bias, act), wrt),
        "packed": (lambda: packed(gate_up, weight, bias, act),
                   lambda: R.gated_down_packed(gate_up, weight, bias, act), wrt),
    }


def test_schemas() -> None:
    assert str(OPS.gated_down_fwd.default._schema) == (
        "kernel_pytorch::gated_down_fwd(Tensor gate, Tensor up, Tensor weight, Tensor? bias, str act) -> Tensor")
    assert str(OPS.gated_down_packed_bwd.default._schema) == (
        "kernel_pytorch::gated_down_packed_bwd(Tensor dy, Tensor gate_up, Tensor weight, str act, bool has_bias)"
        " -> (Tensor, Tensor, Tensor)")


def test_opcheck() -> None:
    dtype = torch.bfloat16  # one dtype: opcheck compiles each op (the dtype grid runs above and below)
    gate_up, weight, bias = _inputs(dtype)
    gate, up = (t.contiguous().detach().requires_grad_() for t in gate_up.chunk(2, -1))
    torch.library.opcheck(OPS.gated_down_fwd.default, (gate, up, weight, bias, "silu"))
    torch.library.opcheck(OPS.gated_down_packed_fwd.default, (gate_up, weight, None, "gelu_tanh"))
    dy = randn(ROWS, H, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.gated_down_bwd.default, (dy, gate.detach(), up.detach(), weight.detach(), "gelu", True))
    torch.library.opcheck(OPS.gated_down_packed_bwd.default, (dy, gate_up.detach(), weight.detach(), "relu", False))


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


def _saved_shapes(fn) -> list[tuple[int, ...]]:
    """Shapes of what autograd keeps from fn() for the backward."""
    saved: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fn()
    return saved


@pytest.mark.parametrize("entry", ["op", "eager"])
def test_saves_gate_up_and_the_weight_not_h(entry: str) -> None:
    gate_up, weight, bias = _inputs()
    for name, (ours, _, _) in _calls(entry, gate_up, weight, bias, "silu").items():
        saved = _saved_shapes(ours)
        want = [(ROWS, I), (ROWS, I), (H, I)] if name == "split" else [(ROWS, 2 * I), (H, I)]
        assert sorted(saved) == sorted(want), name


def test_compile_fullgraph_no_breaks_same_grads() -> None:
    gate_up, weight, bias = _inputs()

    def f(gate_up, weight, bias):
        gate, up = gate_up.chunk(2, -1)
        return OPS.gated_down_fwd(gate, up, weight, bias, "silu") + OPS.gated_down_packed_fwd(gate_up, weight, None,
                                                                                             "gelu")

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
