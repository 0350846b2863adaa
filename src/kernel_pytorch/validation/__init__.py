"""Correctness and measurement of optimizations: the tolerance table, tree comparison, and
`validate_optimization`."""

from kernel_pytorch.validation.compare import TensorCheck, check_tensor, compare_named, compare_trees
from kernel_pytorch.validation.tolerances import TOLERANCES, Comparison, Tolerance, compare, fp64_budget
from kernel_pytorch.validation.validate import ValidationResult, validate_optimization

__all__ = [
    "TOLERANCES",
    "Comparison",
    "TensorCheck",
    "Tolerance",
    "ValidationResult",
    "check_tensor",
    "compare",
    "compare_named",
    "compare_trees",
    "fp64_budget",
    "validate_optimization",
]
