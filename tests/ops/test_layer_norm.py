"""LayerNorm: kernels vs the reference (both paths, strided rows, with/without affine), the reference's
backward vs autograd, registration, determinism."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import layer_norm as ln_ops
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import device_programs
from kernel_pytorch.ops._common.partials import partial_slots
from kernel_pytorch.ops.layer_norm import layer_norm_bwd, layer_norm_fwd
from kernel_pytorch.reference.layer_norm import layer_norm_stats
from tests.grid import (
    DTYPES,
    ROW_SHAPES,
    Poisoned,
    compile_and_count_breaks,
    device_under_test,
    randn,
    strided_rows,
)
from tests.ops.conftest import assert_schedule_covers_tails, many_rows
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
EPS = 1e-5
AFFINE = [(True, True), (True, False), (False, False)]


def _params(cols, dtype, has_w, has_b, device=DEV):
    w = randn(cols, dtype=dtype, device=device, scale=0.5, offset=1.0) if has_w else None
    b = randn(cols, dtype=dtype, device=device, scale=0.5) if has_b else None
    return w, b


def _assert_backward(grads, dy, x, w, mean, rstd, has_b: bool) -> None:
    """(dx, dweight, dbias) from our backward against the reference's: dx by the tolerance table, the
    parameter gradients (None where absent) by the fp64-derived budget."""
    dx, dw, db = grads
    dx_ref, dw_ref, db_ref = R.layer_norm_backward(dy, x, w, mean, rstd, has_b)
    assert_close(dx, dx_ref, "dx")
    d64 = R.layer_norm_backward(
        dy.double(), x.double(), w.double() if w is not None else None, *layer_norm_stats(x.double(), EPS), has_b)
    for name, got, ref, ref64 in (("dweight", dw, dw_ref, d64[1]), ("dbias", db, db_ref, d64[2])):
        assert (got is None) == (ref is None), name
        if got is not None:
            assert_budget(got, ref, ref64, name)


@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_kernels_match_reference(lead, cols, dtype, has_w, has_b, row_path) -> None:
    # an offset mean checks that the variance is taken around the mean, not as E[x^2] - mean^2
    x = strided_rows(lead, cols, dtype, DEV) + 3.0
    w, b = _params(cols, dtype, has_w, has_b)
    dy = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        y, mean, rstd = layer_norm_fwd(x, w, b, EPS)
        dx, dw, db = layer_norm_bwd(dy, x, w, mean, rstd, has_b)
    assert_close(y, R.layer_norm(x, w, b, EPS), "y")
    ref_mean, ref_rstd = layer_norm_stats(x, EPS)
    assert_close(mean, ref_mean, "mean")
    assert_close(rstd, ref_rstd, "rstd")
    assert (dw is None) == (not has_w) and (db is None) == (not has_b)
    _assert_backward((dx, dw, db), dy, x, w, ref_mean, ref_rstd, has_b)


@pytest.mark.parametrize("scale,eps", [(1e-4, EPS), (1.0, 0.1)], ids=["rows_near_zero", "large_eps"])
def test_eps_inside_the_square_root(scale: float, eps: float, row_path) -> None:
    """Rows near zero (eps is most of var + eps) and a large eps: what tells rsqrt(var + eps) from
    rsqrt(var) + eps or 1 / (sqrt(var) + eps); unit rows with eps 1e-5 cannot."""
    x = randn(5, 33, device=DEV, scale=scale)
    w, b = _params(33, torch.float32, True, True)
    dy = randn(5, 33, device=DEV)
    y, mean, rstd = layer_norm_fwd(x, w, b, eps)
    x64 = x.double()
    assert_close(rstd, (1 / torch.sqrt(x64.var(-1, unbiased=False) + eps)).float(), "rstd")
    assert_close(y, R.layer_norm(x, w, b, eps), "y")
    grads = layer_norm_bwd(dy, x, w, mean, rstd, True)
    refs = R.layer_norm_backward(dy, x, w, *layer_norm_stats(x, eps), True)
    refs64 = R.layer_norm_backward(dy.double(), x64, w.double(), *layer_norm_stats(x64, eps), True)
    # every gradient is a reduction (dx over the row, amplified here by rstd ~ 1e4; dweight and dbias over
    # the rows): judged by the fp64-derived budget, as the GPU's fused multiply-adds reorder the rounding
    for name, got, ref, ref64 in zip(("dx", "dweight", "dbias"), grads, refs, refs64):
        assert_budget(got, ref, ref64, name)


def test_reference_backward_is_the_gradient_of_the_reference() -> None:
    x = randn(6, 40, dtype=torch.float64, offset=2.0).requires_grad_()
    w = randn(40, dtype=torch.float64, offset=1.0).requires_grad_()
    b = randn(40, dtype=torch.float64).requires_grad_()
    dy = randn(6, 40, dtype=torch.float64)
    gx, gw, gb = torch.autograd.grad(R.layer_norm(x, w, b, EPS), (x, w, b), dy)
    mean, rstd = layer_norm_stats(x.detach(), EPS)
    dx, dw, db = R.layer_norm_backward(dy, x.detach(), w.detach(), mean, rstd, True)
    torch.testing.assert_close(dx, gx)
    torch.testing.assert_close(dw, gw)
    torch.testing.assert_close(db, gb)


def test_reference_matches_torch_layer_norm() -> None:
    x = randn(5, 33, offset=1.0)
    w, b = _params(33, torch.float32, True, True, "cpu")
    assert_close(R.layer_norm(x, w, b, EPS), torch.nn.functional.layer_norm(x, (33,), w, b, EPS), "y")


def test_backward_is_bitwise_deterministic(row_path) -> None:
    x = randn(37, 48, dtype=torch.bfloat16, device=DEV)
    w, b = _params(48, torch.bfloat16, True, True)
    dy = randn(37, 48, dtype=torch.bfloat16, device=DEV)
    _, mean, rstd = layer_norm_fwd(x, w, b, EPS)
    first = layer_norm_bwd(dy, x, w, mean, rstd, True)
    second = layer_norm_bwd(dy, x, w, mean, rstd, True)
    assert all(torch.equal(a, c) for a, c in zip(first, second))


@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_backward_schedules_cover_tails(many_programs: str, has_w: bool, has_b: bool) -> None:
    """Several programs per launch, tiles and row groups cut short, each affine combination."""
    rows, cols = many_rows(), 37
    assert_schedule_covers_tails(many_programs, rows, cols, 2)
    x = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    w, b = _params(cols, torch.bfloat16, has_w, has_b)
    dy = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    _, mean, rstd = layer_norm_fwd(x, w, b, EPS)
    with Poisoned():
        grads = layer_norm_bwd(dy, x, w, mean, rstd, has_b)
    _assert_backward(grads, dy, x, w, mean, rstd, has_b)


def _paired_cases() -> list[tuple[str, int]]:
    """Row counts for the row-mode backward's partial slots on the device under test: at most one
    program per SM (unpaired), an odd count above that (the last program has no partner), and the
    full two programs per SM."""
    sms = device_programs(torch.device(DEV), 1)
    odd = sms + 1 if sms % 2 == 0 else sms + 2
    return [("unpaired", sms - 1), ("odd", odd), ("full", 6 * sms)]


@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize(("case", "rows"), _paired_cases(), ids=lambda v: str(v))
def test_paired_partials(case: str, rows: int, has_w: bool, has_b: bool, monkeypatch) -> None:
    """Programs beyond one per SM share partial rows in pairs: one slot per pair (the odd one out
    alone), gradients within the budget and bitwise-equal over repeated runs (a pair whose second
    program read the slot before the first had written it would differ, or be NaN under Poisoned)."""
    cols = 48
    tiling = tuning.current("norm").layer_norm.bwd_tiling
    assert tiling.programs_per_sm == 2 and tiling.tile == 1
    slots_seen: list[int] = []
    real_parts = ln_ops._parts

    def spy(n_bufs, n_rows, n_cols, like):
        slots_seen.append(n_rows)
        return real_parts(n_bufs, n_rows, n_cols, like)

    monkeypatch.setattr(ln_ops, "_parts", spy)
    x = randn(rows, cols, dtype=torch.bfloat16, device=DEV, offset=1.0)
    w, b = _params(cols, torch.bfloat16, has_w, has_b)
    dy = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    _, mean, rstd = layer_norm_fwd(x, w, b, EPS)
    runs = 50 if DEV == "cuda" else 2
    with Poisoned():
        results = [layer_norm_bwd(dy, x, w, mean, rstd, has_b) for _ in range(runs)]
    sms = device_programs(torch.device(DEV), 1)
    programs = min(rows, 2 * sms)
    expected = {"unpaired": programs, "odd": (programs + 1) // 2, "full": sms}[case]
    assert partial_slots(programs, torch.device(DEV)) == (expected, case != "unpaired")
    if has_w or has_b:
        assert slots_seen == [expected] * runs
    _assert_backward(results[0], dy, x, w, mean, rstd, has_b)
    for again in results[1:]:
        assert all(a is None if b is None else torch.equal(a, b) for a, b in zip(again, results[0]))


@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_opcheck(has_w: bool, has_b: bool) -> None:
    x = randn(3, 4, 32, device=DEV).requires_grad_()
    w, b = _params(32, torch.float32, has_w, has_b)
    if w is not None:
        w.requires_grad_()
    torch.library.opcheck(torch.ops.kernel_pytorch.layer_norm_fwd.default, (x, w, b, EPS))
    x = x.detach()
    w = w.detach() if w is not None else None
    _, mean, rstd = torch.ops.kernel_pytorch.layer_norm_fwd(x, w, b, EPS)
    dy = randn(3, 4, 32, device=DEV)
    torch.library.opcheck(torch.ops.kernel_pytorch.layer_norm_bwd.default, (dy, x, w, mean, rstd, has_b))


def test_compile_fullgraph_no_breaks() -> None:
    x = randn(4, 24, device=DEV).requires_grad_()
    w, b = _params(24, torch.float32, True, True)
    w.requires_grad_()
    dy = randn(4, 24, device=DEV)

    def f(x, w, b):
        return torch.ops.kernel_pytorch.layer_norm_fwd(x, w, b, EPS)[0].relu()

    eager = torch.autograd.grad(f(x, w, b), (x, w), dy)
    out, breaks = compile_and_count_breaks(f, x, w, b)
    assert breaks == 0
    for a, e in zip(torch.autograd.grad(out, (x, w), dy), eager):
        assert_close(a, e, "compiled grad")


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [1024, 4096, 16385, 262144])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_wide_rows(cols: int, dtype: torch.dtype) -> None:
    rows = 4 if cols > 16384 else 64
    x = strided_rows((rows,), cols, dtype, "cuda") + 2.0
    w, b = _params(cols, dtype, True, True, "cuda")
    dy = randn(rows, cols, dtype=dtype, device="cuda")
    with Poisoned():
        y, mean, rstd = layer_norm_fwd(x, w, b, EPS)
        dx, dw, db = layer_norm_bwd(dy, x, w, mean, rstd, True)
    assert_close(y, R.layer_norm(x, w, b, EPS), "y")
    _assert_backward((dx, dw, db), dy, x, w, *layer_norm_stats(x, EPS), True)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [64, 1024], ids=["unpaired", "paired"])
def test_cuda_compile_forward_and_backward(rows: int) -> None:
    """Under torch.compile the backward's two launches (row loop, partial sums) are traced as
    wrap_triton calls, with and without paired partial rows (more programs than SMs at 1024 rows);
    gradients match eager."""
    x = randn(rows, 4096, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w, b = (t.requires_grad_() for t in _params(4096, torch.bfloat16, True, True, "cuda"))
    dy = randn(rows, 4096, dtype=torch.bfloat16, device="cuda")

    def f(x, w, b):
        return torch.ops.kernel_pytorch.layer_norm_fwd(x, w, b, EPS)[0].relu()

    eager = torch.autograd.grad(f(x, w, b), (x, w, b), dy)
    out, breaks = compile_and_count_breaks(f, x, w, b)
    assert breaks == 0
    for a, e, what in zip(torch.autograd.grad(out, (x, w, b), dy), eager, ("dx", "dw", "db")):
        assert_close(a, e, f"compiled {what}")
