"""Token scales and the argmax (predicted tokens) in the cross-entropy kernels, against the reference
(Triton's interpreter on CPU, the GPU where present): the two-pass forward and its backward, the fused
linear loss's two-pass and one-read chunks, the registered ops under opcheck, first-index ties across
blocks, ignored rows."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops.cross_entropy import (
    FusedLinearArgs,
    cross_entropy_bwd,
    cross_entropy_fwd,
    fused_linear_cross_entropy_bwd,
    fused_linear_cross_entropy_fwd,
    one_read,
)
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.reference.cross_entropy_extras import predicted_tokens
from tests.grid import Poisoned, device_under_test, randn
from tests.ops.cross_entropy_helpers import CASES, IGNORE, block_path, case_inputs, eager_loss, upstream  # noqa: F401
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
DTYPES = (torch.float32, torch.bfloat16)


def _scales(target: torch.Tensor) -> torch.Tensor:
    """Random per-token factors of target's shape, in (0.25, 1.75)."""
    return torch.rand(target.shape, device=target.device) * 1.5 + 0.25


def _assert_argmax(pred: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
    """pred is the reference's argmax where the logits' top two differ; where they tie within one
    rounding (the fused chunks' GEMM may round otherwise than one whole GEMM on the GPU), pred's logit
    is the row's maximum within that rounding."""
    want = predicted_tokens(logits, target, IGNORE).reshape(-1)
    pred = pred.reshape(-1)
    z = logits.reshape(-1, logits.shape[-1]).float()
    differ = pred != want
    if differ.any():
        rows = differ.nonzero()[:, 0]
        assert (pred[rows] >= 0).all(), "ignored rows are -1"
        top = z[rows].max(-1).values
        got = z[rows, pred[rows]]
        assert torch.allclose(got, top, rtol=1e-2, atol=1e-2), f"argmax rows {rows.tolist()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_token_scale_and_argmax_match_reference(case: str, dtype: torch.dtype) -> None:
    lead, v, reduction, options = CASES[case]
    logits, target, weight, opts = case_inputs(lead, v, options, dtype, DEV)
    u = _scales(target)
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    dloss = upstream(reduction, target)
    with Poisoned():
        out = cross_entropy_fwd(logits, target, weight, o, token_scale=u, argmax=True)
        recomputed = cross_entropy_bwd(dloss, logits, target, out, weight, o, token_scale=u)
    assert_close(out.loss, R.cross_entropy(logits, target, weight, o, token_scale=u), "loss")
    ones = torch.ones_like(dloss)
    assert_close(out.grad, R.cross_entropy_backward(ones, logits, target, weight, o, token_scale=u), "grad")
    assert_close(recomputed, R.cross_entropy_backward(dloss, logits, target, weight, o, token_scale=u),
                 "recomputed grad")
    assert torch.equal(out.pred, predicted_tokens(logits, target, IGNORE).reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_token_scaled_loss_within_the_fp64_budget(dtype: torch.dtype) -> None:
    """Token-scaled "sum" and its gradient within 2x PyTorch's own error against fp64 (the per-row
    eager loss in the logits' dtype, times the scales, is the yardstick)."""
    logits, target, weight, opts = case_inputs((5,), 33, {"label_smoothing": 0.1, "ignore": (1,)}, dtype, DEV)
    u = _scales(target)
    dloss = upstream("sum", target)
    out = cross_entropy_fwd(logits, target, weight, O(reduction="sum", **opts), token_scale=u)
    grad = out.grad.float() * dloss
    x64 = logits.double().requires_grad_()
    loss64 = R.cross_entropy(x64, target, None, O(IGNORE, "sum", **opts), token_scale=u.double())
    (grad64,) = torch.autograd.grad(loss64, x64, dloss.double())
    xe = logits.detach().clone().requires_grad_()
    loss_e = (eager_loss(xe, target, None, "none", **opts) * u.to(xe.dtype)).sum()
    (grad_e,) = torch.autograd.grad(loss_e, xe, dloss.to(loss_e.dtype))
    assert_budget(out.loss, loss_e, loss64, "loss vs fp64")
    assert_budget(grad.to(dtype), grad_e, grad64, "grad vs fp64")


@pytest.mark.usefixtures("block_path")
def test_argmax_first_index_across_blocks() -> None:
    """Equal maxima in several blocks and lanes: the first column wins, as torch.argmax; a row of -inf
    gives 0, an ignored row -1."""
    logits = randn(5, 40, device=DEV)
    logits[0, [7, 23, 39]] = 9.0
    logits[1, [33, 17]] = 9.0
    logits[2] = float("-inf")
    logits[3, 0] = 9.0
    logits[3, 16] = 9.0
    target = torch.tensor([1, 2, 3, IGNORE, 0], device=DEV)
    out = cross_entropy_fwd(logits, target, None, O(reduction="none"), with_grad=False, argmax=True)
    assert out.pred.tolist()[:4] == [7, 17, 0, -1]
    assert torch.equal(out.pred, predicted_tokens(logits, target, IGNORE))


N, H, V, CHUNK = 9, 8, 24, 4
# (reduction, options): the one-read kernel ("mean" plain, "sum" capped), the two-pass ("sum" with a
# z-loss and smoothing) and the recomputing "none" backward
FUSED = {
    "one-read-mean": ("mean", {"weighted": True}),
    "one-read-softcap-sum": ("sum", {"softcap": 4.0}),
    "two-pass-sum": ("sum", {"lse_square_scale": 1e-2, "label_smoothing": 0.1}),
    "none": ("none", {"lse_square_scale": 1e-3, "softcap": 6.0}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(FUSED))
def test_fused_token_scale_and_argmax(case: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    reduction, options = FUSED[case]
    opts = dict(options)
    calls: list[int] = []
    launch = one_read.launch_one_read
    monkeypatch.setattr(one_read, "launch_one_read", lambda *a, **k: calls.append(1) or launch(*a, **k))
    x = randn(N, H, dtype=dtype, device=DEV)
    w = randn(V, H, dtype=dtype, device=DEV, scale=H ** -0.5)
    ce_w = (torch.rand(V, device=DEV) + 0.5) if opts.pop("weighted", False) else None
    t = torch.randint(0, V, (N,), device=DEV)
    t[[1, -1]] = IGNORE
    u = _scales(t)
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    args = FusedLinearArgs(w, t, None, ce_w, u)
    dloss = upstream(reduction, t)
    with Poisoned():
        out = fused_linear_cross_entropy_fwd(x, args, o, chunk=CHUNK, argmax=True)
        if reduction == "none":
            grads = fused_linear_cross_entropy_bwd(dloss, x, args, out.lse, o, chunk=CHUNK)
        else:
            grads = tuple(g.float() * dloss if g is not None else None for g in out[2:5])
    assert len(calls) == (3 if case.startswith("one-read") else 0)
    kw = dict(ce_weight=ce_w, options=o, token_scale=u)
    assert_close(out.loss, R.fused_linear_cross_entropy(x, w, t, **kw), "loss")
    ref = R.fused_linear_cross_entropy_backward(dloss, x, w, t, **kw)
    for name, got, want in zip(("grad_x", "grad_w"), grads, ref):
        assert_close(got.to(want.dtype), want, name)
    _assert_argmax(out.pred, torch.nn.functional.linear(x, w), t)
    assert (out.pred[[1, -1]] == -1).all()


def test_opcheck_with_token_scale_and_argmax() -> None:
    """Both registered forwards with the new trailing arguments (one call each: opcheck is slow)."""
    logits = randn(5, 12, device=DEV).requires_grad_()
    target = torch.randint(0, 12, (5,), device=DEV)
    target[1] = IGNORE
    u = _scales(target)
    torch.library.opcheck(torch.ops.kernel_pytorch.cross_entropy_fwd.default,
                          (logits, target, None, IGNORE, "mean", 0.0, 1e-3, 4.0, True, u, True))
    x, w = randn(5, 8, device=DEV).requires_grad_(), randn(12, 8, device=DEV).requires_grad_()
    torch.library.opcheck(torch.ops.kernel_pytorch.fused_linear_cross_entropy_fwd.default,
                          (x, w, target, None, None, IGNORE, "none", 0.0, 1e-3, 0.0, True, True, False, u, True))
