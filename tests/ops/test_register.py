"""ops/_common/register.register_op on toy ops: several outputs, an optional tensor input, float/int/bool/str
arguments, an output that is not differentiated, a backward with gradients for some inputs only, one-tensor
outputs, and a forward-only op. Each is checked with opcheck, autograd (gradcheck in fp64 through the
reference kernel, and through the Triton launchers of the eager entry), torch.compile(fullgraph=True) and
torch.export; the launchers run under TRITON_INTERPRET=1 on CPU."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._common.launch import Launcher
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.reference._math import acc, acc_dtype
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
NS = "kernel_pytorch_test"
_BLOCK = 64


@triton.jit
def _scaled_add_kernel(
    X, S, Y, OUT, XS, n, n_cols, alpha,
    HAS_S: tl.constexpr, HAS_Y: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr,
):
    # out = alpha * x [* s] [+/- y]; with HAS_S, also XS = x * s; math in XS's dtype (fp32, or fp64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = XS.dtype.element_ty
    x = tl.load(X + offs, mask=mask).to(acc)
    if HAS_S:
        x = x * tl.load(S + offs % n_cols, mask=mask).to(acc)
        tl.store(XS + offs, x, mask=mask)
    out = alpha * x
    if HAS_Y:
        y = tl.load(Y + offs, mask=mask).to(acc)
        out = out - y if SUB else out + y
    tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)


_kernel = Launcher(_scaled_add_kernel)


def _launch(
    x: Tensor, s: Tensor | None, y: Tensor | None, alpha: float, sub: bool, eager: bool
) -> tuple[Tensor, Tensor]:
    x = x.contiguous()
    out = torch.empty_like(x)
    xs = torch.empty(x.shape, dtype=acc_dtype(x.dtype), device=x.device)
    n = x.numel()
    if n:
        _kernel(
            (triton.cdiv(n, _BLOCK),), x, s if s is not None else x, y.contiguous() if y is not None else x,
            out, xs, n, x.shape[-1], float(alpha),
            HAS_S=s is not None, HAS_Y=y is not None, SUB=sub, BLOCK=_BLOCK, num_warps=1, eager=eager,
        )
    return out, xs


# --- scaled_add: out = alpha * x * scale +/- y, xs = x * scale (fp32 or fp64, not differentiated) --------


def scaled_add_fwd(
    x: Tensor, scale: Tensor, y: Tensor | None, alpha: float, mode: str, *, eager: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Returns (out, xs) and a trailing extra value, which the op drops."""
    out, xs = _launch(x, scale, y, alpha, mode == "sub", eager)
    return out, xs, None


def scaled_add_bwd(
    dout: Tensor, scale: Tensor, alpha: float, mode: str, has_y: bool, *, eager: bool = False
) -> tuple[Tensor, Tensor | None]:
    dx, _ = _launch(dout, scale, None, alpha, False, eager)
    dy = _launch(dout, None, None, -1.0 if mode == "sub" else 1.0, False, eager)[0] if has_y else None
    return dx, dy


def _fwd_reference(x: Tensor, scale: Tensor, y: Tensor | None, alpha: float, mode: str) -> tuple[Tensor, Tensor]:
    xs = acc(x) * acc(scale)
    out = alpha * xs
    if y is not None:
        out = out - acc(y) if mode == "sub" else out + acc(y)
    return out.to(x.dtype), xs


def _bwd_reference(
    dout: Tensor, scale: Tensor, alpha: float, mode: str, has_y: bool
) -> tuple[Tensor, Tensor | None]:
    dx = (alpha * acc(dout) * acc(scale)).to(dout.dtype)
    dy = (-dout if mode == "sub" else dout.clone()) if has_y else None
    return dx, dy


def _fwd_fake(x: Tensor, scale: Tensor, y: Tensor | None, alpha: float, mode: str) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty(x.shape, dtype=acc_dtype(x.dtype), device=x.device)


def _bwd_fake(dout: Tensor, scale: Tensor, alpha: float, mode: str, has_y: bool) -> tuple[Tensor, Tensor | None]:
    return torch.empty_like(dout), torch.empty_like(dout) if has_y else None


scaled_add_fwd_op, scaled_add_bwd_op, scaled_add_eager = register_op(
    "scaled_add",
    Impl(scaled_add_fwd, _fwd_reference, _fwd_fake, outputs=("out", "xs")),
    Impl(scaled_add_bwd, _bwd_reference, _bwd_fake, outputs=("dx", "dy")),
    differentiable=("out",),
    save=("scale",),
    keep=("alpha", "mode"),
    present=("y",),
    grads={"x": "dx", "y": "dy"},  # scale, alpha, mode: no gradient
    namespace=NS,
)


# --- scale: out = factor * x (negated with negate): one-tensor outputs, int and bool arguments ---------


def scale_fwd(x: Tensor, factor: int, negate: bool, *, eager: bool = False) -> Tensor:
    return _launch(x, None, None, -factor if negate else factor, False, eager)[0]


def scale_bwd(dout: Tensor, factor: int, negate: bool, *, eager: bool = False) -> Tensor:
    return scale_fwd(dout, factor, negate, eager=eager)


def _scale_reference(x: Tensor, factor: int, negate: bool) -> Tensor:
    return (acc(x) * (-factor if negate else factor)).to(x.dtype)


def _scale_fake(x: Tensor, factor: int, negate: bool) -> Tensor:
    return torch.empty_like(x)


scale_fwd_op, scale_bwd_op, scale_eager = register_op(
    "scale",
    Impl(scale_fwd, _scale_reference, _scale_fake, outputs=("out",)),
    Impl(scale_bwd, _scale_reference, _scale_fake, outputs=("dx",)),
    differentiable=("out",),
    keep=("factor", "negate"),
    grads={"x": "dx"},
    namespace=NS,
)
scale_only_fwd_op, no_bwd, scale_only_eager = register_op(
    "scale_only", Impl(scale_fwd, _scale_reference, _scale_fake, outputs=("out",)), namespace=NS
)
# the same, its fake derived from the reference run on meta tensors
register_op("scale_meta", Impl(scale_fwd, _scale_reference, "reference", outputs=("out",)), namespace=NS)

OPS = getattr(torch.ops, NS)
MODES = ["add", "sub"]


def _inputs(dtype: torch.dtype = torch.float32, with_y: bool = True, grad: bool = False):
    x = randn(3, 5, 16, dtype=dtype, device=DEV).requires_grad_(grad)
    s = randn(16, dtype=dtype, device=DEV, offset=1.0)
    y = randn(3, 5, 16, dtype=dtype, device=DEV).requires_grad_(grad) if with_y else None
    return x, s, y


def test_schemas_come_from_the_references() -> None:
    assert str(OPS.scaled_add_fwd.default._schema) == (
        f"{NS}::scaled_add_fwd(Tensor x, Tensor scale, Tensor? y, float alpha, str mode) -> (Tensor, Tensor)"
    )
    assert str(OPS.scaled_add_bwd.default._schema) == (
        f"{NS}::scaled_add_bwd(Tensor dout, Tensor scale, float alpha, str mode, bool has_y) -> (Tensor, Tensor)"
    )
    assert str(OPS.scale_fwd.default._schema) == f"{NS}::scale_fwd(Tensor x, SymInt factor, bool negate) -> Tensor"
    assert no_bwd is None and not hasattr(OPS, "scale_only_bwd")


@pytest.mark.parametrize("with_y", [True, False], ids=["y", "no-y"])
@pytest.mark.parametrize("mode", MODES)
def test_launchers_match_reference(mode: str, with_y: bool) -> None:
    x, s, y = _inputs(torch.bfloat16, with_y)
    out, xs, extra = scaled_add_fwd(x, s, y, 0.5, mode)
    ref_out, ref_xs = _fwd_reference(x, s, y, 0.5, mode)
    assert extra is None
    assert_close(out, ref_out, "out")
    assert_close(xs, ref_xs, "xs")
    dout = randn(*x.shape, dtype=x.dtype, device=DEV)
    for got, want, name in zip(scaled_add_bwd(dout, s, 0.5, mode, with_y), _bwd_reference(dout, s, 0.5, mode, with_y),
                               ("dx", "dy")):
        assert (got is None) == (want is None), name
        if got is not None:
            assert_close(got, want, name)


@pytest.mark.parametrize("with_y", [True, False], ids=["y", "no-y"])
@pytest.mark.parametrize("mode", MODES)
def test_opcheck(mode: str, with_y: bool) -> None:
    x, s, y = _inputs(with_y=with_y, grad=True)
    torch.library.opcheck(OPS.scaled_add_fwd.default, (x, s, y, 0.5, mode))
    dout = randn(*x.shape, device=DEV)
    torch.library.opcheck(OPS.scaled_add_bwd.default, (dout, s, 0.5, mode, with_y))
    torch.library.opcheck(OPS.scale_fwd.default, (x, 3, True))
    torch.library.opcheck(OPS.scale_bwd.default, (dout, 3, False))
    torch.library.opcheck(OPS.scale_only_fwd.default, (x.detach(), 2, False))


def test_absent_gradient_is_an_empty_tensor_in_the_op() -> None:
    dout, s = randn(4, 16, device=DEV), randn(16, device=DEV)
    dx, dy = OPS.scaled_add_bwd(dout, s, 0.5, "add", False)
    assert dy.numel() == 0 and dy.device == dout.device
    assert_close(dx, 0.5 * dout * s, "dx")


@pytest.mark.parametrize("with_y", [True, False], ids=["y", "no-y"])
@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_fp64_through_the_op(mode: str, with_y: bool) -> None:
    """The op's registered autograd: gradients for x and y (None for an absent y), none for scale."""
    x, s, y = _inputs(torch.float64, with_y, grad=True)
    s.requires_grad_()  # declared without a gradient: autograd sees None
    wrt = (x, y) if with_y else (x,)
    torch.autograd.gradcheck(lambda *t: OPS.scaled_add_fwd(t[0], s.detach(), *(t[1:] or (None,)), 0.7, mode)[0], wrt)
    out, _ = OPS.scaled_add_fwd(x, s, y, 0.7, mode)
    grads = torch.autograd.grad(out.sum(), (x, s) + ((y,) if with_y else ()), allow_unused=True)
    assert grads[1] is None
    torch.autograd.gradcheck(lambda t: OPS.scale_fwd(t, 3, True), (x,))


@pytest.mark.parametrize("with_y", [True, False], ids=["y", "no-y"])
def test_gradcheck_fp64_through_the_eager_entry(with_y: bool) -> None:
    """The eager autograd.Function runs the launchers (Triton's interpreter on CPU)."""
    x, s, y = _inputs(torch.float64, with_y, grad=True)
    wrt = (x, y) if with_y else (x,)
    torch.autograd.gradcheck(lambda *t: scaled_add_eager(t[0], s, *(t[1:] or (None,)), 0.7, "sub"), wrt)
    torch.autograd.gradcheck(lambda t: scale_eager(t, 3, True), (x,))


def test_eager_entry_returns_the_differentiable_outputs() -> None:
    x, s, y = _inputs(grad=True)
    out = scaled_add_eager(x, s, y, 0.5, "add")
    assert isinstance(out, Tensor) and out.requires_grad
    assert_close(out, _fwd_reference(x, s, y, 0.5, "add")[0], "out")
    assert_close(scale_eager(x, 2, False), 2 * x, "scale")
    assert_close(scale_only_eager(x.detach(), 2, True), -2 * x, "scale_only")


def test_forward_only_op_has_no_backward() -> None:
    out = OPS.scale_only_fwd(randn(3, 4, device=DEV).requires_grad_(), 2, False)
    with pytest.raises(RuntimeError, match="no autograd formula was registered"):
        out.sum().backward()


@pytest.mark.parametrize("with_y", [True, False], ids=["y", "no-y"])
def test_compile_fullgraph_same_grads(with_y: bool) -> None:
    x, s, y = _inputs(with_y=with_y, grad=True)
    wrt = (x, y) if with_y else (x,)

    def f(x, y):
        out, xs = OPS.scaled_add_fwd(x, s, y, 0.5, "sub")
        return OPS.scale_fwd(out, 2, False) * xs + OPS.scale_only_fwd(xs.detach(), 3, True)

    eager = f(x, y)
    compiled, breaks = compile_and_count_breaks(f, x, y)
    assert breaks == 0
    assert_close(compiled, eager, "compiled")
    dout = randn(*x.shape, device=DEV)
    for a, e in zip(torch.autograd.grad(compiled, wrt, dout), torch.autograd.grad(eager, wrt, dout)):
        assert_close(a, e, "compiled grad")


def test_export() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.s = torch.nn.Parameter(randn(16, offset=1.0))

        def forward(self, x, y):
            out, _ = OPS.scaled_add_fwd(x, self.s, y, 0.5, "add")
            return OPS.scale_only_fwd(out, 2, False)

    x, y = randn(3, 16), randn(3, 16)
    ep = torch.export.export(M(), (x, y))
    assert f"{NS}.scaled_add_fwd" in str(ep.graph) and f"{NS}.scale_only_fwd" in str(ep.graph)
    assert_close(ep.module()(x, y), 2 * _fwd_reference(x, ep.module().s, y, 0.5, "add")[0], "out")


def _describe(**changes):
    spec = dict(
        differentiable=("out",), save=("scale",), keep=("alpha", "mode"), present=("y",),
        grads={"x": "dx", "y": "dy"}, namespace=NS,
    )
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"save": ("weight",)}, "save names"),
        ({"keep": ("alpha",)}, "takes 5 arguments; the description gives 4"),
        ({"present": ("scale",)}, "not optional tensor inputs"),
        ({"grads": {"x": "dweight"}}, "grads names"),
        ({"differentiable": ()}, "at least one differentiable output"),
    ],
)
def test_descriptions_that_do_not_fit_the_backward_are_refused(changes: dict, message: str) -> None:
    # refused before anything is registered, so every case can use one name
    with pytest.raises(ValueError, match=message):
        register_op(
            "refused",
            Impl(scaled_add_fwd, _fwd_reference, _fwd_fake, outputs=("out", "xs")),
            Impl(scaled_add_bwd, _bwd_reference, _bwd_fake, outputs=("dx", "dy")),
            **_describe(**changes),
        )


def test_fake_from_the_reference() -> None:
    x = randn(3, 5, 16, device=DEV)
    torch.library.opcheck(OPS.scale_meta_fwd.default, (x, 3, True))
    # the fake follows the reference's strides (this toy's launcher writes contiguous outputs, so only
    # contiguous inputs are opchecked on CUDA)
    xt = x.transpose(0, 2)
    with torch._subclasses.FakeTensorMode() as mode:
        out = OPS.scale_meta_fwd(mode.from_tensor(xt), 2, False)
    assert out.shape == xt.shape and out.stride() == xt.stride() and out.device == x.device
    with pytest.raises(ValueError, match='fake is a function or "reference"'):
        register_op("refused", Impl(scale_fwd, _scale_reference, "ref", outputs=("out",)), namespace=NS)


def test_a_launcher_without_an_eager_keyword_is_refused() -> None:
    with pytest.raises(TypeError, match="keyword-only `eager` parameter"):
        register_op("refused", Impl(lambda x, factor, negate: x, _scale_reference, _scale_fake, outputs=("out",)),
                    namespace=NS)
    assert not hasattr(OPS, "refused_fwd")
