"""The eager fast path (ops/_common/fast_path.py): its host-time gain over the plain path, pinned on the
CPU with both entries of one toy op built in this process; its fallback to the plain path, with one log
line, where a private torch API it relies on is missing or not as expected; and its switch."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from kernel_pytorch import _env
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common import fast_path
from kernel_pytorch.ops._common.register import Impl, RegisteredOp, register_op
from tests.grid import randn
from tests.ops.norm_helpers import assert_close

NS = "kernel_pytorch_test_fast_path"


# A toy op whose launchers are one torch multiply, so a call's time is mostly host overhead: the op
# dispatcher and autograd glue on the plain path, the eager Function on the fast path.
def _twice(x: Tensor, *, eager: bool = False) -> Tensor:
    return x * 2.0


def _twice_reference(x: Tensor) -> Tensor:
    return x * 2.0


def _twice_bwd(dy: Tensor, *, eager: bool = False) -> Tensor:
    return dy * 2.0


def _twice_bwd_reference(dy: Tensor) -> Tensor:
    return dy * 2.0


def _register(name: str) -> RegisteredOp:
    return register_op(
        name,
        Impl(_twice, _twice_reference, "reference", outputs=("y",)),
        Impl(_twice_bwd, _twice_bwd_reference, "reference", outputs=("dx",)),
        differentiable=("y",),
        grads={"x": "dx"},
        namespace=NS,
    )


with tuning.override(fast_path=fast_path.FastPath(enabled=True)):
    FAST = _register("twice_fast")
with tuning.override(fast_path=fast_path.FastPath(enabled=False)):
    PLAIN = _register("twice_plain")


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def host_times(mode: str, rounds: int = 15, calls: int = 200) -> tuple[float, float, float]:
    """Median us per call of the fast and the plain entry, and the median of their per-round ratios.
    The two alternate within each round (which goes first alternates too), so load on the machine
    meets both alike. mode: "no_grad" (a forward) or "grad" (a forward and its backward)."""
    x = randn(8, 16).requires_grad_(mode == "grad")
    dy = randn(8, 16)

    def call(entry: Callable[[Tensor], Tensor]) -> Callable[[], object]:
        if mode == "grad":
            return lambda: entry(x).backward(dy)
        return lambda: entry(x)

    fast, plain = call(FAST.eager), call(PLAIN.eager)
    for fn in (fast, plain):  # warm up
        _per_call(fn, calls // 4)
    fast_us, plain_us, ratios = [], [], []
    with torch.set_grad_enabled(mode == "grad"):
        for r in range(rounds):
            order = (fast, plain) if r % 2 == 0 else (plain, fast)
            times = {fn: _per_call(fn, calls) for fn in order}
            fast_us.append(times[fast] * 1e6)
            plain_us.append(times[plain] * 1e6)
            ratios.append(times[fast] / times[plain])
    return statistics.median(fast_us), statistics.median(plain_us), statistics.median(ratios)


def test_both_entries_agree() -> None:
    assert hasattr(FAST.eager, "Function") and not hasattr(PLAIN.eager, "Function")
    for mode in ("no_grad", "grad"):
        x = randn(4, 16).requires_grad_(mode == "grad")
        with torch.set_grad_enabled(mode == "grad"):
            ys = [entry(x) for entry in (FAST.eager, PLAIN.eager)]
        assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], 2 * x.detach())
        if mode == "grad":
            dy = randn(4, 16)
            grads = [torch.autograd.grad(y, x, dy)[0] for y in ys]
            assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], 2 * dy)


@pytest.mark.parametrize("mode", ["no_grad", "grad"])
def test_fast_path_takes_less_host_time(mode: str) -> None:
    """The fast entry is not slower than the plain one (fast_path.py's docstring has the numbers)."""
    fast_us, plain_us, ratio = host_times(mode)
    assert ratio < 1.0, f"{mode}: fast {fast_us:.1f} us against plain {plain_us:.1f} us per call"


@pytest.mark.parametrize(
    "owner, attribute",
    [
        (torch.autograd.function, "_is_setup_context_defined"),
        (torch._C, "_are_functorch_transforms_active"),
        (torch._C, "_FunctionBase"),
    ],
    ids=["is_setup_context_defined", "functorch_check", "function_base"],
)
def test_a_missing_private_api_falls_back_to_the_plain_path(
    owner: object, attribute: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As after a torch upgrade that drops the attribute: the ops register, their entries are the plain
    path, and one log line says so, however many ops register."""
    _env.log_once.cache_clear()
    name = f"twice_without_{attribute.strip('_')}"
    with (
        caplog.at_level(logging.WARNING, logger="kernel_pytorch"),
        tuning.override(fast_path=fast_path.FastPath(enabled=True)),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.delattr(owner, attribute)  # only while the ops register: torch's own calls need it
        ops = [_register(f"{name}_{i}") for i in range(2)]
    lines = [r.getMessage() for r in caplog.records if "fast path is off" in r.getMessage()]
    assert len(lines) == 1 and attribute in lines[0]
    x = randn(4, 16).requires_grad_()
    for op in ops:
        assert not hasattr(op.eager, "Function")
        y = op.eager(x)
        assert_close(y, 2 * x.detach(), "y")
        assert_close(torch.autograd.grad(y.sum(), x)[0], torch.full_like(x, 2.0), "dx")


def test_an_unexpected_private_api_falls_back_to_the_plain_path(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Function.apply would bind arguments itself (it says the Function has a setup_context): the C
    apply is no longer what it would call, so the plain path is taken."""
    _env.log_once.cache_clear()
    with (
        caplog.at_level(logging.WARNING, logger="kernel_pytorch"),
        tuning.override(fast_path=fast_path.FastPath(enabled=True)),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(torch.autograd.function, "_is_setup_context_defined", lambda fn: True)
        op = _register("twice_unexpected")
    assert not hasattr(op.eager, "Function")
    assert any("fast path is off" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("on", True), ("0", False), ("false", False),
                                       ("OFF", False)])
def test_switch_from_the_environment(value: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_FAST_PATH", value)
    assert fast_path._from_environment() == fast_path.FastPath(enabled=on)


def test_a_bad_switch_value_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_FAST_PATH", "maybe")
    with pytest.raises(ValueError, match="KERNEL_PYTORCH_FAST_PATH='maybe'"):
        fast_path._from_environment()


if __name__ == "__main__":  # the numbers in fast_path.py's docstring
    for m in ("no_grad", "grad"):
        f, p, q = host_times(m, rounds=31)
        print(f"{m}: fast {f:.1f} us, plain {p:.1f} us per call, median ratio {q:.2f}")
