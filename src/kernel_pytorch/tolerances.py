"""The one tolerance table, and the fp64-derived budget for long reductions.

Every comparison in kernel_pytorch (tests, `validate_optimization`, benchmarks' correctness gate) takes
its numbers from here. Two kinds of check:

* `TOLERANCES[dtype]`: elementwise `|a - b| <= atol + rtol * |b|` against a reference computed in fp32
  and rounded to `dtype`. Right for outputs whose every element is a short computation.
* `compare_reordered`: the same computation with its sums in another order (a compiled graph against
  eager): the table's entry applied to the tensor's largest magnitude rather than to each element.
* `compare_matmul`: matmul outputs (K-term dot products summed in fp32) against the same products
  summed in another order, e.g. a quantized-matmul kernel against its dequantize-then-matmul reference:
  the table's entry for the output's rounding plus fp32's worst-case summation error on the terms'
  magnitudes (`matmul_sum_bound`).
* `fp64_budget`: for long reductions (norms over wide rows, gradients that sum over rows, cross-entropy
  over big vocabularies) the fair yardstick is PyTorch itself: the candidate's worst error against an
  fp64 reference may be at most `factor` times the worst error of PyTorch's own eager op run in the
  same low precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """Absolute and relative tolerance for one dtype."""

    atol: float
    rtol: float


# fp32: reductions reorder sums, so a few ulps over ~1e4 terms; bf16/fp16: one rounding of the
# output (half an ulp each side) plus reordering inside fp32 accumulation.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(atol=1e-10, rtol=1e-9),
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=1.6e-2),
    torch.float16: Tolerance(atol=2e-3, rtol=2e-3),
}

# fp32's unit roundoff: every kernel accumulates its sums in fp32.
FP32_UNIT_ROUNDOFF = 2.0 ** -24

# How much worse than PyTorch's own low-precision op a kernel may be on a long reduction.
BUDGET_FACTOR = 2.0


def tolerance_for(dtype: torch.dtype) -> Tolerance:
    """The table's entry for `dtype`; raises KeyError with the known dtypes for anything else."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in TOLERANCES)
        raise KeyError(f"no tolerance for {dtype}; the table covers {known}") from None


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing `actual` with `expected` (both reduced to float64 for the arithmetic)."""

    passed: bool
    max_abs_err: float
    max_rel_err: float
    worst_index: tuple[int, ...]
    allowed: str
    nonfinite_mismatch: bool = False

    def message(self, name: str = "tensor") -> str:
        where = "non-finite values differ" if self.nonfinite_mismatch else f"worst at {self.worst_index}"
        verdict = "ok" if self.passed else "MISMATCH"
        return (
            f"{name}: {verdict}: max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g} "
            f"({where}); allowed {self.allowed}"
        )


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: actual {tuple(a.shape)} vs expected {tuple(e.shape)}")
    fin_a, fin_e = torch.isfinite(a), torch.isfinite(e)
    # NaN never passes; +-inf must match exactly
    nonfinite_mismatch = bool((fin_a != fin_e).any()) or bool(torch.isnan(a).any())
    if not nonfinite_mismatch and not bool(fin_e.all()):
        nonfinite_mismatch = bool((a[~fin_e] != e[~fin_e]).any())
    both = fin_a & fin_e
    diff = torch.where(both, (a - e).abs(), torch.zeros_like(a))
    return diff, e.abs(), nonfinite_mismatch


def _worst(values: torch.Tensor) -> tuple[int, ...]:
    if values.numel() == 0:
        return ()
    flat = int(torch.argmax(values).item())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), values.shape))


def _judged(diff: torch.Tensor, scale: torch.Tensor, nonfinite: bool, bound: torch.Tensor | float,
            allowed: str) -> Comparison:
    """The verdict on `_errors`' (diff, scale, nonfinite) under `bound`, a tensor of diff's shape (elementwise)
    or one number: passed when every diff is within its bound and no non-finite value differs; the worst
    index is where diff most exceeds its bound; `allowed` says what the bound was."""
    excess = diff - bound
    rel = diff / scale.clamp_min(torch.finfo(torch.float64).tiny)
    return Comparison(
        passed=not nonfinite and bool((excess <= 0).all()),
        max_abs_err=float(diff.max()) if diff.numel() else 0.0,
        max_rel_err=float(rel.max()) if rel.numel() else 0.0,
        worst_index=_worst(excess),
        allowed=allowed,
        nonfinite_mismatch=nonfinite,
    )


def compare(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None
) -> Comparison:
    """Elementwise check of `actual` against `expected` under the table's tolerance for `dtype`.

    Args:
        actual: tensor under test, any shape.
        expected: reference of the same shape (typically fp32 math rounded to `dtype`).
        dtype: whose tolerance applies; defaults to `actual.dtype`.
    """
    tol = tolerance_for(dtype or actual.dtype)
    diff, scale, nonfinite = _errors(actual, expected)
    return _judged(diff, scale, nonfinite, tol.atol + tol.rtol * scale, f"atol {tol.atol:g} + rtol {tol.rtol:g}")


def compare_reordered(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None
) -> Comparison:
    """Check of one computation against itself with its reductions in another order (compiled vs eager):
    `max|actual - expected| <= atol + rtol * max|expected|` with the table's entry for `dtype`.

    A reordered sum's rounding error scales with the magnitudes summed, not with the value they sum to,
    which cancellation can make arbitrarily small (a bias gradient summed over many rows); the tensor's
    largest magnitude stands in for that scale. Looser than `compare` wherever values cancel: for
    compiled against eager only, never for an optimization against the original.

    Args:
        actual: the reordered result (e.g. the compiled module's), any shape.
        expected: the same computation in its usual order, same shape.
        dtype: whose tolerance applies; defaults to `actual.dtype`.
    """
    tol = tolerance_for(dtype or actual.dtype)
    diff, scale, nonfinite = _errors(actual, expected)
    finite = scale[torch.isfinite(scale)]
    top = float(finite.max()) if finite.numel() else 0.0
    return _judged(diff, scale, nonfinite, tol.atol + tol.rtol * top,
                   f"atol {tol.atol:g} + rtol {tol.rtol:g} x largest |expected| {top:.3g}")


def matmul_sum_bound(k: int) -> float:
    """The factor on sum_k |a_k b_k| that bounds the difference of two fp32 summations of the same K
    products, whatever their order and blocking.

    Derivation: a sum of K terms in fp32, in any order or tree, is within gamma_K x sum |terms| of the
    exact sum, gamma_K = K u / (1 - K u) with u = 2^-24 (the standard bound on recursive and blocked
    summation). The quantized-matmul kernels form each product exactly (bf16/fp16 times an integer or
    an e4m3 value fits in fp32's 24 bits) and round at most twice more per term (a group's or row's
    scale, a split's partial sum), hence K + 2 roundings; each side of a comparison carries such an
    error, hence the factor 2. Returns 2 gamma_{K+2}."""
    n = (k + 2) * FP32_UNIT_ROUNDOFF
    return 2 * n / (1 - n)


def compare_matmul(
    actual: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, k: int, dtype: torch.dtype | None = None
) -> Comparison:
    """Check of matmul outputs y = sum_k a_k b_k (+ bias) against the same computation summed in
    another order in fp32 (a kernel against its reference):

        |actual - expected| <= atol + rtol |expected| + matmul_sum_bound(K) x magnitude

    elementwise, with atol/rtol the table's entry for `dtype` (both sides' rounding of the fp32 sum to
    the output dtype: at most one unit in the last place apart) and `magnitude` = |a| @ |b| (+ |bias|),
    the sum of the terms' magnitudes per output element, which bounds fp32's summation error however the
    terms cancel. A wrong weight, scale, zero point or nibble moves an output by a term's size, orders of
    magnitude past this bound.

    Args:
        actual: the kernel's output, any shape; expected: the reference's, same shape.
        magnitude: sum |terms| per element, same shape (fp32 or fp64).
        k: the terms per sum (the matmul's inner size).
        dtype: whose table entry applies; defaults to `actual.dtype`.
    """
    tol = tolerance_for(dtype or actual.dtype)
    diff, scale, nonfinite = _errors(actual, expected)
    sums = matmul_sum_bound(k) * magnitude.detach().to(torch.float64).cpu()
    return _judged(diff, scale, nonfinite, tol.atol + tol.rtol * scale + sums,
                   f"atol {tol.atol:g} + rtol {tol.rtol:g} + {matmul_sum_bound(k):.3g} x sum|terms| (K = {k})")


def fp64_budget(
    actual: torch.Tensor,
    eager_lowp: torch.Tensor,
    reference64: torch.Tensor,
    factor: float = BUDGET_FACTOR,
) -> Comparison:
    """Long-reduction check: err(actual) <= factor * err(PyTorch eager in the same dtype) + a floor.

    Args:
        actual: the kernel's result (any float dtype).
        eager_lowp: PyTorch's own eager op on the same inputs in the same low precision.
        reference64: the same computation in float64.
        factor: allowed multiple of eager's error.
    Returns:
        A Comparison whose errors are the candidate's, measured against `reference64`.
    """
    diff, scale, nonfinite = _errors(actual, reference64)
    eager_diff, _, _ = _errors(eager_lowp, reference64)
    # the floor keeps an exact eager op (err 0) from demanding bit-exactness of a reordered sum
    floor = float(torch.finfo(actual.dtype).eps) * float(scale.max()) if scale.numel() else 0.0
    budget = factor * float(eager_diff.max()) + floor if eager_diff.numel() else floor
    return _judged(diff, scale, nonfinite, budget,
                   f"{factor:g} x eager's max abs err {float(eager_diff.max()):.3g} + floor {floor:.3g}")
