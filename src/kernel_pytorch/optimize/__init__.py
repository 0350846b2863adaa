"""`optimize(model)`: module swaps and graph rewrites that apply the components and the analyser's
verified fixes to a model, validated against the original.

This layer sits above the components (`nn`, `functional`), the analyser and validation, and below the
CLI (docs/architecture.md). It walks `model.named_modules()` and replaces matching instances; it never
assigns to a third-party class or module attribute (STYLE rule 5).

    model, report = kernel_pytorch.optimize(model, {"input_ids": ids, "labels": ids})
    print(report)

Parts: `core.py` (the function), `options.py` (`CompileOptions`; validation takes
`kernel_pytorch.validation.ValidationOptions`), `rules/` (one file per component family), `swap.py`
(finding and swapping instances), `rewrite/` (hand-written patterns in forwards replaced by our ops,
`rewrite=True`), `compile.py` (regional compilation and the order of the compile
steps), `dynamic.py` (mark_dynamic from several shapes), `compile_steps.py` (channels_last, CUDA graphs,
TF32), `report.py` (what it returns).

`kernel_pytorch.optimize` is both this package and the function: importing a submodule makes the
package an attribute of `kernel_pytorch` under the same name, so the package itself is callable and
calls `optimize`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from kernel_pytorch.optimize.compile import INDUCTOR_OPTIONS
from kernel_pytorch.optimize.core import optimize, select_rules
from kernel_pytorch.optimize.dynamic import mark_dynamic_inputs
from kernel_pytorch.optimize.options import CompileOptions
from kernel_pytorch.optimize.report import Change, CompileStep, OptimizeReport, Rewrite
from kernel_pytorch.optimize.rules import Match, Rule, default_rules


class _CallablePackage(types.ModuleType):
    """`kernel_pytorch.optimize(model, ...)` works whether the name resolves to the function or to
    this package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["INDUCTOR_OPTIONS", "Change", "CompileOptions", "CompileStep", "Match", "OptimizeReport", "Rewrite", "Rule",
           "default_rules", "mark_dynamic_inputs", "optimize", "select_rules"]
