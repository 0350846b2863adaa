"""The multi-tensor Adam/AdamW kernel: against the reference and torch's fused Adam and AdamW (weight decay
either way, maximize, amsgrad), the block table's tails, the registered op (opcheck), and the launcher's
argument checks."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.ops import adam as K
from kernel_pytorch.ops import tuning
from kernel_pytorch.reference.adam import adam_, adam_scalars
from kernel_pytorch.tolerances import compare
from tests import _sanitize
from tests.grid import DTYPES, device_under_test, randn

DEV = device_under_test()
# sizes around the block (a tensor of one element, a partial block, exactly one, one past, several)
BLOCK = tuning.current("adam").block
SIZES = ((1,), (33,), (BLOCK - 1,), (BLOCK,), (BLOCK + 1,), (3, BLOCK // 2 + 5))
HYPER = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
# (decoupled, maximize, amsgrad): AdamW, Adam, and each option once
VARIANTS = ((True, False, False), (False, False, False), (True, True, False), (False, False, True),
            (True, True, True))


def _state(shapes, dtype, state_dtype=None, grad_dtype=None, amsgrad=False):
    """Random parameters, gradients and moments (v > 0; v_max around v, so the max picks either), never zeros."""
    sd, gd = state_dtype or dtype, grad_dtype or dtype
    params = [randn(*s, dtype=dtype, device=DEV) for s in shapes]
    grads = [randn(*s, dtype=gd, device=DEV) for s in shapes]
    ms = [randn(*s, dtype=sd, device=DEV, scale=0.1) for s in shapes]
    vs = [(randn(*s, device=DEV, scale=0.01) ** 2 + 1e-4).to(sd) for s in shapes]
    maxes = [(v.float() * (0.5 + torch.rand(v.shape, device=DEV))).to(sd) for v in vs] if amsgrad else None
    return params, grads, ms, vs, maxes


def _tensors(state):
    return [t for ts in state if ts is not None for t in ts]


def _clone(state):
    return [None if ts is None else [t.clone() for t in ts] for ts in state]


def _assert_same(actual, expected, what: str) -> None:
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        result = compare(a, e)
        assert result.passed, result.message(f"{what}[{i}]")


@pytest.mark.parametrize("precise", [False, True], ids=["fast", "ieee"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("step,weight_decay", [(1.0, 0.0), (7.0, 0.1)])
def test_kernel_matches_reference(dtype, step, weight_decay, precise) -> None:
    state = _state(SIZES, dtype)
    expected = _clone(state)
    with _sanitize.allow(*_tensors(state)), tuning.changed("adam", precise_math=precise):
        K.adam_step(*state, **HYPER, weight_decay=weight_decay, step=step)
    adam_(*expected, **HYPER, weight_decay=weight_decay, step=step)
    for name, a, e in zip(("param", "grad", "exp_avg", "exp_avg_sq"), state, expected):
        _assert_same(a, e, name)
        if dtype == torch.float32:  # within a few ulps: an element the kernel skipped would be off by its update
            for x, y in zip(a, e, strict=True):
                torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("decoupled,maximize,amsgrad", VARIANTS)
def test_variants_match_reference(decoupled, maximize, amsgrad) -> None:
    state = _state(SIZES[:4], torch.float32, amsgrad=amsgrad)
    expected = _clone(state)
    options = dict(HYPER, weight_decay=0.1, step=3.0, decoupled=decoupled, maximize=maximize)
    with _sanitize.allow(*_tensors(state)):
        K.adam_step(*state, **options)
    adam_(*expected, **options)
    for name, a, e in zip(("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), state, expected):
        if a is not None:
            for x, y in zip(a, e, strict=True):
                torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6, msg=name)


@pytest.mark.parametrize("grad_dtype,state_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
def test_mixed_dtypes(grad_dtype, state_dtype) -> None:
    """bf16 parameters with fp32 gradients or moments: each tensor loads and stores its own dtype."""
    state = _state(SIZES[:3], torch.bfloat16, state_dtype, grad_dtype, amsgrad=True)
    expected = _clone(state)
    with _sanitize.allow(*_tensors(state)):
        K.adam_step(*state, **HYPER, weight_decay=0.1, step=2.0)
    adam_(*expected, **HYPER, weight_decay=0.1, step=2.0)
    for a, e in zip(state, expected, strict=True):
        _assert_same(a, e, "mixed")
        assert all(t.dtype == r.dtype for t, r in zip(a, e, strict=True))


@pytest.mark.parametrize("decoupled,maximize,amsgrad", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_steps_match_torch_fused(dtype, decoupled, maximize, amsgrad) -> None:
    """The reference's claim: each step's update is torch's fused Adam's or AdamW's, from the same state
    (three steps; each starts from torch's state, since Triton's interpreter rounds to bf16 by truncation,
    one ulp a step that would otherwise add up)."""
    shapes = SIZES[1:4]
    theirs = [torch.nn.Parameter(randn(*s, dtype=dtype, device=DEV)) for s in shapes]
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(theirs, lr=HYPER["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, amsgrad=amsgrad,
              maximize=maximize, fused=True)
    keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[:3 if amsgrad else 2]
    for step in (1.0, 2.0, 3.0):
        params = [t.detach().clone() for t in theirs]
        moments = [[opt.state[t][k].clone() if opt.state else torch.zeros_like(t) for t in theirs] for k in keys]
        gs = [randn(*s, dtype=dtype, device=DEV) for s in shapes]
        for t, g in zip(theirs, gs, strict=True):
            t.grad = g.clone()
        opt.step()
        state = (params, gs, moments[0], moments[1], moments[2] if amsgrad else None)
        with _sanitize.allow(*_tensors(state)):
            K.adam_step(*state, **HYPER, weight_decay=0.1, step=step, decoupled=decoupled, maximize=maximize)
        _assert_same(params, [t.detach() for t in theirs], "param")
        for key, ours in zip(keys, moments, strict=True):
            _assert_same(ours, [opt.state[t][key] for t in theirs], key)


def test_scalars() -> None:
    step_size, bc2_sqrt = adam_scalars(0.1, 0.9, 0.999, 1)
    assert step_size == pytest.approx(0.1 / 0.1) and bc2_sqrt == pytest.approx(0.001**0.5)
    with pytest.raises(ValueError, match="step"):
        adam_scalars(0.1, 0.9, 0.999, 0)


def test_block_table_covers_every_element() -> None:
    table = K._block_table((1, 5, 8, 9, 0, 16), 4, torch.device("cpu")).tolist()
    # tensor i's blocks, in order: ceil(numel / 4) of them, none for the empty tensor
    assert table == [[0, 0], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [3, 1], [3, 2], [5, 0], [5, 1], [5, 2], [5, 3]]
    assert K._block_table((1, 5, 8, 9, 0, 16), 4, torch.device("cpu")) is K._block_table(
        (1, 5, 8, 9, 0, 16), 4, torch.device("cpu"))  # cached: one table per parameter set


def test_empty_and_no_tensors() -> None:
    K.adam_step([], [], [], [], None, **HYPER, weight_decay=0.0, step=1.0)
    state = _state(((0,), (3,)), torch.float32)
    expected = _clone(state)
    with _sanitize.allow(*_tensors(state)):
        K.adam_step(*state, **HYPER, weight_decay=0.0, step=1.0)
    adam_(*expected, **HYPER, weight_decay=0.0, step=1.0)
    _assert_same(state[0], expected[0], "param")


def test_launcher_checks_its_arguments() -> None:
    params, grads, ms, vs, _ = _state(((8,), (8,)), torch.float32)
    options = dict(HYPER, weight_decay=0.0, step=1.0)
    with pytest.raises(ValueError, match="grads has 1 tensors"):
        K.adam_step(params, grads[:1], ms, vs, None, **options)
    with pytest.raises(TypeError, match="exp_avgs must share one dtype"):
        K.adam_step(params, grads, [ms[0], ms[1].double()], vs, None, **options)
    strided = randn(8, 2, device=DEV)[:, 0]
    with pytest.raises(ValueError, match=r"grads\[1\] must be contiguous"):
        K.adam_step(params, [grads[0], strided], ms, vs, None, **options)
    with pytest.raises(ValueError, match=r"exp_avg_sqs\[0\] must be .* of shape"):
        K.adam_step(params, grads, ms, [vs[0][:4], vs[1]], None, **options)
    with pytest.raises(ValueError, match="max_exp_avg_sqs has 1 tensors"):
        K.adam_step(params, grads, ms, vs, vs[:1], **options)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_registered_op(amsgrad) -> None:
    """The op: opcheck (schema, fake, mutation), and its update on this device is the reference's."""
    state = _state(((5,), (3, 4)), torch.float32, amsgrad=amsgrad)
    scalars = [1e-2, 0.9, 0.999, 1e-8, 0.1, 3.0, False, True]
    as_op = lambda st: [*st[:4], st[4] or []]  # noqa: E731  (the op takes an empty list without amsgrad)
    torch.library.opcheck(torch.ops.kernel_pytorch.adam_.default, as_op(_clone(state)) + scalars)
    expected = _clone(state)
    with _sanitize.allow(*_tensors(state)):
        torch.ops.kernel_pytorch.adam_(*as_op(state), *scalars)
    adam_(*expected, *scalars)
    for a, e in zip(state, expected, strict=True):
        if a is not None:
            _assert_same(a, e, "op")
