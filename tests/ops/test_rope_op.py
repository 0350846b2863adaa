"""The registered ops of the rotary-embedding family (`kernel_pytorch::rope_*`, `kernel_pytorch::embedding_*`):
opcheck, autograd through the op and through the eager Function (its launchers run under the interpreter
on CPU), torch.compile(fullgraph=True) without breaks, and torch.export."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import embedding_eager, rope_eager
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.norm_helpers import assert_close
from tests.ops.rope_helpers import RopeCase, make_heads, make_rows, rotation_table

DEV = device_under_test()
OPS = torch.ops.kernel_pytorch


def _qk(case: RopeCase, dtype: torch.dtype = torch.float32, grad: bool = True):
    q, k = make_heads(case, case.hq, dtype, DEV), make_heads(case, case.hk, dtype, DEV)
    return (q.requires_grad_(), k.requires_grad_()) if grad else (q, k)


# two of the grid's cases (opcheck traces each op several ways: the costliest test of the family);
# every dtype runs through the kernels in test_rope_kernels.py
@pytest.mark.parametrize("dtype,table", [(torch.float32, False), (torch.bfloat16, True)],
                         ids=["fp32-rows", "bf16-table"])
def test_rope_opcheck(dtype: torch.dtype, table: bool) -> None:
    case = RopeCase(2, 3, 2, 1, 12, 8, "bthd_as_bhtd")
    q, k = _qk(case, dtype)
    if table:
        cos, sin = rotation_table(16, case.r, dtype, DEV)
        pos = torch.tensor([[0, 5, 15], [3, 3, 1]], device=DEV)
    else:
        (cos, sin), pos = make_rows(case, dtype, DEV), None
    torch.library.opcheck(OPS.rope_fwd.default, (q, k, cos, sin, pos, False, 1, False))
    torch.library.opcheck(OPS.rope_fwd.default, (q, k, cos, sin, pos, True, 1, True))
    dq, dk = randn(*q.shape, dtype=dtype, device=DEV), randn(*k.shape, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.rope_bwd.default, (dq, dk, cos, sin, pos, False, 1, False))


@pytest.mark.parametrize("entry", ["op", "eager"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_rope_autograd_matches_the_reference(entry: str, interleaved: bool) -> None:
    """Outputs and q/k gradients through the registered op and through the eager Function (the Triton
    launchers), against autograd through the reference; cos/sin get no gradient."""
    case = RopeCase(2, 3, 3, 1, 16, 12, "bthd")
    q, k = _qk(case, torch.bfloat16)
    cos, sin = make_rows(case, torch.float32, DEV)
    args = (cos, sin, None, interleaved, 2, False)
    outs = OPS.rope_fwd(q, k, *args) if entry == "op" else rope_eager(q, k, *args)
    expected = R.rope(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=2)
    ups = [randn(*o.shape, dtype=o.dtype, device=DEV) for o in outs]
    got = torch.autograd.grad(outs, (q, k), ups)
    want = torch.autograd.grad(expected, (q, k), ups)
    for name, a, b in zip(("q", "k", "dq", "dk"), (*outs, *got), (*expected, *want)):
        assert_close(a, b, name)


def test_rope_compile_fullgraph_no_breaks_same_grads() -> None:
    case = RopeCase(1, 4, 2, 2, 8, 8, "bhtd")
    q, k = _qk(case)
    cos, sin = make_rows(case, torch.float32, DEV)

    def f(q, k, cos, sin):
        qo, ko = OPS.rope_fwd(q, k, cos, sin, None, False, 1, False)
        return qo * 2.0 + ko.sum(1, keepdim=True)

    dy = randn(1, 2, 4, 8, device=DEV)
    eager = torch.autograd.grad(f(q, k, cos, sin), (q, k), dy)
    out, breaks = compile_and_count_breaks(f, q, k, cos, sin)
    assert breaks == 0
    for a, b in zip(torch.autograd.grad(out, (q, k), dy), eager):
        assert_close(a, b, "compiled grad")


def test_rope_export() -> None:
    class M(torch.nn.Module):
        def forward(self, q, k, cos, sin, pos):
            return OPS.rope_fwd(q, k, cos, sin, pos, True, 2, False)

    case = RopeCase(2, 3, 2, 1, 8, 8, "bthd")
    q, k = _qk(case, grad=False)
    cos, sin = rotation_table(10, case.r, torch.float32, DEV, interleaved=True)
    pos = torch.tensor([[1, 2, 3], [7, 8, 9]], device=DEV)
    ep = torch.export.export(M(), (q, k, cos, sin, pos))
    assert "kernel_pytorch.rope_fwd" in str(ep.graph)
    for a, b in zip(ep.module()(q, k, cos, sin, pos), R.rope(q, k, cos, sin, pos, interleaved=True, unsqueeze_dim=2)):
        assert_close(a, b, "exported")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_embedding_opcheck(dtype: torch.dtype) -> None:
    w = randn(10, 6, dtype=dtype, device=DEV).requires_grad_()
    idx = torch.tensor([[1, 3, 3], [9, 0, 3]], device=DEV)
    torch.library.opcheck(OPS.embedding_fwd.default, (idx, w, -1, False))
    torch.library.opcheck(OPS.embedding_fwd.default, (idx, w, 3, True))
    dy = randn(2, 3, 6, dtype=dtype, device=DEV)
    torch.library.opcheck(OPS.embedding_bwd.default, (dy, idx, w.detach(), 0, False))


@pytest.mark.parametrize("entry", ["op", "eager"])
@pytest.mark.parametrize("padding_idx,scale", [(-1, False), (2, True)])
def test_embedding_autograd_matches_torch(entry: str, padding_idx: int, scale: bool) -> None:
    w = randn(7, 12, dtype=torch.bfloat16, device=DEV).requires_grad_()
    idx = torch.tensor([[2, 2, 5], [0, 2, 6]], device=DEV)
    fn = OPS.embedding_fwd if entry == "op" else embedding_eager
    y = fn(idx, w, padding_idx, scale)
    expected = torch.nn.functional.embedding(idx, w, None if padding_idx < 0 else padding_idx,
                                             scale_grad_by_freq=scale)
    dy = randn(2, 3, 12, dtype=torch.bfloat16, device=DEV)
    assert torch.equal(y, expected)
    (got,), (want,) = torch.autograd.grad(y, (w,), dy), torch.autograd.grad(expected, (w,), dy)
    assert_close(got, want, "dweight")


def test_embedding_compile_and_export() -> None:
    w = randn(9, 4, device=DEV).requires_grad_()
    idx = torch.tensor([1, 8, 1, 0], device=DEV)

    def f(idx, w):
        return OPS.embedding_fwd(idx, w, -1, False) * 3.0

    out, breaks = compile_and_count_breaks(f, idx, w)
    assert breaks == 0
    dy = randn(4, 4, device=DEV)
    assert_close(torch.autograd.grad(out, (w,), dy)[0], torch.autograd.grad(f(idx, w), (w,), dy)[0], "grad")

    class M(torch.nn.Module):
        def forward(self, idx, w):
            return OPS.embedding_fwd(idx, w, -1, False)

    ep = torch.export.export(M(), (idx, w.detach()))
    assert "kernel_pytorch.embedding_fwd" in str(ep.graph)
    assert torch.equal(ep.module()(idx, w.detach()), w.detach()[idx])
