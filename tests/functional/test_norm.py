"""kernel_pytorch.functional's norm family: argument errors name the argument, every backend computes
the reference's function (forward and gradients), and LayerNorm's ATen route for small training calls."""

from __future__ import annotations

import logging

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import _dispatch, norm
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


def test_unknown_casting_is_refused() -> None:
    x, w = randn(4, 8), randn(8)
    for call in (lambda: F.rms_norm(x, w, casting="half"), lambda: F.add_rms_norm(x, x, w, casting="fp32")):
        with pytest.raises(ValueError, match="casting must be one of"):
            call()


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("casting", F.CASTINGS)
def test_casting_reaches_every_backend(backend: str, casting: str) -> None:
    """bf16, where the castings differ: each backend rounds as the reference does in that casting."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = randn(6, 40, dtype=torch.bfloat16, device=dev, scale=3.0)
    r = randn(6, 40, dtype=torch.bfloat16, device=dev)
    w = randn(40, dtype=torch.bfloat16, device=dev, scale=0.5, offset=1.0)
    offset = 1.0 if casting == "gemma" else 0.0
    y = F.rms_norm(x, w, 1e-6, offset=offset, casting=casting, backend=backend)
    assert_close(y, R.rms_norm(x, w, 1e-6, offset, casting), "y")
    y2, h = F.add_rms_norm(x, r, w, 1e-6, offset=offset, casting=casting, backend=backend)
    y2_ref, h_ref = R.add_rms_norm(x, r, w, 1e-6, offset, casting)
    assert_close(y2, y2_ref, "add y")
    assert_close(h, h_ref, "h")
    if dev == "cpu":  # the op's CPU kernel and the reference are one computation
        assert torch.equal(y, R.rms_norm(x, w, 1e-6, offset, casting))
        assert torch.equal(y2, y2_ref)


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
        "rms_norm": (lambda: F.rms_norm(x, w, 1e-6, offset=0.5, backend=backend), lambda: R.rms_norm(x, w, 1e-6, 0.5)),
        "layer_norm": (lambda: F.layer_norm(x, w, b, 1e-5, backend=backend), lambda: R.layer_norm(x, w, b, 1e-5)),
        "add_rms_norm": (
            lambda: sum(F.add_rms_norm(x, r, w, 1e-6, backend=backend)),
            lambda: sum(R.add_rms_norm(x, r, w, 1e-6)),
        ),
    }
    for name, (ours, ref) in cases.items():
        out, expected = ours(), ref()
        assert_close(out, expected, name)
        got = torch.autograd.grad(out, (x, w), dy)
        want = torch.autograd.grad(expected, (x, w), dy)
        for g, e, what in zip(got, want, ("dx", "dweight")):
            assert_close(g, e, f"{name} {what}")


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


def test_aten_layer_norm_route_rule() -> None:
    """Which LayerNorm calls on CUDA backend='auto' hands to ATen: eager, gradient-recording, non-empty,
    small, kernel dtypes, parameters of x's dtype. The rule reads no device (the route checks x is on
    CUDA first), so CPU tensors exercise every other condition."""
    from kernel_pytorch.functional.norm import _aten_layer_norm_rule as route

    def grad(t: torch.Tensor) -> torch.Tensor:
        return t.detach().requires_grad_()

    x, w, b = randn(4, 8), randn(8), randn(8)
    assert route(grad(x), w, b, "auto", False)
    assert route(grad(x), None, None, "auto", False)
    assert not route(x, w, b, "auto", False)  # nothing records a gradient
    assert route(x, grad(w), None, "auto", False)
    assert route(x, w, grad(b), "auto", False)
    with torch.no_grad():
        assert not route(grad(x), w, b, "auto", False)
    assert not route(grad(x), w, b, "auto", True)  # compiling: the registered op goes in the graph
    assert not route(grad(x), w, b, "triton", False)
    assert not route(grad(x), w, b, "reference", False)
    assert not route(grad(x), w.double(), b, "auto", False)
    assert not route(grad(x), w, b.half(), "auto", False)
    assert not route(grad(x.double()), w.double(), b.double(), "auto", False)  # not a kernel dtype
    for dtype in (torch.bfloat16, torch.float16):
        assert route(grad(x.to(dtype)), w.to(dtype), b.to(dtype), "auto", False)
    limit = F.ATEN_LAYER_NORM_MAX_NUMEL
    assert route(torch.empty(limit // 8, 8, device="meta", requires_grad=True), None, None, "auto", False)
    assert not route(torch.empty(limit + 1, device="meta", requires_grad=True), None, None, "auto", False)
    assert not route(torch.empty(4, 0, requires_grad=True), None, None, "auto", False)
    assert not route(torch.empty(0, 8, requires_grad=True), None, None, "auto", False)
    # arguments of the wrong type are the checks' business: the rule declines instead of raising
    assert not route(grad(x), [1.0] * 8, b, "auto", False)
    assert not route(grad(x), w, "bias", "auto", False)
    # the route itself: CUDA tensors only, and a non-tensor x declines (the checks name it)
    assert not norm._aten_layer_norm_route(grad(x), w, b, "auto", False)
    assert not norm._aten_layer_norm_route([[1.0] * 8], None, None, "auto", False)


def test_auto_layer_norm_on_cpu_keeps_the_registered_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ATen route is for CUDA tensors only: a gradient-recording CPU call never reaches it."""

    def aten_layer_norm(*args: object) -> torch.Tensor:
        raise AssertionError("torch.layer_norm called for a CPU tensor")

    monkeypatch.setattr(torch, "layer_norm", aten_layer_norm)
    x = randn(4, 8).requires_grad_()
    w, b = randn(8, offset=1.0).requires_grad_(), randn(8).requires_grad_()
    assert_close(F.layer_norm(x, w, b), R.layer_norm(x, w, b, 1e-5), "y")


def test_layer_norm_non_tensor_arguments_are_named() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = randn(4, 8, device=dev).requires_grad_()
    with pytest.raises(TypeError, match="weight must be a tensor"):
        F.layer_norm(x, [1.0] * 8)
    with pytest.raises(TypeError, match="bias must be a tensor"):
        F.layer_norm(x, None, "bias")
    with pytest.raises(TypeError, match="x must be a tensor"):
        F.layer_norm([[1.0] * 8], None)


def _cuda_layer_norm_args(dtype: torch.dtype, d: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = randn(64, d, dtype=dtype, device="cuda").requires_grad_()
    w = randn(d, dtype=dtype, device="cuda", offset=1.0).requires_grad_()
    b = randn(d, dtype=dtype, device="cuda").requires_grad_()
    return x, w, b


@pytest.mark.cuda
@pytest.mark.parametrize("triton_active", [True, False], ids=["triton", "no-triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("params", ["weight+bias", "weight", "none"])
def test_auto_layer_norm_small_training_call_runs_aten(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    triton_active: bool,
    dtype: torch.dtype,
    params: str,
) -> None:
    """A small gradient-recording call runs ATen's layer_norm, whether or not the Triton path is active:
    output and gradients bitwise those of torch.nn.functional.layer_norm."""
    from kernel_pytorch._env import log_once

    if not triton_active:
        monkeypatch.setattr(_dispatch, "triton_status", lambda device=None: (False, "switched off for the test"))
    log_once.cache_clear()
    x, w, b = _cuda_layer_norm_args(dtype)
    w = w if params != "none" else None
    b = b if params == "weight+bias" else None
    wrt = tuple(t for t in (x, w, b) if t is not None)
    dy = randn(64, 1024, dtype=dtype, device="cuda")
    real, calls = torch.layer_norm, []
    monkeypatch.setattr(torch, "layer_norm", lambda *args: calls.append(args) or real(*args))
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        y = F.layer_norm(x, w, b)
        F.layer_norm(x, w, b)
    assert len(calls) == 2
    assert caplog.text.count("ATen's fused layer_norm") == 1
    got = torch.autograd.grad(y, wrt, dy)
    expected = torch.nn.functional.layer_norm(x, (1024,), w, b, 1e-5)
    want = torch.autograd.grad(expected, wrt, dy)
    assert torch.equal(y, expected)
    for g, e in zip(got, want):
        assert torch.equal(g, e)
    if triton_active:
        forced = F.layer_norm(x, w, b, backend="triton")
        assert_close(forced, R.layer_norm(x, w, b, 1e-5), "triton")
        assert len(calls) == 3  # only the F.layer_norm reference above


@pytest.mark.cuda
def test_auto_layer_norm_aten_route_errors_name_the_argument() -> None:
    """Where ATen refuses the arguments, our checks run and raise our error, not chained to ATen's."""
    x, w, b = _cuda_layer_norm_args(torch.bfloat16, d=8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)") as err:
        F.layer_norm(x, w[:7], b)
    assert err.value.__context__ is None
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        F.layer_norm(x, w.view(1, 8), b)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        F.layer_norm(x, w, torch.cat([b, b]))
    with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
        F.layer_norm(x, w.detach().cpu(), b)
    with pytest.raises(ValueError, match="bias is on cpu but x is on cuda"):
        F.layer_norm(x, None, b.detach().cpu())
    with pytest.raises(ValueError, match="non-empty last dimension"):
        F.layer_norm(torch.ones((), dtype=torch.bfloat16, device="cuda", requires_grad=True))
    with pytest.raises(ValueError, match="non-empty last dimension"):
        F.layer_norm(torch.ones(4, 0, device="cuda", requires_grad=True), torch.ones(0, device="cuda"))
    with pytest.raises(TypeError, match="eps"):  # our checks pass: ATen's own error stands
        F.layer_norm(x, w, b, "1e-5")


@pytest.mark.cuda
def test_auto_layer_norm_under_compile_keeps_the_registered_op() -> None:
    import torch._dynamo

    targets: list[object] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        targets.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    x, w, b = _cuda_layer_norm_args(torch.bfloat16)
    y = torch.compile(lambda x, w, b: F.layer_norm(x, w, b), backend=capture, fullgraph=True)(x, w, b)
    assert torch.layer_norm not in targets and torch.nn.functional.layer_norm not in targets
    assert any("kernel_pytorch" in str(t) for t in targets), targets
    assert_close(y, R.layer_norm(x, w, b, 1e-5), "y")
