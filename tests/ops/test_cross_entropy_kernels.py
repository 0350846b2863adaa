"""Cross-entropy launchers against the reference (Triton's interpreter on CPU, the GPU where present):
every option and reduction, one block and looped rows, persistent and reversed schedules, in-place
gradients over strided views, bad targets and non-finite logits, the scaling kernel."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.row_view import row_view
from kernel_pytorch.ops._common.scale import scale_grad_
from kernel_pytorch.ops.cross_entropy import FwdLaunch, cross_entropy_bwd, cross_entropy_fwd, cross_entropy_stats
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.reference.cross_entropy import cross_entropy_denominators, cross_entropy_rows
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.cross_entropy_helpers import CASES, IGNORE, block_path, case_inputs, eager_loss, upstream  # noqa: F401
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()


def _check(logits, target, weight, reduction, opts, *, inplace: bool = False) -> None:
    """Forward (with its gradient for an upstream 1, scaled afterwards as the backward would) and the
    recomputing backward, against the reference (tolerance table) and against fp64 with PyTorch's own
    low-precision eager loss as the yardstick (fp64-derived budget)."""
    dloss = upstream(reduction, target)
    ref_kw = dict(ignore_index=IGNORE, reduction=reduction, **opts)
    o = O(**ref_kw)
    x = logits.clone() if inplace else logits
    with Poisoned():
        out = cross_entropy_fwd(x, target, weight, o, grad_inplace=inplace)
        recomputed = cross_entropy_bwd(dloss, logits, target, out, weight, o)
    assert_close(out.loss, R.cross_entropy(logits, target, weight, o), "loss")
    lse_ref = cross_entropy_rows(logits, target, weight, O(IGNORE, softcap=opts.get("softcap")))[2]
    valid = target.reshape(-1) != IGNORE
    assert_close(out.lse[valid], lse_ref[valid], "lse")
    assert torch.equal(out.lse[~valid], torch.zeros_like(out.lse[~valid]))
    ones = torch.ones_like(dloss)
    assert_close(out.grad, R.cross_entropy_backward(ones, logits, target, weight, o), "grad (upstream 1)")
    if inplace:
        assert out.grad.data_ptr() == x.data_ptr()
    if reduction != "none":  # the "mean"/"sum" backward: the forward's gradient times the upstream one
        scale_grad_(out.grad, dloss)
        assert_close(out.grad, R.cross_entropy_backward(dloss, logits, target, weight, o), "scaled grad")
    assert_close(recomputed, R.cross_entropy_backward(dloss, logits, target, weight, o), "recomputed grad")
    # fp64-derived budget: within 2x PyTorch's own error in the logits' dtype
    x64 = logits.double().requires_grad_()
    w64 = weight.double() if weight is not None else None
    loss64 = R.cross_entropy(x64, target, w64, o)
    (grad64,) = torch.autograd.grad(loss64, x64, dloss.double())
    xe = logits.detach().clone().requires_grad_()
    loss_e = eager_loss(xe, target, weight, **{k: v for k, v in ref_kw.items() if k != "ignore_index"})
    (grad_e,) = torch.autograd.grad(loss_e, xe, dloss.to(loss_e.dtype))
    assert_budget(out.loss, loss_e, loss64, "loss vs fp64")
    assert_budget(recomputed, grad_e, grad64, "grad vs fp64")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_kernels_match_reference(case: str, dtype: torch.dtype) -> None:
    lead, v, reduction, options = CASES[case]
    logits, target, weight, opts = case_inputs(lead, v, options, dtype, DEV)
    _check(logits, target, weight, reduction, opts)


@pytest.mark.usefixtures("block_path")
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1] > 1])
def test_looped_rows_in_place(case: str) -> None:
    """Several blocks per row (online max and sums across blocks, masked tails), gradient in place."""
    lead, v, reduction, options = CASES[case]
    logits, target, weight, opts = case_inputs(lead, v, options, torch.bfloat16, DEV)
    _check(logits, target, weight, reduction, opts, inplace=True)


@pytest.mark.parametrize("launch", [FwdLaunch(16, 1, 1, False, True), FwdLaunch(32, 1, 2, True, True),
                                    FwdLaunch(16, 1, 0, True, False, prefetch=False)],
                         ids=["persistent-reverse", "two-per-sm-reverse", "no-prefetch"])
def test_forward_schedules(launch: FwdLaunch) -> None:
    """Persistent programs walking more rows than there are programs; pass 2 walking rows backwards;
    blocks loaded one at a time."""
    logits, target, weight, opts = case_inputs((11,), 40, {"weighted": True, "label_smoothing": 0.1,
                                                           "ignore": (3, 10)}, torch.float32, DEV)
    with tuning.changed("cross_entropy", fwd=launch, loss=None):
        _check(logits, target, weight, "mean", opts)


def test_launch_config_is_the_tuning_familys() -> None:
    """The launchers read the config in force: the registered default, or an override for its block."""
    from kernel_pytorch.ops.cross_entropy import CrossEntropyConfig
    from kernel_pytorch.ops.cross_entropy.launch import fwd_launch

    assert tuning.default("cross_entropy") == CrossEntropyConfig()
    assert fwd_launch(1 << 20).block == CrossEntropyConfig().fwd.block
    assert fwd_launch(1 << 20, grad=False).block == CrossEntropyConfig().loss.block
    with tuning.changed("cross_entropy", fwd=FwdLaunch(64, 1, 0, True, False), loss=None):
        assert fwd_launch(1 << 20, grad=False) == FwdLaunch(64, 1, 0, True, False)
    assert fwd_launch(100).block == 128  # narrowed to the row


def test_shifted_view_in_place_without_copy() -> None:
    """logits[:, :-1] of a (B, T, V) tensor: addressed in place by two index levels, nothing copied,
    the excluded time step untouched."""
    base = randn(2, 5, 24, dtype=torch.bfloat16, device=DEV, scale=2.0)
    before = base.clone()
    view = base[:, :-1]
    rows = row_view(view)
    assert rows.same_storage(view) and rows.inner == 4
    target = torch.randint(0, 24, (2, 4), device=DEV)
    out = cross_entropy_fwd(view, target, None, O(reduction="sum"), grad_inplace=True)
    assert out.grad.data_ptr() == view.data_ptr()
    assert_close(out.loss, R.cross_entropy(before[:, :-1], target, None, O(reduction="sum")), "loss")
    one = torch.ones((), device=DEV)
    assert_close(view, R.cross_entropy_backward(one, before[:, :-1], target, None, O(reduction="sum")), "grad")
    assert torch.equal(base[:, -1], before[:, -1])


def test_strided_targets_and_weights() -> None:
    logits = randn(6, 24, device=DEV)
    target = torch.randint(0, 24, (12,), device=DEV)[::2]
    target[1] = IGNORE
    weight = (torch.rand(48, device=DEV) + 0.5)[::2]
    _check(logits, target, weight, "mean", {"label_smoothing": 0.1})


def test_strided_columns_are_copied_once() -> None:
    logits = randn(24, 6, device=DEV).t()  # (6, 24), column stride 6
    target = torch.randint(0, 24, (6,), device=DEV)
    out = cross_entropy_fwd(logits, target, grad_inplace=True)
    assert_close(out.grad, R.cross_entropy_backward(torch.ones((), device=DEV), logits, target), "grad")


def test_all_ignored_mean_is_nan_and_gradient_zero() -> None:
    logits = randn(4, 9, device=DEV)
    target = torch.full((4,), IGNORE, device=DEV)
    for opts in ({}, {"label_smoothing": 0.1, "lse_square_scale": 1e-2}):
        out = cross_entropy_fwd(logits, target, None, O(**opts))
        assert torch.isnan(out.loss)
        assert torch.equal(out.grad, torch.zeros_like(logits))
        assert cross_entropy_fwd(logits, target, None, O(reduction="sum", **opts)).loss == 0


def test_bad_targets_give_nan_rows_only() -> None:
    """Out-of-range targets are never dereferenced: their rows' loss and gradient are NaN, and the
    other rows are unaffected."""
    logits = randn(4, 9, device=DEV)
    target = torch.tensor([1, 9, -3, 2], device=DEV)
    out = cross_entropy_fwd(logits, target, None, O(reduction="none"))
    assert torch.isnan(out.loss[1:3]).all() and torch.isnan(out.grad[1:3]).all()
    good = torch.tensor([0, 3])
    ref = R.cross_entropy(logits[good], target[good], None, O(reduction="none"))
    assert_close(out.loss[good], ref, "loss of good rows")
    ones = torch.ones(2, device=DEV)
    assert_close(out.grad[good], R.cross_entropy_backward(ones, logits[good], target[good], None, O(reduction="none")),
                 "grad of good rows")


def test_nonfinite_logits() -> None:
    """NaN or +inf in a row makes its loss NaN; -inf logits (masked classes) are fine; a row of only
    -inf is NaN, as in torch."""
    logits = randn(4, 9, device=DEV)
    logits[0, 2] = float("nan")
    logits[1, 3] = float("inf")
    logits[2, 4:] = float("-inf")
    logits[3] = float("-inf")
    target = torch.tensor([1, 2, 3, 0], device=DEV)
    out = cross_entropy_fwd(logits, target, None, O(reduction="none"))
    expected = torch.nn.functional.cross_entropy(logits.cpu(), target.cpu(), reduction="none")
    assert torch.isnan(out.loss[[0, 1, 3]]).all() and torch.isnan(expected[[0, 1, 3]]).all()
    assert_close(out.loss[2], expected[2].to(DEV), "row with masked classes")
    one = torch.ones(1, device=DEV)
    assert_close(out.grad[2], R.cross_entropy_backward(one, logits[2:3], target[2:3], None, O(reduction="none"))[0],
                 "grad of the row with masked classes")


def test_scale_grad_touches_nothing_for_one() -> None:
    grad = randn(5, 2, 33, dtype=torch.bfloat16, device=DEV)[:, 1]  # strided rows
    before = grad.clone()
    scale_grad_(grad, torch.ones((), device=DEV))
    assert torch.equal(grad, before)
    scale_grad_(grad, torch.full((), 0.3, device=DEV))
    assert_close(grad, (before.float() * 0.3).to(torch.bfloat16), "scaled")
    with pytest.raises(ValueError, match="unit last-dim stride"):
        scale_grad_(randn(8, 4, device=DEV).t(), torch.ones(()))


def test_stats_match_the_reference_denominators() -> None:
    target = torch.tensor([0, IGNORE, 3, 3, 7], device=DEV)
    weight = torch.rand(8, device=DEV) + 0.5
    stats = cross_entropy_stats(target, weight, 8, IGNORE)
    wden, count = cross_entropy_denominators(target, weight, IGNORE)
    torch.testing.assert_close(stats, torch.stack([wden, count, weight.sum()]))
    assert cross_entropy_stats(target, None, 8, IGNORE).tolist() == [4.0, 4.0, 8.0]


def test_empty_rows() -> None:
    logits = randn(0, 9, device=DEV)
    target = torch.zeros(0, dtype=torch.long, device=DEV)
    out = cross_entropy_fwd(logits, target, None, O(reduction="sum"))
    assert out.loss == 0 and out.grad.shape == (0, 9)
    assert cross_entropy_bwd(torch.ones((), device=DEV), logits, target, out).shape == (0, 9)


# --- GPU only: real vocabularies, determinism ------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("rows,vocab", [(256, 128256), (64, 262144), (512, 32000)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_real_vocabularies(rows: int, vocab: int, dtype: torch.dtype) -> None:
    logits, target, weight, opts = case_inputs((rows,), vocab, {"ignore": (0, 5), "label_smoothing": 0.1,
                                                                "softcap": 30.0}, dtype, "cuda")
    _check(logits, target, weight, "mean", opts, inplace=True)


@pytest.mark.cuda
def test_cuda_bitwise_deterministic() -> None:
    logits, target, weight, opts = case_inputs((333,), 50257, {"weighted": True, "label_smoothing": 0.1,
                                                               "lse_square_scale": 1e-4}, torch.bfloat16, "cuda")
    a = cross_entropy_fwd(logits, target, weight, O(**opts))
    b = cross_entropy_fwd(logits, target, weight, O(**opts))
    assert torch.equal(a.loss, b.loss) and torch.equal(a.grad, b.grad) and torch.equal(a.lse, b.lse)
