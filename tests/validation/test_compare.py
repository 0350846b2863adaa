"""Leaf-by-leaf comparison: the table per dtype, the fp64 budget fallback, structure and messages."""

from __future__ import annotations

import math
from collections import namedtuple

import pytest
import torch

from kernel_pytorch._tree import flatten, map_tensors
from kernel_pytorch.tolerances import TOLERANCES
from kernel_pytorch.validation.compare import check_tensor, compare_named, compare_trees
from tests.grid import DTYPES, randn


@pytest.mark.parametrize("dtype", (*DTYPES, torch.float64), ids=str)
def test_table_bounds_per_dtype(dtype: torch.dtype) -> None:
    """At |expected| = 1 the dtype's bound is atol + rtol: half of it passes, twice it fails. The
    perturbations are powers of two, so 1 + delta is exact in every dtype of the grid."""
    tol = TOLERANCES[dtype]
    bound = tol.atol + tol.rtol
    inside = 2.0 ** math.floor(math.log2(0.5 * bound))
    outside = 2.0 ** math.ceil(math.log2(2.0 * bound))
    base = torch.ones(5, dtype=dtype)
    ok = check_tensor("y", base + inside, base)
    bad = check_tensor("y", base + outside, base)
    assert ok.passed, ok.message()
    assert not bad.passed
    assert bad.allowed == f"atol {tol.atol:g} + rtol {tol.rtol:g}"
    assert bad.max_abs_err == pytest.approx(outside)


def test_failure_message_names_leaf_size_and_index() -> None:
    expected = randn(4, 6)
    actual = expected.clone()
    actual[2, 5] += 0.75
    check = check_tensor("output['logits']", actual, expected)
    assert not check.passed
    assert check.worst_index == (2, 5)
    assert check.max_abs_err == pytest.approx(0.75, rel=1e-6)
    msg = check.message()
    assert "output['logits']" in msg and "MISMATCH" in msg and "(2, 5)" in msg and "0.75" in msg
    assert f"{float(actual[2, 5]):.6g}" in msg and f"{float(expected[2, 5]):.6g}" in msg


def test_shape_dtype_and_exact_checks() -> None:
    a = randn(3, 4)
    assert "shape" in check_tensor("x", a, randn(4, 3)).note
    assert not check_tensor("x", a, a.double()).passed
    ints = torch.arange(6).reshape(2, 3)
    other = ints.clone()
    other[1, 2] = 7
    c = check_tensor("ids", other, ints)
    assert not c.passed and c.method == "exact" and c.worst_index == (1, 2)
    assert check_tensor("ids", ints.clone(), ints).passed


def test_nan_never_passes_and_matching_infinities_do() -> None:
    e = torch.tensor([1.0, float("inf")])
    assert check_tensor("y", e.clone(), e).passed
    assert not check_tensor("y", torch.tensor([float("nan"), float("inf")]), e).passed


def test_fp64_budget_rescues_a_long_reduction_the_table_rejects() -> None:
    """bf16 sums over 4096 terms: a baseline rounding partial sums vs a candidate accumulating in fp32.
    They differ beyond the table near zero, but the candidate is closer to the fp64 truth."""
    torch.manual_seed(0)
    x = randn(64, 4096, dtype=torch.bfloat16)
    baseline = x.unflatten(-1, (64, -1)).sum(-1).sum(-1)
    candidate = x.float().sum(-1).to(torch.bfloat16)
    truth = x.double().sum(-1)
    assert not check_tensor("s", candidate, baseline).passed
    rescued = check_tensor("s", candidate, baseline, reference_hi=truth)
    assert rescued.passed and rescued.method == "fp64 budget", rescued.message()
    dropped = x[:, :-1].float().sum(-1).to(torch.bfloat16)  # a wrong reduction: one term missing
    wrong = check_tensor("s", dropped, baseline, reference_hi=truth)
    assert not wrong.passed and "fp64 budget also fails" in wrong.note


def test_a_reordered_sum_passes_by_the_tensors_scale_and_a_wrong_one_does_not() -> None:
    """Column sums over 4096 rows in fp32, sequentially vs by torch's own cascade: where a sum nearly
    cancels the two differ beyond the table, yet by far less than the table's tolerance of the largest
    sum. A scaled result, or one column off, fails."""
    x = randn(4096, 256)
    eager = x.sum(0)
    sequential = torch.zeros(256)
    for row in x:  # one add per row: the order a compiled loop may use
        sequential += row
    assert not check_tensor("s", sequential, eager).passed
    reordered = check_tensor("s", sequential, eager, reordered=True)
    assert reordered.passed and reordered.method == "reordered", reordered.message()
    tol = TOLERANCES[torch.float32]
    assert reordered.allowed.startswith(f"atol {tol.atol:g} + rtol {tol.rtol:g} x largest |expected|")
    scaled = check_tensor("s", eager * (1 + 1e-4), eager, reordered=True)
    assert not scaled.passed and "reordered sums' rounding also exceeded" in scaled.note
    one_off = eager.clone()
    one_off[7] += 10 * (tol.atol + tol.rtol * float(eager.abs().max()))
    bad = check_tensor("s", one_off, eager, reordered=True)
    assert not bad.passed and bad.worst_index == (7,)
    nan = check_tensor("s", torch.full_like(eager, float("nan")), eager, reordered=True)
    assert not nan.passed


def test_trees_are_compared_by_path() -> None:
    Out = namedtuple("Out", ["logits", "aux"])
    expected = {"a": randn(2, 3), "b": [randn(4), 5], "c": Out(randn(2), None)}
    actual = map_tensors(lambda t: t.clone(), expected)
    checks = compare_trees(actual, expected)
    names = [c.name for c in checks]
    assert names == ["output['a']", "output['b'][0]", "output['b'][1]", "output['c'].logits"]
    assert all(c.passed for c in checks)
    actual["b"][0] = actual["b"][0] + 1
    actual["extra"] = randn(1)
    del actual["a"]
    bad = {c.name: c for c in compare_trees(actual, expected) if not c.passed}
    assert set(bad) == {"output['a']", "output['b'][0]", "output['extra']"}
    assert "missing" in bad["output['a']"].note and "not in the baseline" in bad["output['extra']"].note


def test_named_comparison_flags_a_missing_gradient() -> None:
    g = randn(3)
    checks = compare_named({"grad(x)": None}, {"grad(x)": g})
    assert not checks[0].passed and "None" in checks[0].note


def test_flatten_names_dataclasses_and_lists() -> None:
    from dataclasses import dataclass

    @dataclass
    class Output:
        hidden: list[torch.Tensor]
        loss: torch.Tensor

    out = Output([torch.zeros(1), torch.ones(1)], torch.tensor(2.0))
    assert [n for n, _ in flatten(out)] == ["output.hidden[0]", "output.hidden[1]", "output.loss"]
    doubled = map_tensors(lambda t: t * 2, out)
    assert isinstance(doubled, Output) and float(doubled.loss) == 4.0
