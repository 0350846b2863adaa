"""The cross-entropy references against torch (fp64) and transformers' loss, their explicit backward
against autograd, and the argument checks. No Triton here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_pytorch import reference as R
from kernel_pytorch.reference import cross_entropy_checks as C
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.reference.cross_entropy import cross_entropy_denominators
from tests.grid import randn
from tests.ops.norm_helpers import assert_close

V = 11
IGNORE = -100


def _targets(n: int, v: int = V, ignored: tuple[int, ...] = (1,)) -> torch.Tensor:
    t = torch.randint(0, v, (n,))
    t[list(ignored)] = IGNORE
    return t


def _weight(v: int = V, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return (torch.rand(v) + 0.5).to(dtype)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_torch_fp64(reduction: str, smoothing: float, weighted: bool) -> None:
    """torch's own semantics, weighted mean and label smoothing with weights included."""
    x = randn(7, V, dtype=torch.float64, scale=2.0)
    t = _targets(7, ignored=(1, 4))
    w = _weight() if weighted else None
    ours = R.cross_entropy(x, t, w, O(IGNORE, reduction, smoothing))
    theirs = F.cross_entropy(x, t, w, ignore_index=IGNORE, reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_leading_dims_and_uint8_targets() -> None:
    x = randn(2, 3, V, dtype=torch.float64)
    t = torch.randint(0, V, (2, 3), dtype=torch.uint8)
    ours = R.cross_entropy(x, t, None, O(reduction="none"))
    assert ours.shape == (2, 3)
    torch.testing.assert_close(ours, F.cross_entropy(x.reshape(-1, V), t.reshape(-1), reduction="none").view(2, 3))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [
    {},
    {"label_smoothing": 0.2, "weighted": True},
    {"lse_square_scale": 1e-2, "softcap": 3.0},
    {"label_smoothing": 0.1, "lse_square_scale": 1e-3, "softcap": 2.0, "weighted": True},
], ids=["plain", "smooth+weights", "zloss+cap", "all"])
def test_backward_is_the_gradient_of_the_reference(reduction: str, options: dict) -> None:
    opts = dict(options)
    w = _weight() if opts.pop("weighted", False) else None
    x = randn(6, V, dtype=torch.float64, scale=3.0).requires_grad_()
    t = _targets(6, ignored=(2,))
    loss = R.cross_entropy(x, t, w, O(IGNORE, reduction, **opts))
    dloss = torch.randn(loss.shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(loss, x, dloss)
    got = R.cross_entropy_backward(dloss, x.detach(), t, w, O(IGNORE, reduction, **opts))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert torch.equal(got[2], torch.zeros(V, dtype=torch.float64))


def test_bf16_is_transformers_causal_lm_loss() -> None:
    """Loss in fp32 on upcast logits and gradient rounded once: exactly HF's ForCausalLMLoss path."""
    loss_utils = pytest.importorskip("transformers.loss.loss_utils")
    logits = randn(2, 5, V, dtype=torch.bfloat16, scale=2.0).requires_grad_()
    labels = torch.randint(0, V, (2, 5))
    labels[0, 2] = IGNORE
    hf = loss_utils.ForCausalLMLoss(logits, labels, V)
    (hf_grad,) = torch.autograd.grad(hf, logits)
    shifted = F.pad(labels, (0, 1), value=IGNORE)[:, 1:]
    ours = R.cross_entropy(logits.detach(), shifted)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, hf, rtol=1e-6, atol=1e-6)
    assert_close(R.cross_entropy_backward(torch.ones(()), logits.detach(), shifted), hf_grad, "grad")
    n_items = (shifted != IGNORE).sum()
    hf_sum = loss_utils.ForCausalLMLoss(logits.detach(), labels, V, num_items_in_batch=n_items)
    torch.testing.assert_close(R.cross_entropy(logits.detach(), shifted, None, O(reduction="sum")) / n_items, hf_sum)


def test_all_ignored_mean_is_nan_with_zero_gradient_like_torch() -> None:
    x = randn(4, V, dtype=torch.float64)
    t = torch.full((4,), IGNORE)
    for smoothing in (0.0, 0.1):
        assert torch.isnan(R.cross_entropy(x, t, None, O(label_smoothing=smoothing)))
        assert torch.isnan(F.cross_entropy(x, t, label_smoothing=smoothing))
        grad = R.cross_entropy_backward(torch.ones((), dtype=torch.float64), x, t, None,
                                         O(label_smoothing=smoothing))
        assert torch.equal(grad, torch.zeros_like(x))
    assert R.cross_entropy(x, t, None, O(reduction="sum")) == 0


def test_zero_weight_mean_is_nan_like_torch() -> None:
    x = randn(3, V, dtype=torch.float64).requires_grad_()
    t = torch.tensor([1, 2, IGNORE])
    w = torch.zeros(V, dtype=torch.float64)
    ours = R.cross_entropy(x, t, w)
    theirs = F.cross_entropy(x, t, w)
    (torch_grad,) = torch.autograd.grad(theirs, x)
    grad = R.cross_entropy_backward(torch.ones((), dtype=torch.float64), x.detach(), t, w)
    assert torch.isnan(ours) and torch.isnan(theirs)
    assert torch.equal(torch.isnan(grad), torch.isnan(torch_grad))


def test_denominators() -> None:
    t = torch.tensor([0, IGNORE, 3, 3])
    w = torch.arange(V, dtype=torch.float32)
    assert [float(v) for v in cross_entropy_denominators(t, w, IGNORE)] == [6.0, 3.0]
    assert [float(v) for v in cross_entropy_denominators(t, None, IGNORE)] == [3.0, 3.0]


def test_fused_linear_reference_matches_autograd() -> None:
    x = randn(2, 3, 8, dtype=torch.float64).requires_grad_()
    w = randn(V, 8, dtype=torch.float64, scale=0.5).requires_grad_()
    b = randn(V, dtype=torch.float64).requires_grad_()
    t = _targets(6).view(2, 3)
    o = O(label_smoothing=0.1, lse_square_scale=1e-3, softcap=4.0, reduction="sum")
    loss = R.fused_linear_cross_entropy(x, w, t, b, options=o)
    torch.testing.assert_close(loss, R.cross_entropy(F.linear(x, w, b), t, None, o))
    expected = torch.autograd.grad(loss, (x, w, b), torch.tensor(0.5, dtype=torch.float64))
    got = R.fused_linear_cross_entropy_backward(torch.tensor(0.5, dtype=torch.float64), x.detach(), w.detach(),
                                                t, b.detach(), options=o)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


# --- argument checks -------------------------------------------------------------------------------


def test_checks_accept_good_arguments() -> None:
    x = randn(2, 3, V)
    C.check_cross_entropy_args(x, torch.zeros(2, 3, dtype=torch.long), _weight(dtype=torch.float32),
                               O(IGNORE, "none", 0.1, 1e-4, 30.0))
    C.check_linear_args(randn(4, 8), randn(V, 8), randn(V))
    C.check_target_range(torch.tensor([0, V - 1, IGNORE]), V, IGNORE)
    C.check_finite_loss(torch.ones(3))


BAD_ARGUMENTS = [
    (lambda x: C.check_logits(x.long()), TypeError, "logits must be a floating-point"),
    (lambda x: C.check_logits(x[:, :0]), ValueError, "non-empty last"),
    (lambda x: C.check_target(torch.zeros(4, dtype=torch.int32), x.shape[:-1], x.device), TypeError, "int64"),
    (lambda x: C.check_target(torch.zeros(4, V), x.shape[:-1], x.device), TypeError, "class probabilities"),
    (lambda x: C.check_target(torch.zeros(3, dtype=torch.long), x.shape[:-1], x.device), ValueError, "shape (4,)"),
    (lambda x: C.check_class_weight(torch.ones(V + 1), V, x.device), ValueError, "weight must have shape"),
    (lambda x: C.check_class_weight(torch.ones(V, dtype=torch.long), V, x.device), TypeError, "floating-point"),
    (lambda x: C.check_options(O(IGNORE, "avg")), ValueError, "reduction"),
    (lambda x: C.check_options(O(IGNORE, label_smoothing=1.5)), ValueError, "label_smoothing"),
    (lambda x: C.check_options(O(IGNORE, lse_square_scale=-1.0)), ValueError, "lse_square_scale"),
    (lambda x: C.check_options(O(IGNORE, softcap=0.0)), ValueError, "softcap"),
    (lambda x: C.check_options(O(-100.0)), TypeError, "ignore_index"),
    (lambda x: C.check_options(O(return_z_loss="yes")), TypeError, "return_z_loss"),
    (lambda x: C.check_linear_args(x, randn(V, 5), None), ValueError, "weight must have shape"),
    (lambda x: C.check_linear_args(x, randn(5, V, dtype=torch.float64), None), TypeError, "weight must have x's"),
    (lambda x: C.check_linear_args(x, randn(5, V), randn(4)), ValueError, "bias must have shape"),
    (lambda x: C.check_target_range(torch.tensor([[0, 1], [V, IGNORE]]), V, IGNORE), ValueError,
     f"target {V} at index (1, 0)"),
    (lambda x: C.check_target_range(torch.tensor([-3]), V, IGNORE), ValueError, "not ignore_index"),
]


@pytest.mark.parametrize("call,error,words", BAD_ARGUMENTS, ids=[case[2] for case in BAD_ARGUMENTS])
def test_checks_name_the_argument(call, error: type, words: str) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(randn(4, V))


def test_check_finite_loss_says_why() -> None:
    logits = randn(4, V)
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")
    with pytest.raises(FloatingPointError, match="row 1 is nan: its logits hold NaN"):
        C.check_finite_loss(torch.tensor([1.0, float("nan"), float("nan"), 2.0]), logits)
    logits[1, 3] = float("inf")
    with pytest.raises(FloatingPointError, match="hold \\+inf"):
        C.check_finite_loss(torch.tensor([1.0, float("nan"), 1.0, 2.0]), logits)
    with pytest.raises(FloatingPointError, match="all -inf"):
        C.check_finite_loss(torch.tensor([1.0, 1.0, float("nan"), 2.0]), logits)
    with pytest.raises(FloatingPointError, match="the loss is nan"):
        C.check_finite_loss(torch.tensor(float("nan")))
