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


@pytest.mark.cuda
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
def test_eager_cached_launches_match_reference(misaligned: bool) -> None:
    """The eager path keeps each specialisation's binary and launches it directly: repeated calls,
    a differently aligned input (another specialisation) and a side stream all stay correct."""
    rows, cols = 48, 1000
    flat = randn(rows * cols + 1, dtype=torch.bfloat16, device="cuda")
    x = (flat[1:] if misaligned else flat[:-1]).view(rows, cols).requires_grad_()
    res = randn(rows, cols, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w = randn(cols, dtype=torch.bfloat16, device="cuda", offset=1.0).requires_grad_()
    b = randn(cols, dtype=torch.bfloat16, device="cuda").requires_grad_()
    dy = randn(rows, cols, dtype=torch.bfloat16, device="cuda")
    cases = {
        "rms_norm": (lambda: (F.rms_norm(x, w),), lambda: (R.rms_norm(x, w),), (x, w)),
        "layer_norm": (lambda: (F.layer_norm(x, w, b),), lambda: (R.layer_norm(x, w, b, 1e-5),), (x, w, b)),
        "add_rms_norm": (lambda: F.add_rms_norm(x, res, w), lambda: R.add_rms_norm(x, res, w), (x, res, w)),
    }
    side = torch.cuda.Stream()
    for name, (ours, ref, wrt) in cases.items():
        want_out = ref()
        want = torch.autograd.grad(want_out, wrt, [dy] * len(want_out))
        for stream in (None, None, side):
            with torch.cuda.stream(stream or torch.cuda.current_stream()):
                side.wait_stream(torch.cuda.default_stream())
                out = ours()
                got = torch.autograd.grad(out, wrt, [dy] * len(out))
            torch.cuda.synchronize()
            for o, e in zip(out, want_out):
                assert_close(o, e, f"{name} y")
            for g, e, what in zip(got, want, ("dx", "d1", "d2")):
                assert_close(g, e, f"{name} {what}")


def test_host_bound_layer_norm_rule() -> None:
    """Which eager LayerNorm calls backend='auto' hands to ATen: gradient-recording, small, same dtypes."""
    from kernel_pytorch.functional import _host_bound_layer_norm

    x, w, b = randn(4, 8), randn(8), randn(8)
    assert not _host_bound_layer_norm(x, w, b)  # nothing records a gradient
    assert _host_bound_layer_norm(x.requires_grad_(), w, b)
    assert _host_bound_layer_norm(randn(4, 8), w.requires_grad_(), None)
    with torch.no_grad():
        assert not _host_bound_layer_norm(x, w, b)
    assert not _host_bound_layer_norm(x, w.double(), b)
    big = torch.empty(F.ATEN_LAYER_NORM_MAX_NUMEL + 1, device="meta", requires_grad=True)
    assert not _host_bound_layer_norm(big, None, None)


@pytest.mark.cuda
def test_auto_layer_norm_small_training_call_runs_aten(caplog: pytest.LogCaptureFixture) -> None:
    from kernel_pytorch._env import log_once

    log_once.cache_clear()
    x = randn(64, 1024, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w = randn(1024, dtype=torch.bfloat16, device="cuda", offset=1.0).requires_grad_()
    b = randn(1024, dtype=torch.bfloat16, device="cuda").requires_grad_()
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        y = F.layer_norm(x, w, b)
    assert "ATen's fused layer_norm" in caplog.text
    assert torch.equal(y, torch.nn.functional.layer_norm(x, (1024,), w, b, 1e-5))
    forced = F.layer_norm(x, w, b, backend="triton")
    assert_close(forced, R.layer_norm(x, w, b, 1e-5), "triton")
