"""kernel_pytorch.functional's activation family: argument errors name the argument, every backend computes
the reference (forward and gradients, a gate multiplier included), the eager launcher path (forced onto
the interpreter here), the opt-in in-place backward (same gradients, written over the inputs, guarded
against a second backward, refused where the memory cannot take it), and compile without graph breaks."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import activation
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.act_helpers import gate_input
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
BF16 = torch.bfloat16


@pytest.fixture
def eager_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route the functions to the eager launcher path (what backend="auto" runs on CUDA); on CPU the
    launchers run in Triton's interpreter."""
    monkeypatch.setattr(activation, "_resolve", lambda backend, op, x, compiling: "eager")


def _gated(lead=(3, 5), cols=24, dtype=BF16, grad=True):
    gate = gate_input(*lead, cols, dtype=dtype, device=DEV).requires_grad_(grad)
    up = randn(*lead, cols, dtype=dtype, device=DEV).requires_grad_(grad)
    return gate, up


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: F.swiglu(randn(2, 4), randn(2, 5)), ValueError, "up must have gate's shape"),
        (lambda: F.swiglu(randn(2, 4), randn(2, 4, dtype=BF16)), TypeError, "up must have gate's dtype"),
        (lambda: F.gated_act(randn(2, 4), randn(2, 4), "tanh"), ValueError, "activation must be one of"),
        (lambda: F.geglu(randn(2, 4), randn(2, 4), approximate="erf"), ValueError, "approximate must be"),
        (lambda: F.swiglu_packed(randn(2, 7)), ValueError, "gate_up's last dim .* must be even"),
        (lambda: F.swiglu(randn(2, 4), randn(2, 4), inplace_backward=1), TypeError, "inplace_backward must be a bool"),
        (lambda: F.bias_act(randn(2, 4), randn(3), "gelu"), ValueError, r"bias must have shape \(4,\)"),
        (lambda: F.bias_act(torch.ones(2, 4, dtype=torch.int32), None, "gelu"), TypeError, "x must be a floating"),
        (lambda: F.swiglu(randn(2, 4), randn(2, 4), backend="cuda"), ValueError, "backend must be one of"),
        (lambda: F.swiglu(randn(2, 4), randn(2, 4, device="meta")), ValueError, "up is on meta"),
        (lambda: F.gated_act(randn(2, 4), randn(2, 4), gate_multiplier=float("inf")), ValueError,
         "gate_multiplier must be finite"),
        (lambda: F.gated_act_packed(randn(2, 8), gate_multiplier=True), TypeError, "gate_multiplier must be a real"),
    ],
)
def test_errors_name_the_argument(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_triton_backend_says_why_it_cannot_run_on_cpu() -> None:
    if DEV == "cuda":
        pytest.skip("CPU tensors only")
    with pytest.raises(ValueError, match="backend='triton' cannot run gated_act: tensors are on cpu"):
        F.swiglu(randn(2, 4), randn(2, 4), backend="triton")


def _cases(gate, up, gate_up, x, bias, backend, inplace=False):
    """name -> (ours, reference, inputs to differentiate)."""
    kw = dict(inplace_backward=inplace, backend=backend)
    return {
        "swiglu": (lambda: F.swiglu(gate, up, **kw), lambda: R.swiglu(gate, up), (gate, up)),
        "geglu tanh": (lambda: F.geglu(gate, up, "tanh", **kw), lambda: R.geglu(gate, up, "tanh"), (gate, up)),
        "packed gelu": (lambda: F.geglu_packed(gate_up, **kw), lambda: R.gated_act_packed(gate_up, "gelu"),
                        (gate_up,)),
        "packed hf name": (lambda: F.gated_act_packed(gate_up, "gelu_pytorch_tanh", **kw),
                           lambda: R.gated_act_packed(gate_up, "gelu_tanh"), (gate_up,)),
        "bias_act": (lambda: F.bias_act(x, bias, "gelu_tanh", **kw), lambda: R.bias_act(x, bias, "gelu_tanh"),
                     (x, bias)),
        "act alone": (lambda: F.bias_act(x, None, "relu", **kw), lambda: R.bias_act(x, None, "relu"), (x,)),
    }


def _check_cases(backend: str, inplace: bool = False) -> None:
    for name, (ours, ref, wrt) in _cases(*_inputs(), backend, inplace).items():
        # fresh clones per case: an in-place backward overwrites what it differentiates
        src = [t.detach().clone() for t in wrt]
        out = ours()
        want = ref()
        assert_close(out, want, name)
        dy = randn(*out.shape, dtype=out.dtype, device=DEV)
        expected = torch.autograd.grad(want, wrt, dy)
        got = torch.autograd.grad(out, wrt, dy)
        for g, e, i in zip(got, expected, range(len(wrt))):
            assert_close(g, e, f"{name} grad {i}")
        if not inplace:
            assert all(torch.equal(t, s) for t, s in zip(wrt, src)), f"{name}: inputs changed"


def _inputs():
    gate, up = _gated()
    gate_up = torch.cat([gate, up], -1).detach().requires_grad_()
    x = randn(3, 5, 24, dtype=BF16, device=DEV, scale=2.0).requires_grad_()
    bias = randn(24, dtype=BF16, device=DEV, scale=0.5).requires_grad_()
    return gate, up, gate_up, x, bias


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_backends_compute_the_reference(backend: str) -> None:
    _check_cases(backend)


def test_eager_path_computes_the_reference(eager_path) -> None:
    _check_cases("auto")


def test_in_place_backward_computes_the_reference(eager_path) -> None:
    _check_cases("auto", inplace=True)


@pytest.mark.parametrize(("path", "inplace"),
                         [("eager", False), ("eager", True), ("auto", False), ("reference", False)])
def test_gate_multiplier_on_every_path(monkeypatch: pytest.MonkeyPatch, path: str, inplace: bool) -> None:
    """Falcon-H1's gate multiplier through the eager launchers (in-place backward too), the registered op
    and the reference backend, fp32 (the kernel tests hold bf16 to the fp64 budget), forward and gradients."""
    if path == "eager":
        monkeypatch.setattr(activation, "_resolve", lambda backend, op, x, compiling: "eager")
    backend = "reference" if path == "reference" else "auto"
    gate, up = _gated(dtype=torch.float32, grad=False)
    dh = randn(3, 5, 24, device=DEV)
    kw = dict(inplace_backward=inplace, backend=backend)
    for name, m in (("split", 0.7), ("packed", 1.9)):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        gu = torch.cat([gate, up], -1).requires_grad_()
        ours, wrt = ((F.gated_act(g, u, "silu", gate_multiplier=m, **kw), (g, u)) if name == "split"
                     else (F.gated_act_packed(gu, "gelu_tanh", gate_multiplier=m, **kw), (gu,)))
        g0, u0 = gate.clone().requires_grad_(), up.clone().requires_grad_()
        gu0 = torch.cat([gate, up], -1).requires_grad_()
        want, wrt0 = ((R.gated_act(g0, u0, "silu", m), (g0, u0)) if name == "split"
                      else (R.gated_act_packed(gu0, "gelu_tanh", m), (gu0,)))
        assert_close(ours, want, name)
        for i, (a, e) in enumerate(zip(torch.autograd.grad(ours, wrt, dh), torch.autograd.grad(want, wrt0, dh))):
            assert_close(a, e, f"{name} grad {i}")


def test_in_place_gradients_are_the_out_of_place_ones_written_over_the_inputs(eager_path) -> None:
    gate, up = _gated(grad=False)
    dh = randn(3, 5, 24, dtype=BF16, device=DEV)
    g1, u1 = gate.clone().requires_grad_(), up.clone().requires_grad_()
    want = torch.autograd.grad(F.swiglu(g1, u1), (g1, u1), dh)
    g2, u2 = gate.clone().requires_grad_(), up.clone().requires_grad_()
    got = torch.autograd.grad(F.swiglu(g2, u2, inplace_backward=True), (g2, u2), dh)
    for a, b, t in zip(got, want, (g2, u2)):
        assert torch.equal(a, b)
        assert a.data_ptr() == t.data_ptr() and torch.equal(t.detach(), b)  # the gradient is in t's memory
    # packed: one tensor, its gradient written over it
    gu = torch.cat([gate, up], -1)
    fresh, leaf = gu.clone().requires_grad_(), gu.clone().requires_grad_()
    (expected,) = torch.autograd.grad(F.swiglu_packed(fresh), (fresh,), dh)
    (d,) = torch.autograd.grad(F.swiglu_packed(leaf, inplace_backward=True), (leaf,), dh)
    assert torch.equal(d, expected) and d.data_ptr() == leaf.data_ptr()


def test_a_second_backward_through_an_overwritten_input_raises(eager_path) -> None:
    gate, up = _gated()
    h = F.swiglu(gate, up, inplace_backward=True)
    dh = randn(*h.shape, dtype=BF16, device=DEV)
    torch.autograd.grad(h, (gate, up), dh, retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(h, (gate, up), dh)


def test_a_frozen_input_keeps_its_values(eager_path) -> None:
    gate, up = _gated()
    up = up.detach()
    before = up.clone()
    x = randn(4, 24, dtype=BF16, device=DEV)
    bias = randn(24, dtype=BF16, device=DEV).requires_grad_()
    (d_gate,) = torch.autograd.grad(F.swiglu(gate, up, inplace_backward=True).sum(), (gate,))
    assert torch.equal(up, before) and d_gate.data_ptr() == gate.data_ptr()
    x_before = x.clone()
    (dbias,) = torch.autograd.grad(F.bias_act(x, bias, "gelu", inplace_backward=True).sum(), (bias,))
    assert torch.equal(x, x_before)
    assert_close(dbias, R.bias_act_backward(torch.ones_like(x), x, bias.detach(), "gelu")[1], "dbias")


def test_memory_that_cannot_take_the_gradient_gets_new_memory(eager_path) -> None:
    """Shared elements (gate is up), broadcast rows and non-collapsible leading dims keep their values;
    the gradients are still right."""
    cases = {
        "gate is up": (gate_input(4, 24, dtype=torch.float32, device=DEV), lambda t: (t, t)),
        "broadcast rows": (gate_input(4, 24, dtype=torch.float32, device=DEV), lambda t: (t[:1].expand(4, 24), t)),
        "permuted": (gate_input(6, 4, 24, dtype=torch.float32, device=DEV),
                     lambda t: (t.transpose(0, 1), t.transpose(0, 1) * 0.5)),
    }
    for name, (base, make) in cases.items():
        ours, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
        gate, up = make(ours)
        assert not activation._writable_in_place(gate, up), name
        out, want = F.swiglu(gate, up, inplace_backward=True), R.swiglu(*make(ref))
        assert_close(out, want, name)
        dh = randn(*out.shape, device=DEV)
        (got,) = torch.autograd.grad(out, (ours,), dh)
        (expected,) = torch.autograd.grad(want, (ref,), dh)
        assert_close(got, expected, f"{name} grad")
        assert torch.equal(ours.detach(), base), f"{name}: input overwritten"


def test_writable_in_place_rules() -> None:
    gu = randn(5, 2, 32)
    gate, up = gu.chunk(2, dim=-1)
    assert activation._writable_in_place(gate, up)  # the halves of one packed tensor share no element
    assert activation._writable_in_place(gu)
    assert not activation._writable_in_place(gate, gate)
    assert not activation._writable_in_place(gu[..., :20], gu[..., 10:30])  # overlapping columns
    assert not activation._writable_in_place(randn(8).expand(4, 8))
    assert not activation._writable_in_place(randn(8, 4).t())  # column-strided
    assert not activation._writable_in_place(randn(3, 4, 8).transpose(0, 1))  # no (rows, cols) view
    assert activation._writable_in_place(randn(3, 8), randn(3, 8))


def test_compile_fullgraph_no_breaks() -> None:
    gate, up, gate_up, x, bias = _inputs()

    def f(gate, up, gate_up, x, bias):
        h = F.swiglu(gate, up) + F.geglu_packed(gate_up, "tanh", inplace_backward=True)
        return F.bias_act(h + x, bias, "gelu")

    wrt = (gate, up, gate_up, x, bias)
    eager = f(*wrt)
    compiled, breaks = compile_and_count_breaks(f, *wrt)
    assert breaks == 0
    assert_close(compiled, eager, "compiled")
