"""What `validate_optimization` returns: the `ValidationResult` holding one record per part
(correctness, timing, memory, compilation, determinism; the records are in `parts.py`), with
`to_dict()` for JSON.

Text rendering lives in `render.py`; these types only hold the numbers and say what passed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernel_pytorch.validation import parts
from kernel_pytorch.validation.render import render


@dataclass(frozen=True)
class ValidationResult:
    """What `validate_optimization` found. `passed` is the correctness verdict."""

    correctness_check: parts.CorrectnessReport
    performance_improvement: parts.PerformanceReport | None
    memory_efficiency: parts.MemoryReport | None
    compilation_success: parts.CompilationReport | None
    determinism: parts.DeterminismReport | None
    device: str

    @property
    def passed(self) -> bool:
        return self.correctness_check.passed

    def to_dict(self) -> dict[str, Any]:
        part = lambda p: p.to_dict() if p is not None else None
        return {
            "passed": self.passed,
            "device": self.device,
            "correctness_check": self.correctness_check.to_dict(),
            "performance_improvement": part(self.performance_improvement),
            "memory_efficiency": part(self.memory_efficiency),
            "compilation_success": part(self.compilation_success),
            "determinism": part(self.determinism),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def summary(self) -> str:
        """The result as text: one block per part, failures named (see `render.py`)."""
        return "\n".join(render(self.correctness_check, self.performance_improvement, self.memory_efficiency,
                                 self.compilation_success, self.determinism))

    def __str__(self) -> str:
        return self.summary()


__all__ = ["ValidationResult"]
