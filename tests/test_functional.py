"""kernel_pytorch.functional: argument errors name the argument, backends resolve as documented, and
every backend computes the reference's function (forward and gradients)."""

from __future__ import annotations

import logging

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from tests.grid import randn
from tests.ops.norm_helpers import assert_close


def test_rms_norm_errors_name_the_argument() -> None:
    x, w = randn(4, 8), randn(8)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.rms_norm(torch.ones(4, 8, dtype=torch.int64), w)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        F.rms_norm(x, randn(7))
    with pytest.raises(TypeError, match="weight must be a floating-point"):
        F.rms_norm(x, torch.ones(8, dtype=torch.int32))
    with pytest.raises(ValueError, match="non-empty last dimension"):
        F.rms_norm(torch.empty(4, 0), torch.empty(0))
    with pytest.raises(ValueError, match="backend must be one of"):
        F.rms_norm(x, w, backend="cuda")
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        F.rms_norm(x, torch.empty(8, device="meta"))


def test_add_rms_norm_errors_name_the_argument() -> None:
    x, w = randn(4, 8), randn(8)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        F.add_rms_norm(x, randn(4, 9), w)
    with pytest.raises(TypeError, match="residual must have x's dtype"):
        F.add_rms_norm(x, randn(4, 8, dtype=torch.float16), w)


def test_layer_norm_errors_name_the_argument() -> None:
    x = randn(4, 8)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        F.layer_norm(x, randn(8), randn(3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_triton_backend_on_cpu_raises_with_the_reason() -> None:
    with pytest.raises(ValueError, match="backend='triton' cannot run rms_norm: tensors are on cpu"):
        F.rms_norm(randn(4, 8), randn(8), backend="triton")


def test_auto_on_cpu_logs_once_why(caplog: pytest.LogCaptureFixture) -> None:
    from kernel_pytorch._env import log_once

    log_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        F.rms_norm(randn(4, 8, dtype=torch.float64), randn(8, dtype=torch.float64))
        F.rms_norm(randn(4, 8, dtype=torch.float64), randn(8, dtype=torch.float64))
    messages = [r.getMessage() for r in caplog.records if "rms_norm" in r.getMessage()]
    assert len(messages) == 1 and "using the reference" in messages[0]


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_backends_compute_the_reference(backend: str, dtype: torch.dtype) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = randn(3, 5, 16, dtype=dtype, device=dev).requires_grad_()
    r = randn(3, 5, 16, dtype=dtype, device=dev).requires_grad_()
    w = randn(16, dtype=dtype, device=dev, offset=1.0).requires_grad_()
    b = randn(16, dtype=dtype, device=dev).requires_grad_()
    dy = randn(3, 5, 16, dtype=dtype, device=dev)
    cases = {
        "rms_norm": (lambda: F.rms_norm(x, w, 1e-6, offset=0.5, backend=backend),
                     lambda: R.rms_norm(x, w, 1e-6, 0.5)),
        "layer_norm": (lambda: F.layer_norm(x, w, b, 1e-5, backend=backend),
                       lambda: R.layer_norm(x, w, b, 1e-5)),
        "add_rms_norm": (lambda: sum(F.add_rms_norm(x, r, w, 1e-6, backend=backend)),
                         lambda: sum(R.add_rms_norm(x, r, w, 1e-6))),
    }
    for name, (ours, ref) in cases.items():
        out, expected = ours(), ref()
        assert_close(out, expected, name)
        got = torch.autograd.grad(out, (x, w), dy)
        want = torch.autograd.grad(expected, (x, w), dy)
        for g, e, what in zip(got, want, ("dx", "dweight")):
            assert_close(g, e, f"{name} {what}")


@pytest.mark.cuda
def test_triton_backend_on_cuda_matches_reference() -> None:
    x = randn(64, 4096, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w = randn(4096, dtype=torch.bfloat16, device="cuda", offset=1.0).requires_grad_()
    y = F.rms_norm(x, w, backend="triton")
    assert_close(y, R.rms_norm(x, w), "y")
    with pytest.raises(ValueError, match="float64"):
        F.rms_norm(x.double(), w.double(), backend="triton")
