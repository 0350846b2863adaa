"""Bias + activation: the launchers against the reference (every activation and dtype, strided rows,
with and without a bias, several row groups), dbias by the fp64-derived budget and bitwise
deterministic, the reference against eager torch and autograd, the argument checks; wide rows on the GPU."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import bias_act as ba_ops
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.bias_act import bias_act_bwd, bias_act_fwd
from kernel_pytorch.reference import _act_checks as checks
from tests.grid import DTYPES, ROW_SHAPES, Poisoned, device_under_test, randn, strided_rows
from tests.ops.act_helpers import ACTS, assert_matches_eager, hf_act
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()


def _inputs(lead, cols, dtype, device=DEV):
    x = strided_rows(lead, cols, dtype, device) * 2.0
    bias = randn(cols, dtype=dtype, device=device, scale=0.5)
    dy = randn(*lead, cols, dtype=dtype, device=device)
    return x, bias, dy


def _assert_backward(dx, db, dy, x, bias, act: str) -> None:
    """dx by the tolerance table; dbias, a sum over rows, by the fp64-derived budget."""
    dx_ref, db_ref = R.bias_act_backward(dy, x, bias, act)
    assert_close(dx, dx_ref, "dx")
    if bias is None:
        assert db is None
        return
    db64 = R.bias_act_backward(dy.double(), x.double(), bias.double(), act)[1]
    assert db.dtype == bias.dtype and db.shape == bias.shape
    assert_budget(db, db_ref, db64, "dbias")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_kernels_match_reference(lead, cols, dtype) -> None:
    x, bias, dy = _inputs(lead, cols, dtype)
    with Poisoned():
        y = bias_act_fwd(x, bias, "gelu")
        dx, db = bias_act_bwd(dy, x, bias, "gelu")
    assert_close(y, R.bias_act(x, bias, "gelu"), "y")
    _assert_backward(dx, db, dy, x, bias, "gelu")


@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_activation(dtype, act, has_bias) -> None:
    x, bias, dy = _inputs((5,), 33, dtype)
    bias = bias if has_bias else None
    with Poisoned():
        y = bias_act_fwd(x, bias, act)
        dx, db = bias_act_bwd(dy, x, bias, act)
    assert_close(y, R.bias_act(x, bias, act), "y")
    _assert_backward(dx, db, dy, x, bias, act)


@pytest.mark.parametrize("groups", [1, 3])
def test_row_groups_and_tails(groups: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several row groups of several tiles each, the last group and tile cut short, several column
    blocks: dbias from the partial rows within the budget, and bitwise-equal over runs."""
    monkeypatch.setattr(ba_ops, "device_programs", lambda device, per_sm: groups * 3)
    small = dict(bias_bwd_tile_elements=32, bias_bwd_programs_per_sm=1, max_block_c=16, min_block_c=16)
    with tuning.changed("mlp", **small):
        x, bias, dy = _inputs((37,), 40, torch.bfloat16)  # 3 column blocks of 16, tiles of 2 rows
        with Poisoned():
            first = bias_act_bwd(dy, x, bias, "silu")
        second = bias_act_bwd(dy, x, bias, "silu")
    _assert_backward(*first, dy, x, bias, "silu")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_in_place_outputs() -> None:
    """y over x and dx over dy equal the out-of-place results bitwise."""
    x, bias, dy = _inputs((6,), 48, torch.bfloat16)
    x, want_y = x.contiguous(), bias_act_fwd(x, bias, "gelu_tanh")
    want_dx, want_db = bias_act_bwd(dy, x, bias, "gelu_tanh")
    dy_buf = dy.clone()
    dx, db = bias_act_bwd(dy_buf, x, bias, "gelu_tanh", out=dy_buf)
    assert dx is dy_buf and torch.equal(dx, want_dx) and torch.equal(db, want_db)
    y = bias_act_fwd(x, bias, "gelu_tanh", out=x)
    assert y is x and torch.equal(y, want_y)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_is_eager_linear_then_act(dtype, act) -> None:
    """The reference is bitwise eager `(F.linear(x, W) + b)` then transformers' activation, and its
    backward within the table (dx) and the fp64 budget (dbias, eager sums the rounded dz) of autograd."""
    x = randn(64, 96, dtype=dtype, scale=2.0).requires_grad_()
    bias = randn(96, dtype=dtype, scale=0.5).requires_grad_()
    dy = randn(64, 96, dtype=dtype)
    y = hf_act(act)(x + bias)
    exact = R.bias_act(x.detach().double(), bias.detach().double(), act)
    assert_matches_eager(R.bias_act(x.detach(), bias.detach(), act), y, exact, "y")
    gx, gb = torch.autograd.grad(y, (x, bias), dy)
    dx, db = R.bias_act_backward(dy, x.detach(), bias.detach(), act)
    assert_close(dx, gx, "dx")
    db64 = R.bias_act_backward(dy.double(), x.detach().double(), bias.detach().double(), act)[1]
    assert_budget(db, gb, db64, "dbias")


@pytest.mark.parametrize("act", ACTS)
def test_reference_backward_is_the_gradient_of_the_reference(act) -> None:
    x = randn(6, 40, dtype=torch.float64, scale=2.0).requires_grad_()
    bias = randn(40, dtype=torch.float64).requires_grad_()
    dy = randn(6, 40, dtype=torch.float64)
    want = torch.autograd.grad(R.bias_act(x, bias, act), (x, bias), dy)
    got = R.bias_act_backward(dy, x.detach(), bias.detach(), act)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: checks.check_bias_act(randn(2, 4), randn(5)), ValueError, r"bias must have shape \(4,\)"),
        (lambda: checks.check_bias_act(randn(2, 4), randn(4, dtype=torch.half)), TypeError, "bias must have x's dtype"),
        (lambda: checks.check_bias_act(randn(2, 4), randn(4, device="meta")), ValueError, "bias is on meta"),
        (lambda: checks.check_bias_act(torch.ones(2, 4, dtype=torch.int64), None), TypeError, "x must be a floating"),
        (lambda: checks.check_bias_act(randn(2, 4), torch.ones(4, dtype=torch.long)), TypeError, "bias must be a"),
    ],
)
def test_checks_name_the_argument(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [768, 3072, 4097, 65536])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_wide_rows(cols: int, dtype: torch.dtype) -> None:
    rows = 64 if cols > 16384 else 2048
    x, bias, dy = _inputs((rows,), cols, dtype, "cuda")
    for act in ACTS:
        with Poisoned():
            y = bias_act_fwd(x, bias, act)
            dx, db = bias_act_bwd(dy, x, bias, act)
        assert_close(y, R.bias_act(x, bias, act), "y")
        _assert_backward(dx, db, dy, x, bias, act)
        again = bias_act_bwd(dy, x, bias, act)
        assert torch.equal(again[0], dx) and torch.equal(again[1], db)
