"""Fused residual add + RMSNorm: kernels vs the reference, both outputs and both gradients."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops.add_rms_norm import add_rms_norm_bwd, add_rms_norm_fwd
from kernel_pytorch.reference.rms_norm import rms_norm_rstd
from tests.grid import DTYPES, ROW_SHAPES, Poisoned, compile_and_count_breaks, device_under_test, randn, strided_rows
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
EPS = 1e-6


def _assert_outputs(x, r, w, dy, dh, y, h, d_sum):
    """y, h and the gradient of x + residual against the reference; returns (h_ref, dweight_ref)."""
    y_ref, h_ref = R.add_rms_norm(x, r, w, EPS)
    assert_close(h, h_ref, "h")
    assert_close(y, y_ref, "y")
    d_ref, dw_ref = R.add_rms_norm_backward(dy, dh, h_ref, w, rms_norm_rstd(h_ref, EPS))
    assert_close(d_sum, d_ref, "d(x + residual)")
    return h_ref, dw_ref


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_kernels_match_reference(lead, cols, dtype, row_path) -> None:
    x = strided_rows(lead, cols, dtype, DEV)
    r = randn(*lead, cols, dtype=dtype, device=DEV)
    w = randn(cols, dtype=dtype, device=DEV, scale=0.5, offset=1.0)
    dy = randn(*lead, cols, dtype=dtype, device=DEV)
    dh = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        y, h, rstd = add_rms_norm_fwd(x, r, w, EPS, 0.0)
        d_sum, dw = add_rms_norm_bwd(dy, dh, h, w, rstd, 0.0)
    h_ref, dw_ref = _assert_outputs(x, r, w, dy, dh, y, h, d_sum)
    h64 = h_ref.double()
    _, dw64 = R.add_rms_norm_backward(dy.double(), dh.double(), h64, w.double(), rms_norm_rstd(h64, EPS))
    assert_budget(dw, dw_ref, dw64, "dweight")


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


def test_opcheck_and_compile() -> None:
    x = randn(3, 4, 32, device=DEV).requires_grad_()
    r = randn(3, 4, 32, device=DEV).requires_grad_()
    w = randn(32, device=DEV, offset=1.0).requires_grad_()
    torch.library.opcheck(torch.ops.kernel_pytorch.add_rms_norm_fwd.default, (x, r, w, EPS, 0.0))

    def f(x, r, w):
        y, h, _ = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, r, w, EPS, 0.0)
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
