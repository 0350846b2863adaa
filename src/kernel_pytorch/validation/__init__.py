"""Correctness and measurement of optimizations: tree comparison and `validate_optimization`, on the one
tolerance table (`kernel_pytorch.tolerances`, in the shared layer: the analyser and the suites use it too).

    compare.py     leaf-by-leaf comparison of nested results under that rule
    runs.py        running the models: seeds' inputs, gradients, the fp64 copy
    checks.py      correctness, performance and memory, compilation, determinism
    parts.py       the parts' result types (JSON via to_dict); render.py their text summary
    report.py      ValidationResult, holding them
    options.py     ValidationOptions: what validate_optimization checks beside correctness
    validate.py    validate_optimization, the entry point
"""

from kernel_pytorch.tolerances import TOLERANCES, Comparison, Tolerance, compare, fp64_budget
from kernel_pytorch.validation.compare import TensorCheck, check_tensor, compare_named, compare_trees
from kernel_pytorch.validation.options import ValidationOptions
from kernel_pytorch.validation.validate import ValidationResult, validate_optimization

__all__ = [
    "TOLERANCES",
    "Comparison",
    "TensorCheck",
    "Tolerance",
    "ValidationOptions",
    "ValidationResult",
    "check_tensor",
    "compare",
    "compare_named",
    "compare_trees",
    "fp64_budget",
    "validate_optimization",
]
