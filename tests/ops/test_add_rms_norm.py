"""Fused residual add + RMSNorm: kernels vs the reference, both outputs and both gradients, in every
casting; the calls from before the casting argument."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops.add_rms_norm import add_rms_norm_bwd, add_rms_norm_eager, add_rms_norm_fwd
from kernel_pytorch.reference.rms_norm import CASTINGS, rms_norm_from_rstd, rms_norm_rstd
from tests.grid import DTYPES, ROW_SHAPES, Poisoned, compile_and_count_breaks, device_under_test, randn, strided_rows
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
EPS = 1e-6


def _assert_outputs(x, r, w, dy, dh, y, h, d_sum, offset: float = 0.0, casting: str = "llama"):
    """y, h and the gradient of x + residual against the reference; returns (h_ref, dweight_ref)."""
    y_ref, h_ref = R.add_rms_norm(x, r, w, EPS, offset, casting)
    assert_close(h, h_ref, "h")
    assert_close(y, y_ref, "y")
    d_ref, dw_ref = R.add_rms_norm_backward(dy, dh, h_ref, w, rms_norm_rstd(h_ref, EPS), offset, casting)
    assert_close(d_sum, d_ref, "d(x + residual)")
    return h_ref, dw_ref


# (dtype, casting, offset): Llama's rounding in every dtype, torch's and Gemma's in bf16 (as in
# test_rms_norm.py: where they differ; fp16 in test_forward_bitwise_given_rstd)
DTYPE_CASTINGS = tuple((d, "llama", 0.0) for d in DTYPES) + (
    (torch.bfloat16, "torch", 0.0), (torch.bfloat16, "gemma", 1.0),
)


@pytest.mark.parametrize("dtype,casting,offset", DTYPE_CASTINGS, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_kernels_match_reference(lead, cols, dtype, casting, offset, row_path) -> None:
    x = strided_rows(lead, cols, dtype, DEV)
    r = randn(*lead, cols, dtype=dtype, device=DEV)
    w = randn(cols, dtype=dtype, device=DEV, scale=0.5, offset=1.0)
    dy = randn(*lead, cols, dtype=dtype, device=DEV)
    dh = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        y, h, rstd = add_rms_norm_fwd(x, r, w, EPS, offset, casting)
        d_sum, dw = add_rms_norm_bwd(dy, dh, h, w, rstd, offset, casting)
    h_ref, dw_ref = _assert_outputs(x, r, w, dy, dh, y, h, d_sum, offset, casting)
    h64 = h_ref.double()
    _, dw64 = R.add_rms_norm_backward(dy.double(), dh.double(), h64, w.double(), rms_norm_rstd(h64, EPS), offset)
    assert_budget(dw, dw_ref, dw64, "dweight")


def _assert_forward_bitwise(dtype: torch.dtype, cols: int, casting: str, device: str) -> None:
    """h is x + residual rounded once, and y, given the kernel's rstd, the reference's, bit for bit."""
    x, r = randn(9, cols, dtype=dtype, device=device), randn(9, cols, dtype=dtype, device=device)
    w = randn(cols, dtype=dtype, device=device, scale=0.5, offset=1.0)
    y, h, rstd = add_rms_norm_fwd(x, r, w, EPS, 0.0, casting)
    assert torch.equal(h, R.add_rms_norm(x, r, w, EPS, 0.0, casting)[1])
    assert torch.equal(y, rms_norm_from_rstd(h, w, rstd, 0.0, casting))


@pytest.mark.parametrize("casting", CASTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_forward_bitwise_given_rstd(dtype: torch.dtype, casting: str, row_path) -> None:
    """fp32 and fp16 everywhere; bf16 on the GPU (test_cuda_forward_bitwise_given_rstd)."""
    _assert_forward_bitwise(dtype, 100, casting, DEV)


def test_calls_from_before_casting_round_as_llama() -> None:
    """The op, its eager entry and the launchers without a casting: HF Llama's rounding, as before."""
    x, r = (randn(4, 24, dtype=torch.bfloat16, device=DEV, scale=3.0).requires_grad_() for _ in range(2))
    w = randn(24, dtype=torch.bfloat16, device=DEV, offset=1.0).requires_grad_()
    dy, dh = randn(4, 24, dtype=torch.bfloat16, device=DEV), randn(4, 24, dtype=torch.bfloat16, device=DEV)
    op = torch.ops.kernel_pytorch.add_rms_norm_fwd
    pairs = [(op(x, r, w, EPS, 0.0)[:2], op(x, r, w, EPS, 0.0, "llama")[:2]),
             (add_rms_norm_eager(x, r, w, EPS, 0.0), add_rms_norm_eager(x, r, w, EPS, 0.0, "llama"))]
    for old, llama in pairs:
        assert all(torch.equal(a, b) for a, b in zip(old, llama))
        got = torch.autograd.grad(old, (x, r, w), (dy, dh))
        want = torch.autograd.grad(llama, (x, r, w), (dy, dh))
        assert all(torch.equal(g, e) for g, e in zip(got, want))
    xd, rd, wd = x.detach(), r.detach(), w.detach()
    y, h, rstd = add_rms_norm_fwd(xd, rd, wd, EPS, 0.0)
    assert all(torch.equal(a, b) for a, b in zip((y, h, rstd), add_rms_norm_fwd(xd, rd, wd, EPS, 0.0, "llama")))
    old = add_rms_norm_bwd(dy, dh, h, wd, rstd, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(old, add_rms_norm_bwd(dy, dh, h, wd, rstd, 0.0, "llama")))


def test_reference_backward_is_the_gradient_of_the_reference() -> None:
    x = randn(6, 40, dtype=torch.float64).requires_grad_()
    r = randn(6, 40, dtype=torch.float64).requires_grad_()
    w = randn(40, dtype=torch.float64, offset=1.0).requires_grad_()
    dy, dh = randn(6, 40, dtype=torch.float64), randn(6, 40, dtype=torch.float64)
    y, h = R.add_rms_norm(x, r, w, EPS, 1.0)
    gx, gr, gw = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
    hd = h.detach()
    d_sum, dw = R.add_rms_norm_backward(dy, dh, hd, w.detach(), rms_norm_rstd(hd, EPS), 1.0)
    torch.testing.assert_close(d_sum, gx)
    torch.testing.assert_close(d_sum, gr)
    torch.testing.assert_close(dw, gw)


@pytest.mark.parametrize("casting", [None, "gemma"])
def test_opcheck_and_compile(casting: str | None) -> None:
    """casting=None: the call without it (the schema default)."""
    tail = () if casting is None else (casting,)
    x = randn(3, 4, 32, device=DEV).requires_grad_()
    r = randn(3, 4, 32, device=DEV).requires_grad_()
    w = randn(32, device=DEV, offset=1.0).requires_grad_()
    torch.library.opcheck(torch.ops.kernel_pytorch.add_rms_norm_fwd.default, (x, r, w, EPS, 0.0, *tail))
    y, h, rstd = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, r, w, EPS, 0.0, *tail)
    dy, dh = randn(3, 4, 32, device=DEV), randn(3, 4, 32, device=DEV)
    torch.library.opcheck(
        torch.ops.kernel_pytorch.add_rms_norm_bwd.default, (dy, dh, h.detach(), w.detach(), rstd.detach(), 0.0, *tail)
    )

    def f(x, r, w):
        y, h, _ = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, r, w, EPS, 0.0, *tail)
        return y * h

    out, breaks = compile_and_count_breaks(f, x, r, w)
    assert breaks == 0
    assert_close(out, f(x, r, w), "compiled")
    g = randn(3, 4, 32, device=DEV)
    for a, e in zip(torch.autograd.grad(out, (x, r, w), g), torch.autograd.grad(f(x, r, w), (x, r, w), g)):
        assert_close(a, e, "compiled grad")


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [4096, 16385])
def test_cuda_bf16(cols: int) -> None:
    x = randn(64, cols, dtype=torch.bfloat16, device="cuda")
    r = randn(64, cols, dtype=torch.bfloat16, device="cuda")
    w = randn(cols, dtype=torch.bfloat16, device="cuda", offset=1.0)
    dy, dh = randn(64, cols, dtype=torch.bfloat16, device="cuda"), randn(64, cols, dtype=torch.bfloat16, device="cuda")
    with Poisoned():
        y, h, rstd = add_rms_norm_fwd(x, r, w, EPS, 0.0)
        d_sum, dw = add_rms_norm_bwd(dy, dh, h, w, rstd, 0.0)
    _assert_outputs(x, r, w, dy, dh, y, h, d_sum)


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [100, 4096, 16385])
@pytest.mark.parametrize("casting", CASTINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_forward_bitwise_given_rstd(dtype: torch.dtype, casting: str, cols: int) -> None:
    _assert_forward_bitwise(dtype, cols, casting, "cuda")
