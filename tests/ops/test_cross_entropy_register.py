"""The registered cross-entropy ops (kernel_pytorch::cross_entropy_* and fused_linear_cross_entropy_*):
opcheck, compile (fullgraph, no breaks) and export, gradients for any upstream gradient, and the eager
entries (the launchers without the dispatcher; Triton's interpreter on CPU) scaling their saved
gradients in place."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops.cross_entropy import cross_entropy_eager, fused_linear_cross_entropy_eager
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.cross_entropy_helpers import IGNORE, upstream
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
CE = torch.ops.kernel_pytorch.cross_entropy_fwd
FLCE = torch.ops.kernel_pytorch.fused_linear_cross_entropy_fwd
# (reduction, label_smoothing, lse_square_scale, softcap: 0.0 for none)
OPTIONS = [("mean", 0.1, 0.0, 0.0), ("sum", 0.0, 1e-3, 4.0), ("none", 0.05, 1e-3, 0.0)]
# opcheck is slow (~5 s a call): every option at once, for each kind of backward (scaled, per row)
OPCHECK = [("mean", 0.1, 1e-3, 4.0), ("none", 0.05, 1e-3, 4.0)]


def _targets(n: int, v: int) -> torch.Tensor:
    t = torch.randint(0, v, (n,), device=DEV)
    t[1] = IGNORE
    return t


def _ce_args(logits, target, weight, reduction, eps, z, cap, with_grad=True):
    return (logits, target, weight, IGNORE, reduction, eps, z, cap, with_grad)


def _ref_ce(logits, target, weight, reduction, eps, z, cap):
    return R.cross_entropy(logits, target, weight, O(IGNORE, reduction, eps, z, cap or None))


@pytest.mark.parametrize("options", OPCHECK, ids=[o[0] for o in OPCHECK])
def test_cross_entropy_opcheck(options) -> None:
    logits = randn(5, 12, device=DEV).requires_grad_()
    target, weight = _targets(5, 12), torch.rand(12, device=DEV) + 0.5
    torch.library.opcheck(CE.default, _ce_args(logits, target, weight, *options))
    grad = CE(*_ce_args(logits.detach(), target, weight, *options))[2]
    torch.library.opcheck(torch.ops.kernel_pytorch.cross_entropy_bwd.default, (upstream(options[0], target), grad))


@pytest.mark.parametrize("options", OPCHECK[1:], ids=[o[0] for o in OPCHECK[1:]])
def test_fused_linear_cross_entropy_opcheck(options) -> None:
    x, w = randn(5, 8, device=DEV).requires_grad_(), randn(12, 8, device=DEV).requires_grad_()
    b, target = randn(12, device=DEV).requires_grad_(), _targets(5, 12)
    torch.library.opcheck(FLCE.default, (x, w, target, b, None, IGNORE, *options, True, True, True))


@pytest.mark.parametrize("options", OPTIONS, ids=[o[0] for o in OPTIONS])
def test_gradients_for_any_upstream_gradient(options) -> None:
    logits = randn(2, 3, 12, device=DEV).requires_grad_()
    target, weight = torch.randint(0, 12, (2, 3), device=DEV), torch.rand(12, device=DEV) + 0.5
    target[0, 1] = IGNORE
    loss = CE(*_ce_args(logits, target, weight, *options))[0]
    want = _ref_ce(logits, target, weight, *options)
    dloss = upstream(options[0], target)
    assert_close(loss, want, "loss")
    assert_close(torch.autograd.grad(loss, logits, dloss)[0], torch.autograd.grad(want, logits, dloss)[0], "grad")


def test_compile_fullgraph_no_breaks_same_grads() -> None:
    logits, x = randn(4, 10, device=DEV).requires_grad_(), randn(4, 6, device=DEV).requires_grad_()
    w, target = randn(10, 6, device=DEV).requires_grad_(), _targets(4, 10)

    def f(logits, x, w):
        ce = CE(*_ce_args(logits, target, None, "mean", 0.1, 0.0, 0.0))[0]
        flce = FLCE(x, w, target, None, None, IGNORE, "sum", 0.0, 1e-3, 0.0, True, True, False)[0]
        return ce * 2.0 + flce

    eager = torch.autograd.grad(f(logits, x, w), (logits, x, w))
    out, breaks = compile_and_count_breaks(f, logits, x, w)
    assert breaks == 0
    for got, want in zip(torch.autograd.grad(out, (logits, x, w)), eager):
        assert_close(got, want, "compiled grad")


def test_export() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(randn(10, 6))

        def forward(self, x, target):
            logits = x @ self.w.t()
            ce = CE(logits, target, None, IGNORE, "mean", 0.0, 0.0, 0.0, False)[0]
            return ce + FLCE(x, self.w, target, None, None, IGNORE, "mean", 0.0, 0.0, 0.0, False, False, False)[0]

    x, target = randn(4, 6), _targets(4, 10).cpu()
    ep = torch.export.export(M(), (x, target))
    graph = str(ep.graph)
    assert "kernel_pytorch.cross_entropy_fwd" in graph and "kernel_pytorch.fused_linear_cross_entropy_fwd" in graph
    w = ep.module().w
    want = R.cross_entropy(x @ w.t(), target) + R.fused_linear_cross_entropy(x, w, target)
    assert_close(ep.module()(x, target), want, "exported")


def test_eager_entries_scale_saved_gradients_once() -> None:
    """The eager entries (interpreter on CPU) match the reference for an upstream gradient != 1; the fast
    path's refuses a second backward (it scaled its saved gradient in place; with KERNEL_PYTORCH_FAST_PATH=0
    the entry is the registered op, whose backward scales a copy)."""
    logits = randn(3, 20, device=DEV).requires_grad_()
    target = _targets(3, 20)
    loss = cross_entropy_eager(logits, target, None, IGNORE, "none", 0.1, 1e-3, 5.0, True)
    want = R.cross_entropy(logits, target, None, O(IGNORE, "none", 0.1, 1e-3, 5.0))
    dloss = upstream("none", target)
    assert_close(loss, want, "loss")
    assert_close(torch.autograd.grad(loss, logits, dloss, retain_graph=True)[0],
                 torch.autograd.grad(want, logits, dloss)[0], "grad")
    if hasattr(cross_entropy_eager, "Function"):  # the fast path's entry
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(loss, logits, dloss)

    x, w, b = (randn(*s, device=DEV).requires_grad_() for s in ((3, 8), (20, 8), (20,)))
    loss = fused_linear_cross_entropy_eager(x, w, target, b, None, IGNORE, "mean", 0.0, 0.0, 0.0, True, True, True)
    want = R.fused_linear_cross_entropy(x, w, target, b)
    assert_close(loss, want, "flce loss")
    dloss = torch.tensor(0.75, device=DEV)
    for got, ref in zip(torch.autograd.grad(loss, (x, w, b), dloss), torch.autograd.grad(want, (x, w, b), dloss)):
        assert_close(got, ref, "flce grad")


def test_options_flatten_into_the_op_schemas_once() -> None:
    """The op schemas take CrossEntropyOptions.FLAT where the options go, in that order; `flat` and
    `from_flat` round-trip (softcap None <-> 0.0); an OpSignature names a call's arguments back."""
    from kernel_pytorch.ops.cross_entropy.register import FWD

    names = [a.name for a in CE.default._schema.arguments]
    flat = [name for name, _ in O.FLAT]
    assert names[3:8] == flat
    fl_names = [a.name for a in FLCE.default._schema.arguments]
    assert fl_names[5:10] == flat
    for o in (O(), O(7, "none", 0.1, 1e-3, 4.0)):
        assert O.from_flat(*o.flat()) == o
    assert O(softcap=None).flat()[-1] == 0.0
    logits, target = randn(2, 5), torch.zeros(2, dtype=torch.long)
    call = FWD.parse((logits, target, None, *O(3, "sum", softcap=2.0).flat(), False))
    assert call.options == O(3, "sum", softcap=2.0) and call.with_grad is False
    assert call.token_scale is None and call.argmax is False  # the trailing defaults
