"""The eager path's host-time shortcuts keep behaviour: the launch key cache (finer than Triton's
specialisation), the eager entry's C apply and its no-grad forward (or, with KERNEL_PYTORCH_FAST_PATH=0,
the registered op it falls back to), RoPE's launch plans and argument-check cache, the per-device Triton
status. Launchers run under TRITON_INTERPRET=1 on CPU."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import rope as rope_functional
from kernel_pytorch.ops import gated_act_eager, rms_norm_eager, tuning
from kernel_pytorch.ops import rope as rope_ops
from kernel_pytorch.ops._common import launch as _launch
from kernel_pytorch.ops.rope import plan as rope_plan
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
FAST = hasattr(rms_norm_eager, "Function")  # the fast path's entries carry their autograd.Function


@pytest.mark.parametrize(
    "a, b",
    [
        ((1,), (True,)),  # equal and hashed alike, but Triton types them i32 and i1
        ((0,), (0.0,)),
        ((16,), (17,)),
        ((2**31,), (2**31 - 1,)),
        ((torch.zeros(4),), (torch.zeros(4, dtype=torch.float16),)),
        ((torch.zeros(8)[:4],), (torch.zeros(8)[1:5],)),  # 16-byte aligned or not
    ],
)
def test_call_key_is_finer_than_the_specialisation_key(a: tuple, b: tuple) -> None:
    assert _launch._arg_key(a) != _launch._arg_key(b)
    assert _launch._call_key(a) != _launch._call_key(b)


def test_call_key_repeats_for_repeated_shapes() -> None:
    x, y = torch.zeros(8, 4), torch.zeros(8, 4)
    assert _launch._call_key((x, 8, 4, 1e-6, True)) == _launch._call_key((y, 8, 4, 1e-6, True))


def test_eager_entry_records_gradients_and_skips_the_function_without_them() -> None:
    x = randn(6, 40, device=DEV).requires_grad_()
    w = randn(40, device=DEV).requires_grad_()
    y = rms_norm_eager(x, w, 1e-6, 0.0, "llama")
    assert type(y.grad_fn).__name__ == ("RmsNormEagerBackward" if FAST else
                                        "GeneratedBackwardFor_kernel_pytorch_rms_norm_fwd_defaultBackward")
    with torch.no_grad():
        y0 = rms_norm_eager(x, w, 1e-6, 0.0, "llama")
    with torch.inference_mode():
        y1 = rms_norm_eager(x, w, 1e-6, 0.0)  # a trailing default filled in, as on the Function
    assert y0.grad_fn is None and not y0.requires_grad
    assert torch.equal(y0, y.detach()) and torch.equal(y1, y.detach())
    dy = randn(6, 40, device=DEV)
    got = torch.autograd.grad(y, (x, w), dy)
    want = torch.autograd.grad(R.rms_norm(x, w, 1e-6), (x, w), dy)
    for g, e in zip(got, want):
        assert_close(g, e, "grad")


def test_eager_entry_keeps_functorch_behaviour() -> None:
    """Under a functorch transform the fast entry takes autograd.Function.apply, which refuses a Function
    without setup_context; the plain entry is the registered op, which vmap runs by its batching fallback."""
    g, u = randn(3, 16, device=DEV), randn(3, 16, device=DEV)
    if FAST:
        with pytest.raises(RuntimeError, match="setup_context"):
            torch.func.vmap(lambda a, b: gated_act_eager(a, b, "silu"))(g, u)
    else:
        assert_close(torch.func.vmap(lambda a, b: gated_act_eager(a, b, "silu"))(g, u), R.gated_act(g, u, "silu"),
                     "vmap")


def _rope_args(layout: str) -> tuple[torch.Tensor, ...]:
    if layout == "bhtd":
        q, k = randn(2, 4, 3, 16, device=DEV), randn(2, 2, 3, 16, device=DEV)
    else:  # (B, T, H, D) projections seen as (B, H, T, D), as a decode step has them
        q, k = randn(2, 3, 4, 16, device=DEV).transpose(1, 2), randn(2, 3, 2, 16, device=DEV).transpose(1, 2)
    cos, sin = randn(2, 3, 12, device=DEV), randn(2, 3, 12, device=DEV)  # partial rotary: 12 of 16
    return q, k, cos, sin


@pytest.mark.parametrize("layout", ["bhtd", "bthd-view"])
def test_rope_plans_are_reused_and_keyed_on_layout_and_config(layout: str) -> None:
    rope_plan._PLANS.clear()
    q, k, cos, sin = _rope_args(layout)
    want = R.rope(q, k, cos, sin)
    for _ in range(2):
        got = rope_ops.rope_fwd(q, k, cos, sin, eager=True)
        for g, e in zip(got, want):
            assert_close(g, e, "rope")
    assert len(rope_plan._PLANS) == 1
    rope_ops.rope_fwd(q, k, cos, sin)  # a traced launch (eager=False) plans without the cache
    assert len(rope_plan._PLANS) == 1
    with tuning.changed("rope", schedule="tile"):
        got = rope_ops.rope_fwd(q, k, cos, sin, eager=True)
    assert len(rope_plan._PLANS) == 2
    for g, e in zip(got, want):
        assert_close(g, e, "rope")
    dq, dk = rope_ops.rope_bwd(*want, cos, sin, eager=True)
    assert len(rope_plan._PLANS) == 3
    want_dq, want_dk = R.rope_backward(*want, cos, sin)
    assert_close(dq, want_dq, "rope bwd")
    assert_close(dk, want_dk, "rope bwd")


def test_rope_check_cache_stores_successes_only() -> None:
    rope_functional._CHECKED.clear()
    q, k, cos, sin = _rope_args("bhtd")
    F.apply_rotary(q, k, cos, sin)
    F.apply_rotary(q, k, cos, sin)
    assert len(rope_functional._CHECKED) == 1
    for _ in range(2):  # a bad signature raises every time
        with pytest.raises(ValueError, match="cover 2 tokens"):
            F.apply_rotary(q, k, cos[:, :2], sin[:, :2])
        with pytest.raises(TypeError, match="q must be a tensor"):
            F.apply_rotary(q.tolist(), k, cos, sin)
    assert len(rope_functional._CHECKED) == 1


def test_triton_status_of_a_cpu_device_is_not_cached() -> None:
    from kernel_pytorch import _env

    active, why = _env.triton_status(torch.device("cpu"))
    assert not active and "cpu" in why
    assert 0 not in _env._CUDA_STATUS or torch.cuda.is_available()


@pytest.mark.cuda
def test_direct_launches_by_the_call_key_on_cuda() -> None:
    """Repeated shapes find their binary by the per-call key; a new shape of the same specialisation
    (rows 5 and 7) and a misaligned view take the specialisation key, and every result is right."""
    from kernel_pytorch.ops._common import fast_path

    if not fast_path.enabled():  # the plain path launches through wrap_triton, never directly
        pytest.skip("direct launches are the fast path's (KERNEL_PYTORCH_FAST_PATH=0)")
    from kernel_pytorch.ops import rms_norm as rms_ops

    w = randn(64, device="cuda")
    base = randn(8 * 64 + 1, device="cuda")
    for x in (randn(4, 64, device="cuda"), randn(4, 64, device="cuda"), randn(5, 64, device="cuda"),
              randn(7, 64, device="cuda"), base[1:].view(8, 64), base[:-1].view(8, 64)):
        assert_close(rms_norm_eager(x, w, 1e-6, 0.0), R.rms_norm(x, w, 1e-6), "rms_norm")
    assert rms_ops._fwd_kernel._calls and rms_ops._fwd_kernel._binaries
