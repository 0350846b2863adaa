"""The records of `validate_optimization`'s parts (correctness, timing, memory, compilation,
determinism), frozen, each with `to_dict()` for JSON. `report.py` holds them in `ValidationResult`;
`render.py` writes their text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernel_pytorch._tree import Recorded
from kernel_pytorch.benchmark.timer import Timing
from kernel_pytorch.tolerances import BUDGET_FACTOR, TOLERANCES
from kernel_pytorch.validation.compare import TensorCheck


@dataclass(frozen=True)
class CorrectnessReport:
    """Per-tensor checks of the optimized module against the original, for every seed."""

    passed: bool
    seeds: list[int]
    checks: dict[int, list[TensorCheck]]  # seed -> checks
    reference: str  # what the budget compares against, or why there is none
    gradients: str  # what was differentiated
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # seeds whose drawn inputs the original model could not run: they used the inputs as given
    given_inputs_seeds: list[int] = field(default_factory=list)

    def failures(self) -> list[tuple[int, TensorCheck]]:
        """(seed, check) of every failing tensor, seed by seed."""
        return [(s, c) for s, cs in self.checks.items() for c in cs if not c.passed]

    def worst_by_name(self) -> list[tuple[str, TensorCheck, bool]]:
        """Per leaf name: the check with the largest abs error over the seeds, and whether all passed."""
        out: dict[str, tuple[TensorCheck, bool]] = {}
        for cs in self.checks.values():
            for c in cs:
                prev = out.get(c.name)
                if prev is None:
                    out[c.name] = (c, c.passed)
                    continue
                worst = c if (not c.passed and prev[0].passed) or c.max_abs_err > prev[0].max_abs_err else prev[0]
                out[c.name] = (worst, prev[1] and c.passed)
        return [(n, c, ok) for n, (c, ok) in out.items()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seeds": self.seeds,
            "reference": self.reference,
            "gradients": self.gradients,
            "tolerances": {str(d).removeprefix("torch."): [t.atol, t.rtol] for d, t in TOLERANCES.items()},
            "budget_factor": BUDGET_FACTOR,
            "checks": [{"seed": s, "checks": [c.to_dict() for c in cs]} for s, cs in self.checks.items()],
            "failures": [f"seed {s}: {c.message()}" for s, c in self.failures()],
            "errors": self.errors,
            "notes": self.notes,
            "given_inputs_seeds": self.given_inputs_seeds,
        }


@dataclass(frozen=True)
class PassComparison(Recorded):
    """Original vs optimized timing for one pass; speedup = original / optimized (>1 is faster)."""

    pass_name: str
    original: Timing | None
    optimized: Timing | None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class PerformanceReport(Recorded):
    """Timings of both models per pass ("fwd", "fwd+bwd") on one device."""

    device: str
    passes: dict[str, PassComparison]


@dataclass(frozen=True)
class PassMemory(Recorded):
    """Peak memory of one pass of each model; ratio = optimized / original (<1 uses less)."""

    pass_name: str
    original_bytes: int | None
    optimized_bytes: int | None
    ratio: float | None
    saved_bytes: int | None


@dataclass(frozen=True)
class MemoryReport(Recorded):
    """Peak memory of both models per pass, and how it was measured."""

    method: str  # how the peak was measured on this device
    passes: dict[str, PassMemory]


@dataclass(frozen=True)
class CompilationReport(Recorded):
    """torch.compile(optimized, fullgraph=True) on the example inputs."""

    success: bool
    backend: str
    graph_count: int | None
    graph_break_count: int | None
    break_reasons: list[str]
    compile_time_s: float | None  # wall time of the first compiled call: compile + one run
    error: str | None
    matches_eager: bool | None  # compiled results vs the optimized module run eagerly
    mismatch: str | None = None
    break_locations: list[str | None] = field(default_factory=list)  # file:line of each break_reasons entry


@dataclass(frozen=True)
class DeterminismReport(Recorded):
    """Two runs of the optimized module on the same inputs, compared bit for bit."""

    deterministic: bool
    tensors_checked: int
    differing: list[str]  # "name: max abs diff X"


__all__ = [
    "CompilationReport",
    "CorrectnessReport",
    "DeterminismReport",
    "MemoryReport",
    "PassComparison",
    "PassMemory",
    "PerformanceReport",
]
