"""The activation family's registered ops (gated_act, gated_act_packed, bias_act): schemas, opcheck, the
registered autograd and the eager entries against the reference (a gate multiplier included),
torch.compile(fullgraph=True) without breaks, torch.export; the branch-free IEEE division the activations
use on the GPU."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernel_pytorch import reference as R
from kernel_pytorch.ops import _activations, bias_act_eager, gated_act_eager, gated_act_packed_eager
from tests.grid import DTYPES, device_under_test, randn
from tests.ops.act_helpers import gate_input
from tests.ops.norm_helpers import assert_close, assert_compiles_like_eager

DEV = device_under_test()
OPS = torch.ops.kernel_pytorch


def _gated(dtype=torch.float32, grad=False, lead=(3, 5), cols=24):
    gate = gate_input(*lead, cols, dtype=dtype, device=DEV).requires_grad_(grad)
    up = randn(*lead, cols, dtype=dtype, device=DEV).requires_grad_(grad)
    return gate, up


def test_schemas() -> None:
    assert str(OPS.gated_act_fwd.default._schema) == (
        "kernel_pytorch::gated_act_fwd(Tensor gate, Tensor up, str act, float gate_multiplier=1.) -> Tensor")
    assert str(OPS.gated_act_bwd.default._schema) == (
        "kernel_pytorch::gated_act_bwd(Tensor dh, Tensor gate, Tensor up, str act, float gate_multiplier=1.)"
        " -> (Tensor, Tensor)")
    assert str(OPS.gated_act_packed_bwd.default._schema) == (
        "kernel_pytorch::gated_act_packed_bwd(Tensor dh, Tensor gate_up, str act, float gate_multiplier=1.) -> Tensor")
    assert str(OPS.bias_act_fwd.default._schema) == (
        "kernel_pytorch::bias_act_fwd(Tensor x, Tensor? bias, str act) -> Tensor")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype: torch.dtype) -> None:
    gate, up = _gated(dtype, grad=True)
    torch.library.opcheck(OPS.gated_act_fwd.default, (gate, up, "silu"))
    torch.library.opcheck(OPS.gated_act_fwd.default, (gate, up, "silu", 0.7))
    gate_up = torch.cat([gate, up], -1).detach().requires_grad_()
    torch.library.opcheck(OPS.gated_act_packed_fwd.default, (gate_up, "gelu_tanh"))
    torch.library.opcheck(OPS.gated_act_packed_fwd.default, (gate_up, "silu", 1.9))
    x, bias = randn(3, 5, 24, dtype=dtype, device=DEV).requires_grad_(), randn(24, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.bias_act_fwd.default, (x, bias.requires_grad_(), "gelu"))
    torch.library.opcheck(OPS.bias_act_fwd.default, (x, None, "relu"))
    # the backward ops are not themselves differentiable: checked on plain tensors
    dh = randn(3, 5, 24, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.gated_act_bwd.default, (dh, gate.detach(), up.detach(), "gelu"))
    torch.library.opcheck(OPS.gated_act_bwd.default, (dh, gate.detach(), up.detach(), "silu", 0.7))
    torch.library.opcheck(OPS.gated_act_packed_bwd.default, (dh, gate_up.detach(), "silu"))
    torch.library.opcheck(OPS.gated_act_packed_bwd.default, (dh, gate_up.detach(), "gelu_tanh", 1.9))
    torch.library.opcheck(OPS.bias_act_bwd.default, (dh, x.detach(), bias.detach(), "silu"))
    torch.library.opcheck(OPS.bias_act_bwd.default, (dh, x.detach(), None, "gelu_tanh"))


@pytest.mark.parametrize("entry", ["op", "eager"])
def test_registered_and_eager_autograd_match_the_reference(entry: str) -> None:
    """Forward and every gradient, through the registered op's autograd and through the eager entry
    (the launchers; Triton's interpreter on CPU), bf16, against the reference's autograd."""
    dtype = torch.bfloat16
    gate, up = _gated(dtype, grad=True)
    gate_up = torch.cat([gate, up], -1).detach().requires_grad_()
    x, bias = randn(3, 5, 24, dtype=dtype, device=DEV).requires_grad_(), randn(24, dtype=dtype, device=DEV)
    bias.requires_grad_()
    dh = randn(3, 5, 24, dtype=dtype, device=DEV)
    if entry == "op":
        ours = {"gated": lambda: OPS.gated_act_fwd(gate, up, "silu"),
                "packed": lambda: OPS.gated_act_packed_fwd(gate_up, "gelu"),
                "bias": lambda: OPS.bias_act_fwd(x, bias, "gelu_tanh")}
    else:
        ours = {"gated": lambda: gated_act_eager(gate, up, "silu"),
                "packed": lambda: gated_act_packed_eager(gate_up, "gelu"),
                "bias": lambda: bias_act_eager(x, bias, "gelu_tanh")}
    refs = {"gated": (lambda: R.gated_act(gate, up, "silu"), (gate, up)),
            "packed": (lambda: R.gated_act_packed(gate_up, "gelu"), (gate_up,)),
            "bias": (lambda: R.bias_act(x, bias, "gelu_tanh"), (x, bias))}
    for name, (ref, wrt) in refs.items():
        out, want = ours[name](), ref()
        assert_close(out, want, name)
        for got, expected, i in zip(torch.autograd.grad(out, wrt, dh), torch.autograd.grad(want, wrt, dh),
                                    range(len(wrt))):
            # dbias sums 15 rows: within the table of the reference's own (fp32-summed) value
            assert_close(got, expected, f"{name} grad {i}")


@pytest.mark.parametrize("entry", ["op", "eager"])
def test_gate_multiplier_through_the_autograd_of_both_entries(entry: str) -> None:
    """Falcon-H1's gate multiplier through the registered op's autograd and the eager entry, fp32 (the
    kernel tests hold bf16 to the fp64 budget), split and packed, against the reference's autograd."""
    gate, up = _gated(grad=True)
    gate_up = torch.cat([gate, up], -1).detach().requires_grad_()
    split, packed = (OPS.gated_act_fwd, OPS.gated_act_packed_fwd) if entry == "op" else (
        gated_act_eager, gated_act_packed_eager)
    dh = randn(3, 5, 24, device=DEV)
    cases = {"split": (lambda: split(gate, up, "silu", 0.7), lambda: R.gated_act(gate, up, "silu", 0.7), (gate, up)),
             "packed": (lambda: packed(gate_up, "gelu_tanh", 1.9),
                        lambda: R.gated_act_packed(gate_up, "gelu_tanh", 1.9), (gate_up,))}
    for name, (ours, ref, wrt) in cases.items():
        out, want = ours(), ref()
        assert_close(out, want, name)
        for i, (got, expected) in enumerate(zip(torch.autograd.grad(out, wrt, dh), torch.autograd.grad(want, wrt, dh))):
            assert_close(got, expected, f"{name} grad {i}")


def test_bias_free_gradient_is_none() -> None:
    x = randn(4, 16, device=DEV).requires_grad_()
    for y in (OPS.bias_act_fwd(x, None, "silu"), bias_act_eager(x, None, "silu")):
        (dx,) = torch.autograd.grad(y.sum(), (x,))
        assert_close(dx, R.bias_act_backward(torch.ones_like(x), x.detach(), None, "silu")[0], "dx")


def test_gradcheck_fp64_through_the_ops() -> None:
    gate, up = _gated(torch.float64, grad=True, lead=(3,), cols=8)
    torch.autograd.gradcheck(lambda g, u: OPS.gated_act_fwd(g, u, "gelu"), (gate, up))
    gate_up = torch.cat([gate, up], -1).detach().requires_grad_()
    torch.autograd.gradcheck(lambda t: OPS.gated_act_packed_fwd(t, "silu"), (gate_up,))
    torch.autograd.gradcheck(lambda t: OPS.gated_act_packed_fwd(t, "gelu_tanh", 0.7), (gate_up,))
    bias = randn(8, dtype=torch.float64, device=DEV).requires_grad_()
    torch.autograd.gradcheck(lambda x, b: OPS.bias_act_fwd(x, b, "gelu_tanh"), (gate, bias))


def test_compile_fullgraph_no_breaks_same_grads() -> None:
    gate, up = _gated(grad=True)
    bias = randn(24, device=DEV).requires_grad_()

    def f(gate, up, bias):
        h = OPS.gated_act_fwd(gate, up, "silu", 0.7) + OPS.gated_act_packed_fwd(torch.cat([gate, up], -1), "gelu")
        return OPS.bias_act_fwd(h, bias, "gelu_tanh")

    wrt = (gate, up, bias)
    assert_compiles_like_eager(f, wrt)


def test_export() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(randn(8))

        def forward(self, gate_up):
            return OPS.bias_act_fwd(OPS.gated_act_packed_fwd(gate_up, "silu"), self.bias, "gelu")

    gate_up = randn(3, 16)
    ep = torch.export.export(M(), (gate_up,))
    assert "kernel_pytorch.gated_act_packed_fwd" in str(ep.graph) and "kernel_pytorch.bias_act_fwd" in str(ep.graph)
    want = R.bias_act(R.gated_act_packed(gate_up, "silu"), ep.module().bias, "gelu")
    assert_close(ep.module()(gate_up), want, "exported")


@triton.jit
def _div_kernel(A, B, OUT, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(A + offs, mask=mask, other=1.0)
    b = tl.load(B + offs, mask=mask, other=1.0)
    tl.store(OUT + offs, _activations._div(a, b, True), mask=mask)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(a)
    _div_kernel[(1,)](a, b, out, a.numel(), BLOCK=triton.next_power_of_2(a.numel()))
    return out


def _silu_operands(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """z and 1 + exp(-z), the SiLU quotient's operands: wide normals, and the values that once took
    the IEEE division's slow path (zeros of both signs, denormals, both infinities, NaN, the range
    where exp(-z) overflows)."""
    special = [0.0, -0.0, 1e-40, -1e-40, 1e-38, -88.0, -88.5, -88.8, -89.0, -100.0, -1e30, 1e30, 3e38,
               float("inf"), float("-inf"), float("nan")]
    z = torch.cat([torch.randn(4000, device=device) * 12.0, torch.tensor(special, device=device)])
    return z, 1.0 + torch.exp(-z)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a == b) & (torch.signbit(a) == torch.signbit(b))) | (a.isnan() & b.isnan())


def test_branch_free_division_handles_special_operands() -> None:
    """The PRECISE division's selects: the quotient of IEEE division, signed zeros, infinities and NaN
    included (under the interpreter its reciprocal is exact; the GPU test below covers the approximate one)."""
    z, e = _silu_operands(DEV)
    got = _div(z, e)
    same = _same_bits(got, z / e)
    assert same.all(), (z[~same], got[~same], (z / e)[~same])


@pytest.mark.cuda
def test_cuda_branch_free_division_is_ieee_division() -> None:
    """Bitwise torch's (IEEE) division on the GPU, where the reciprocal is approximate; denormal
    quotients may flush to zero (whether Triton's fp32 flushes denormals is its choice)."""
    z, e = _silu_operands("cuda")
    a = torch.randn(1 << 20, device="cuda") * torch.exp(torch.randn(1 << 20, device="cuda") * 8.0)
    b = 1.0 + torch.rand(1 << 20, device="cuda") * 1e6
    tiny = torch.finfo(torch.float32).tiny
    for num, den in ((z, e), (a, b)):
        got, want = _div(num, den), num / den
        ok = _same_bits(got, want) | ((want.abs() < tiny) & (got.abs() < tiny))
        assert ok.all(), (num[~ok], got[~ok], want[~ok])
