"""kernel_pytorch.functional.apply_rotary and embedding: errors name the argument, every backend computes
the reference (outputs and gradients), in place keeps autograd right, fused-QKV views, compile."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import rope as rope_mod
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.norm_helpers import assert_close
from tests.ops.rope_helpers import RopeCase, make_heads, make_rows, rotation_rows, rotation_table


def test_apply_rotary_errors_name_the_argument() -> None:
    q, k = randn(1, 4, 3, 8), randn(1, 2, 3, 8)
    cos, sin = rotation_table(5, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="head dims differ"):
        F.apply_rotary(q, randn(1, 2, 3, 6), cos, sin, position_ids=torch.arange(3))
    with pytest.raises(ValueError, match="must be even"):
        F.apply_rotary(q, k, cos[:, :3], sin[:, :3], position_ids=torch.arange(3))
    with pytest.raises(ValueError, match="cover 4 tokens but q and k have 3"):
        F.apply_rotary(q, k, cos[None, :4], sin[None, :4])
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 5\)"):
        F.apply_rotary(q, k, cos, sin, position_ids=torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match="backend must be one of"):
        F.apply_rotary(q, k, cos, sin, position_ids=torch.arange(3), backend="cuda")


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_backends_compute_the_reference(backend: str, interleaved: bool) -> None:
    """GQA, partial rotary (r < D), a table read at position ids with gaps."""
    case = RopeCase(2, 3, 4, 2, 12, 8, "bhtd")
    q, k = make_heads(case, 4, torch.bfloat16, "cpu"), make_heads(case, 2, torch.bfloat16, "cpu")
    q.requires_grad_(), k.requires_grad_()
    cos, sin = rotation_table(40, 8, torch.float32, "cpu", interleaved)
    pos = torch.tensor([[0, 7, 39], [2, 3, 30]])
    out = F.apply_rotary(q, k, cos, sin, position_ids=pos, interleaved=interleaved, backend=backend)
    want = R.rope(q, k, cos, sin, pos, interleaved=interleaved)
    ups = [randn(*o.shape, dtype=o.dtype) for o in out]
    for name, a, b in zip(("q", "k", "dq", "dk"), (*out, *torch.autograd.grad(out, (q, k), ups)),
                          (*want, *torch.autograd.grad(want, (q, k), ups))):
        assert_close(a, b, name)
    assert torch.equal(out[0][..., 8:], q[..., 8:])  # the features past r pass through


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_inplace_views_of_a_fused_qkv(backend: str) -> None:
    """q and k as (B, T, H, D) views of one fused projection, rotated in place: the other heads are
    untouched, the results equal the out-of-place call, and gradients reach the projection."""
    b, t, hq, hk, d = 2, 3, 4, 2, 8
    w = randn(d * (hq + 2 * hk), 16).requires_grad_()
    x = randn(b, t, 16)
    qkv = (x @ w.T).view(b, t, hq + 2 * hk, d)
    q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    cos, sin = rotation_rows(torch.arange(t)[None], d, torch.float32)
    want = R.rope(q.detach(), k.detach(), cos, sin, unsqueeze_dim=2)
    v_before = v.detach().clone()
    qo, ko = F.apply_rotary(q, k, cos, sin, unsqueeze_dim=2, inplace=True, backend=backend)
    assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
    assert_close(qo, want[0], "q"), assert_close(ko, want[1], "k")
    assert torch.equal(v.detach(), v_before)
    (got,) = torch.autograd.grad((qo.sum() + 2 * ko.sum()), (w,))
    w2 = w.detach().requires_grad_()
    qkv2 = (x @ w2.T).view(b, t, hq + 2 * hk, d)
    q2, k2 = R.rope(qkv2[:, :, :hq], qkv2[:, :, hq:hq + hk], cos, sin, unsqueeze_dim=2)
    (expected,) = torch.autograd.grad(q2.sum() + 2 * k2.sum(), (w2,))
    assert_close(got, expected, "dw")


def test_inplace_function_of_the_eager_path() -> None:
    """_RopeInplace (the eager CUDA path; here its launchers run under the interpreter): in place on
    non-leaf q and k, gradients as the reference's."""
    case = RopeCase(1, 4, 2, 1, 8, 8, "bhtd")
    dev = device_under_test()  # the launchers' device: CUDA, or the interpreter's CPU
    q0 = make_heads(case, 2, torch.float32, dev).requires_grad_()
    k0 = make_heads(case, 1, torch.float32, dev).requires_grad_()
    cos, sin = make_rows(case, torch.float32, dev)
    q, k = q0 * 1.0, k0 * 1.0
    qo, ko = rope_mod._RopeInplace.apply(q, k, cos, sin, None, False, 1, False)
    assert qo.data_ptr() == q.data_ptr()
    want = R.rope(q0, k0, cos, sin)
    assert_close(qo, want[0], "q"), assert_close(ko, want[1], "k")
    ups = (randn(*qo.shape, device=dev), randn(*ko.shape, device=dev))
    for a, b in zip(torch.autograd.grad((qo, ko), (q0, k0), ups), torch.autograd.grad(want, (q0, k0), ups)):
        assert_close(a, b, "grad")


def test_inplace_eager_path_on_fused_qkv_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager CUDA path (forced here; its launchers run under the interpreter) on views of one fused
    projection: without gradients the in-place Function, with them the out-of-place kernel and a copy
    (autograd lets no Function dirty two views); both right, gradients included."""
    monkeypatch.setattr(rope_mod, "_resolve", lambda *args: "eager")
    b, t, hq, hk, d = 1, 3, 2, 1, 8
    dev = device_under_test()  # the launchers' device: CUDA, or the interpreter's CPU
    cos, sin = (r.to(dev) for r in rotation_rows(torch.arange(t)[None], d, torch.float32))
    for grad in (False, True):
        w = randn(d * (hq + 2 * hk), 16, device=dev).requires_grad_(grad)
        x = randn(b, t, 16, device=dev)
        qkv = (x @ w.T).view(b, t, hq + 2 * hk, d)
        q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
        want = R.rope(q.detach(), k.detach(), cos, sin, unsqueeze_dim=2)
        qo, ko = F.apply_rotary(q, k, cos, sin, unsqueeze_dim=2, inplace=True)
        assert qo.data_ptr() == q.data_ptr()
        assert_close(qkv[:, :, :hq], want[0], "q"), assert_close(qkv[:, :, hq:hq + hk], want[1], "k")
        if grad:
            (got,) = torch.autograd.grad(qo.sum() + 2 * ko.sum(), (w,))
            w2 = w.detach().requires_grad_()
            qkv2 = (x @ w2.T).view(b, t, hq + 2 * hk, d)
            q2, k2 = R.rope(qkv2[:, :, :hq], qkv2[:, :, hq:hq + hk], cos, sin, unsqueeze_dim=2)
            assert_close(got, torch.autograd.grad(q2.sum() + 2 * k2.sum(), (w2,))[0], "dw")


def test_compile_fullgraph_no_breaks() -> None:
    case = RopeCase(1, 4, 2, 1, 8, 8, "bthd")
    q, k = make_heads(case, 2, torch.float32, "cpu").requires_grad_(), make_heads(case, 1, torch.float32, "cpu")
    cos, sin = rotation_table(6, 8, torch.float32, "cpu")
    pos = torch.tensor([2, 3, 4, 5])

    def f(q, k, cos, sin, pos):
        qo, ko = F.apply_rotary(q, k, cos, sin, position_ids=pos, unsqueeze_dim=2)
        return qo.sum(2, keepdim=True) + ko

    out, breaks = compile_and_count_breaks(f, q, k, cos, sin, pos)
    assert breaks == 0
    assert_close(out, f(q, k, cos, sin, pos), "compiled")


def test_embedding_errors_and_backends() -> None:
    w = randn(7, 12, dtype=torch.bfloat16).requires_grad_()
    idx = torch.tensor([[2, 2, 5], [0, 2, 6]])
    with pytest.raises(TypeError, match="indices must be an integer"):
        F.embedding(idx.float(), w)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 7\)"):
        F.embedding(idx + 3, w)
    with pytest.raises(ValueError, match="padding_idx must be within"):
        F.embedding(idx, w, 9)
    dy = randn(2, 3, 12, dtype=torch.bfloat16)
    want = torch.nn.functional.embedding(idx, w, -1, scale_grad_by_freq=True)
    (expected,) = torch.autograd.grad(want, (w,), dy)
    for kw in ({"backend": "auto"}, {"backend": "reference"}, {"deterministic": False}):
        y = F.embedding(idx, w, -1, scale_grad_by_freq=True, **kw)
        assert torch.equal(y, want)
        assert_close(torch.autograd.grad(y, (w,), dy)[0], expected, "dweight")
