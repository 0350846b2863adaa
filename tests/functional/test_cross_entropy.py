"""kernel_pytorch.functional's cross-entropy family: argument errors name the argument, every backend computes
torch's / the reference's loss and gradients, all-ignored batches as torch defines them, non-finite
logits reported, tied weights, and the in-place-gradient autograd.Function (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional.cross_entropy import _CrossEntropyInplace
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close

IGNORE = -100


def _inputs(n: int = 6, v: int = 11):
    logits = randn(n, v).requires_grad_()
    target = torch.randint(0, v, (n,))
    target[2] = IGNORE
    return logits, target


def test_cross_entropy_errors_name_the_argument() -> None:
    logits, target = _inputs()
    with pytest.raises(ValueError, match=r"target 11 at index \(5,\) is out of range for 11 classes"):
        F.cross_entropy(logits, torch.tensor([0, 1, 2, 3, 4, 11]))
    with pytest.raises(TypeError, match="target must be int64"):
        F.cross_entropy(logits, target.int())
    with pytest.raises(TypeError, match="class probabilities"):
        F.cross_entropy(logits, torch.rand(6, 11))
    with pytest.raises(ValueError, match=r"target must have shape \(6,\)"):
        F.cross_entropy(logits, target[:5])
    with pytest.raises(ValueError, match=r"weight must have shape \(11,\)"):
        F.cross_entropy(logits, target, torch.ones(3))
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.cross_entropy(logits, target, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be between"):
        F.cross_entropy(logits, target, label_smoothing=1.5)
    bad = logits.detach().clone()
    bad[4, 3] = float("nan")
    with pytest.raises(FloatingPointError, match="row 4 is nan: its logits hold NaN"):
        F.cross_entropy(bad, target, check_finite=True)


def test_fused_linear_cross_entropy_errors_name_the_argument() -> None:
    x, w, target = randn(6, 8), randn(11, 8), torch.randint(0, 11, (6,))
    with pytest.raises(ValueError, match=r"weight must have shape \(V, 8\)"):
        F.fused_linear_cross_entropy(x, randn(11, 7), target)
    with pytest.raises(TypeError, match="weight must have x's dtype"):
        F.fused_linear_cross_entropy(x, w.double(), target)
    with pytest.raises(ValueError, match="out of range for 11 classes"):
        F.fused_linear_cross_entropy(x, w, target + 11)
    with pytest.raises(ValueError, match=r"ce_weight must have shape \(11,\)"):
        F.fused_linear_cross_entropy(x, w, target, ce_weight=torch.ones(4))


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_is_torchs(backend: str, reduction: str) -> None:
    logits, target = _inputs()
    weight = torch.rand(11) + 0.5
    ours = F.cross_entropy(logits, target, weight, reduction=reduction, label_smoothing=0.1, backend=backend)
    want = TF.cross_entropy(logits, target, weight, reduction=reduction, label_smoothing=0.1)
    dloss = torch.rand(want.shape) + 0.25
    assert_close(ours, want, "loss")
    assert_close(torch.autograd.grad(ours, logits, dloss)[0], torch.autograd.grad(want, logits, dloss)[0], "grad")


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_all_ignored_is_torchs(backend: str) -> None:
    logits = randn(4, 7).requires_grad_()
    target = torch.full((4,), IGNORE)
    for reduction in ("mean", "sum", "none"):
        ours = F.cross_entropy(logits, target, reduction=reduction, backend=backend)
        want = TF.cross_entropy(logits, target, reduction=reduction)
        torch.testing.assert_close(ours, want, equal_nan=True)
        grad = torch.autograd.grad(ours.sum(), logits)[0]
        assert torch.equal(grad, torch.zeros_like(grad))


def test_compiled_cross_entropy_no_breaks() -> None:
    logits, target = _inputs()
    f = torch.compile(lambda z: F.cross_entropy(z, target, lse_square_scale=1e-3, softcap=4.0), fullgraph=True,
                      backend="aot_eager")
    want = R.cross_entropy(logits, target, None, O(IGNORE, "mean", 0.0, 1e-3, 4.0))
    ours = f(logits)
    assert_close(ours, want, "loss")
    assert_close(torch.autograd.grad(ours, logits)[0], torch.autograd.grad(want, logits)[0], "grad")


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_linear_cross_entropy_tied_weight(backend: str, reduction: str) -> None:
    """The lm_head weight is also the input embedding: both gradients add up in the one parameter."""
    emb = randn(11, 8).requires_grad_()
    ids, target = torch.randint(0, 11, (6,)), torch.randint(0, 11, (6,))
    target[0] = IGNORE

    def run(fn):
        h = torch.tanh(TF.embedding(ids, emb))
        return fn(h, emb, target, reduction=reduction, label_smoothing=0.1)

    ours = run(lambda *a, **k: F.fused_linear_cross_entropy(*a, **k, backend=backend))
    want = run(lambda h, w, t, **k: TF.cross_entropy(h @ w.t(), t, **k))
    dloss = torch.rand(want.shape) + 0.25
    assert_close(ours, want, "loss")
    assert_close(torch.autograd.grad(ours, emb, dloss)[0], torch.autograd.grad(want, emb, dloss)[0], "grad")


def test_inplace_backward_function() -> None:
    """The eager in-place path (launched directly: CUDA's path, run by the interpreter here): the
    gradient lands in the logits' memory, reaches the layers below, and a second backward refuses."""
    dev = device_under_test()  # the launchers' device: CUDA, or the interpreter's CPU
    h, w = randn(5, 8, device=dev).requires_grad_(), randn(13, 8, device=dev).requires_grad_()
    target = torch.randint(0, 13, (5,), device=dev)
    logits = h @ w.t()
    loss = _CrossEntropyInplace.apply(logits, target, None, O(IGNORE, "mean", 0.1))[0]
    ref_logits = h @ w.t()
    want = R.cross_entropy(ref_logits, target, None, O(IGNORE, "mean", 0.1))
    assert_close(loss, want, "loss")
    dloss = torch.tensor(1.5, device=dev)
    got = torch.autograd.grad(loss, (h, w), dloss, retain_graph=True)
    for a, b in zip(got, torch.autograd.grad(want, (h, w), dloss)):
        assert_close(a, b, "grad")
    with pytest.raises(RuntimeError, match="backward once only"):
        torch.autograd.grad(loss, (h, w), dloss)


@pytest.mark.cuda
@pytest.mark.parametrize("fused", [False, True])
def test_losses_capture_in_a_cuda_graph(fused: bool) -> None:
    """The target range check reads the targets on the host: skipped under capture, so the loss and its
    backward replay from a CUDA graph and match the eager call."""
    dev = torch.device("cuda")
    x = randn(64, 32, device=dev, dtype=torch.bfloat16).requires_grad_()
    w = randn(100, 32, device=dev, dtype=torch.bfloat16)
    target = torch.randint(0, 100, (64,), device=dev)

    def step() -> torch.Tensor:
        loss = F.fused_linear_cross_entropy(x, w, target) if fused else F.cross_entropy(x @ w.t(), target)
        (dx,) = torch.autograd.grad(loss, (x,))
        return dx

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        expected = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


# --- what a training loop logs beside the loss, and per-token scales ------------------------------------


def _by_hand(logits, target, u, reduction, scale, cap):
    """LossOutput's fields from torch ops: per-row losses times u, the z-loss term, argmax and accuracy."""
    z = cap * torch.tanh(logits.float() / cap)
    valid = target != IGNORE
    lse = torch.logsumexp(z, -1)
    zl = torch.where(valid, scale * lse ** 2, 0.0) * u
    rows = TF.cross_entropy(z, target, ignore_index=IGNORE, reduction="none") * u + zl
    pred = torch.where(valid, logits.argmax(-1), -1)
    hit = ((pred == target) & valid).float()
    if reduction == "none":
        return rows, zl, hit, pred
    div = valid.sum() if reduction == "mean" else 1
    return rows.sum() / div, zl.sum() / div, hit.sum() / valid.sum(), pred


def test_extras_errors_name_the_argument() -> None:
    logits, target = _inputs()
    with pytest.raises(ValueError, match=r"token_scale must have the target's shape \(6,\)"):
        F.cross_entropy(logits, target, token_scale=torch.ones(5))
    with pytest.raises(TypeError, match="token_scale must be a floating-point tensor"):
        F.cross_entropy(logits, target, token_scale=torch.ones(6, dtype=torch.long))
    with pytest.raises(TypeError, match="return_z_loss must be True or False"):
        F.cross_entropy(logits, target, return_z_loss=1)
    x, w = randn(6, 8), randn(11, 8)
    with pytest.raises(TypeError, match="return_predicted_tokens must be True or False"):
        F.fused_linear_cross_entropy(x, w, target, return_predicted_tokens="yes")
    with pytest.raises(ValueError, match="token_scale must have the target's shape"):
        F.fused_linear_cross_entropy(x, w, target, token_scale=torch.ones(6, 1))


def test_unknown_keyword_names_the_function_and_the_options() -> None:
    logits, target = _inputs()
    with pytest.raises(TypeError, match=r"cross_entropy\(\) got an unexpected keyword argument 'soft_cap' "
                                        r"\(its options: ignore_index, reduction"):
        F.cross_entropy(logits, target, soft_cap=30.0)
    with pytest.raises(TypeError, match=r"fused_linear_cross_entropy\(\) got an unexpected keyword argument "
                                        "'weight_decay'"):
        F.fused_linear_cross_entropy(randn(6, 8), randn(11, 8), target, weight_decay=0.1)


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_output_is_what_a_loop_logs(backend: str, reduction: str) -> None:
    logits, target = _inputs()
    u = torch.rand(6) + 0.5
    out = F.cross_entropy(logits, target, reduction=reduction, lse_square_scale=1e-2, softcap=5.0, token_scale=u,
                          return_z_loss=True, return_token_accuracy=True, return_predicted_tokens=True,
                          backend=backend)
    assert isinstance(out, F.LossOutput)
    want = _by_hand(logits, target, u, reduction, 1e-2, 5.0)
    for name, got, ref in zip(("loss", "z_loss", "token_accuracy"), out, want):
        assert_close(got, ref, name)
    assert torch.equal(out.predicted_tokens, want[3])
    assert not out.z_loss.requires_grad  # for logging: the loss already holds it
    dloss = torch.rand(want[0].shape) + 0.25
    assert_close(torch.autograd.grad(out.loss, logits, dloss)[0], torch.autograd.grad(want[0], logits, dloss)[0],
                 "grad")
    plain = F.cross_entropy(logits, target, reduction=reduction, backend=backend)
    assert isinstance(plain, torch.Tensor)
    only = F.cross_entropy(logits, target, reduction=reduction, return_token_accuracy=True, backend=backend)
    assert only.z_loss is None and only.predicted_tokens is None and only.token_accuracy is not None


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_fused_loss_output_matches_the_unfused(backend: str) -> None:
    x, w = randn(6, 8).requires_grad_(), randn(11, 8).requires_grad_()
    target = torch.randint(0, 11, (6,))
    target[[0, 4]] = IGNORE
    u = torch.rand(6) + 0.5
    kw = dict(lse_square_scale=1e-3, token_scale=u, return_z_loss=True, return_token_accuracy=True,
              return_predicted_tokens=True)
    ours = F.fused_linear_cross_entropy(x, w, target, **kw, backend=backend)
    want = F.cross_entropy(x @ w.t(), target, **kw, backend="reference")
    for name in ("loss", "z_loss", "token_accuracy"):
        assert_close(getattr(ours, name), getattr(want, name), name)
    assert torch.equal(ours.predicted_tokens, want.predicted_tokens)
    for a, b in zip(torch.autograd.grad(ours.loss, (x, w)), torch.autograd.grad(want.loss, (x, w))):
        assert_close(a, b, "grad")


def test_all_ignored_accuracy_is_nan() -> None:
    logits = randn(4, 7)
    out = F.cross_entropy(logits, torch.full((4,), IGNORE), return_token_accuracy=True, return_predicted_tokens=True)
    assert torch.isnan(out.token_accuracy) and (out.predicted_tokens == -1).all()


def test_compiled_loss_output_no_breaks() -> None:
    logits, target = _inputs()
    u = torch.rand(6) + 0.5

    def f(z):
        return F.cross_entropy(z, target, lse_square_scale=1e-3, token_scale=u, return_z_loss=True,
                               return_token_accuracy=True, return_predicted_tokens=True)

    want = f(logits)
    ours = torch.compile(f, fullgraph=True, backend="aot_eager")(logits)
    assert isinstance(ours, F.LossOutput)
    for name in ("loss", "z_loss", "token_accuracy"):
        assert_close(getattr(ours, name), getattr(want, name), name)
    assert torch.equal(ours.predicted_tokens, want.predicted_tokens)
    assert_close(torch.autograd.grad(ours.loss, logits)[0], torch.autograd.grad(want.loss, logits)[0], "grad")
