"""Compare nested outputs or gradients leaf by leaf, with the numbers from `tolerances.py`.

The rule, per floating-point tensor (the same everywhere: validate_optimization, benchmark gates):

1. the table: `|actual - expected| <= atol + rtol * |expected|` for the dtype (`tolerances.compare`);
2. if that fails and a high-precision reference is available, the fp64-derived budget: the candidate's
   error against the reference may be at most `BUDGET_FACTOR` x the error of the baseline run in the
   same low precision (`tolerances.fp64_budget`). This is what long reductions (weight gradients
   summed over many rows, norms over wide rows) are judged by.

Integer and bool tensors must match exactly; shapes, dtypes and the tree structure must agree.
Every failure names the leaf (`output['logits']`, `grad(param 'norm.weight')`), the size of the error,
the index of the worst element and the two values there.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch._tree import flatten
from kernel_pytorch.tolerances import Comparison, compare, compare_reordered, fp64_budget, tolerance_for


@dataclass(frozen=True)
class TensorCheck:
    """Outcome for one named leaf."""

    name: str
    passed: bool
    method: str  # "table", "fp64 budget", "reordered", "exact", "structure" or "value"
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    worst_index: tuple[int, ...] = ()
    actual_value: float | None = None  # at worst_index
    expected_value: float | None = None
    allowed: str = ""
    shape: tuple[int, ...] = ()
    dtype: str = ""
    note: str = ""

    def message(self) -> str:
        """One line: name, verdict, how far off and where."""
        verdict = "ok" if self.passed else "MISMATCH"
        if self.method in ("structure", "value"):
            return f"{self.name}: {verdict}: {self.note}"
        where = f"at index {self.worst_index}" if self.worst_index else "(scalar)"
        vals = ""
        if self.actual_value is not None and self.expected_value is not None:
            vals = f", actual {self.actual_value:.6g} vs expected {self.expected_value:.6g}"
        extra = f"; {self.note}" if self.note else ""
        return (
            f"{self.name}: {verdict} [{self.method}]: max abs err {self.max_abs_err:.3g}, "
            f"max rel err {self.max_rel_err:.3g}, worst {where}{vals}; allowed {self.allowed}{extra}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst_index"] = list(self.worst_index)
        d["shape"] = list(self.shape)
        d["message"] = self.message()
        return d


def _value_at(t: Tensor, index: tuple[int, ...]) -> float | None:
    if t.dim() == 0:
        return float(t.detach().double().item())
    if len(index) != t.dim():
        return None
    return float(t.detach()[index].double().item())


def _real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _table_dtype(t: Tensor) -> torch.dtype:
    """Which table row judges a tensor: complex types use their real component's row."""
    if t.is_complex():
        return torch.float32 if t.dtype == torch.complex64 else torch.float64
    return t.dtype


def _from_comparison(name: str, c: Comparison, method: str, actual: Tensor, expected: Tensor, note: str = ""):
    return TensorCheck(
        name=name,
        passed=c.passed,
        method=method,
        max_abs_err=c.max_abs_err,
        max_rel_err=c.max_rel_err,
        worst_index=c.worst_index,
        actual_value=_value_at(actual, c.worst_index) if c.worst_index or actual.dim() == 0 else None,
        expected_value=_value_at(expected, c.worst_index) if c.worst_index or expected.dim() == 0 else None,
        allowed=c.allowed,
        shape=tuple(actual.shape),
        dtype=str(actual.dtype).removeprefix("torch."),
        note=("non-finite values differ; " + note).rstrip("; ") if c.nonfinite_mismatch else note,
    )


def check_tensor(
    name: str,
    actual: Tensor,
    expected: Tensor,
    *,
    baseline_lowp: Tensor | None = None,
    reference_hi: Tensor | None = None,
    reordered: bool = False,
) -> TensorCheck:
    """Judge one tensor by the module's rule (table, then fp64-derived budget when given).

    Args:
        name: how the report names this leaf.
        actual: the candidate's tensor, any shape.
        expected: the baseline's tensor of the same shape and dtype (the table's reference).
        baseline_lowp: the baseline's tensor in the same low precision (for the budget); defaults
            to `expected` when `reference_hi` is given.
        reference_hi: the same quantity computed in higher precision (fp64, or fp32 for bf16/fp16
            work); enables the budget.
        reordered: `actual` is `expected`'s own computation with its sums reordered (compiled vs
            eager): a tensor failing the table and the budget may still pass `compare_reordered`.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        return TensorCheck(name, False, "structure", shape=tuple(actual.shape), dtype=str(actual.dtype),
                           note=f"shape {tuple(actual.shape)} but expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return TensorCheck(name, False, "structure", shape=tuple(actual.shape), dtype=str(actual.dtype),
                           note=f"dtype {actual.dtype} but expected {expected.dtype}")
    if not (actual.is_floating_point() or actual.is_complex()):
        a, e = actual.detach().cpu(), expected.detach().cpu()
        diff = a != e
        passed = not bool(diff.any())
        index: tuple[int, ...] = ()
        if not passed and a.dim() > 0:
            index = tuple(int(i) for i in diff.nonzero()[0])
        max_abs = 0.0 if passed else float((a.double() - e.double()).abs().max())
        return TensorCheck(
            name, passed, "exact", max_abs_err=max_abs, worst_index=index,
            actual_value=_value_at(a, index) if index or a.dim() == 0 else None,
            expected_value=_value_at(e, index) if index or e.dim() == 0 else None,
            allowed="exact equality", shape=tuple(a.shape), dtype=str(a.dtype).removeprefix("torch."),
        )
    a, e = _real(actual), _real(expected)
    table = compare(a, e, dtype=_table_dtype(actual))
    if table.passed or (reference_hi is None and not reordered):
        return _from_comparison(name, table, "table", a, e)
    notes: list[str] = []
    if reference_hi is not None:
        base = _real(baseline_lowp if baseline_lowp is not None else expected)
        hi = _real(reference_hi)
        if tuple(hi.shape) != tuple(a.shape):
            notes.append("high-precision reference has another shape")
        else:
            budget = fp64_budget(a, base, hi)
            if budget.passed:
                return _from_comparison(
                    name, budget, "fp64 budget", a, hi,
                    note=f"table alone fails (max abs err {table.max_abs_err:.3g} vs baseline)",
                )
            notes.append(f"fp64 budget also fails: err vs high precision {budget.max_abs_err:.3g}, "
                         f"allowed {budget.allowed}")
    if reordered:
        loose = compare_reordered(a, e, dtype=_table_dtype(actual))
        if loose.passed:
            return _from_comparison(
                name, loose, "reordered", a, e,
                note=f"table alone fails (max abs err {table.max_abs_err:.3g} at index {table.worst_index}); "
                "within reordered sums' rounding",
            )
        notes.append(f"reordered sums' rounding also exceeded: allowed {loose.allowed}")
    # report the table's view (errors against the baseline, which users compare by eye) and the rest
    return _from_comparison(name, table, "table", a, e, note="; ".join(notes))


def _check_value(name: str, actual: Any, expected: Any) -> TensorCheck:
    if isinstance(actual, float) and isinstance(expected, float):
        same = math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-9) or (
            math.isnan(actual) and math.isnan(expected)
        )
    else:
        same = actual == expected if type(actual) is type(expected) else False
    return TensorCheck(name, bool(same), "value", note=f"{actual!r} vs expected {expected!r}")


def compare_named(
    actual: dict[str, Any],
    expected: dict[str, Any],
    *,
    baseline_lowp: dict[str, Any] | None = None,
    reference_hi: dict[str, Any] | None = None,
    reordered: bool = False,
) -> list[TensorCheck]:
    """Check named leaves (e.g. gradients keyed by what they are the gradient of) against each other.

    Leaves present on one side only fail as "structure"; a None on both sides is skipped. `reordered`
    is passed to `check_tensor` (compiled against eager).
    """
    base = baseline_lowp or {}
    hi = reference_hi or {}
    checks: list[TensorCheck] = []
    for name, exp in expected.items():
        if name not in actual:
            checks.append(TensorCheck(name, False, "structure", note="missing from the candidate's result"))
            continue
        act = actual[name]
        if isinstance(exp, Tensor) and isinstance(act, Tensor):
            b, h = base.get(name), hi.get(name)
            checks.append(check_tensor(
                name, act, exp,
                baseline_lowp=b if isinstance(b, Tensor) else None,
                reference_hi=h if isinstance(h, Tensor) else None,
                reordered=reordered,
            ))
        elif isinstance(exp, Tensor) or isinstance(act, Tensor):
            what = lambda v: "no value (None)" if v is None else type(v).__name__
            checks.append(TensorCheck(name, False, "structure",
                                      note=f"got {what(act)} but expected {what(exp)}"))
        elif exp is None and act is None:
            continue
        else:
            checks.append(_check_value(name, act, exp))
    for name in actual:
        if name not in expected:
            checks.append(TensorCheck(name, False, "structure", note="not in the baseline's result"))
    return checks


def compare_trees(
    actual: Any,
    expected: Any,
    *,
    prefix: str = "output",
    baseline_lowp: Any = None,
    reference_hi: Any = None,
) -> list[TensorCheck]:
    """Check every leaf of `actual` against the same-named leaf of `expected`.

    Args:
        actual: nested tensors (tuples, lists, dicts, dataclasses) from the candidate.
        expected: the same structure from the baseline.
        prefix: root name used in the leaf names.
        baseline_lowp: optional tree like `expected` for the budget (defaults to `expected`).
        reference_hi: optional tree of the same quantities in higher precision.
    Returns:
        One `TensorCheck` per leaf (missing or extra leaves fail as "structure").
    """
    return compare_named(
        dict(flatten(actual, prefix)),
        dict(flatten(expected, prefix)),
        baseline_lowp=dict(flatten(baseline_lowp, prefix)) if baseline_lowp is not None else None,
        reference_hi=dict(flatten(reference_hi, prefix)) if reference_hi is not None else None,
    )


def tolerance_note(dtype: torch.dtype) -> str:
    """The table's entry for `dtype` as text (for reports)."""
    tol = tolerance_for(dtype)
    return f"{str(dtype).removeprefix('torch.')}: atol {tol.atol:g}, rtol {tol.rtol:g}"


def all_passed(checks: list[TensorCheck]) -> bool:
    return all(c.passed for c in checks)


def failures(checks: list[TensorCheck]) -> list[TensorCheck]:
    return [c for c in checks if not c.passed]


__all__ = [
    "TensorCheck",
    "all_passed",
    "check_tensor",
    "compare_named",
    "compare_trees",
    "failures",
    "tolerance_note",
]
