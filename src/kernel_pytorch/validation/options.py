"""`ValidationOptions`: what `validate_optimization` checks and how long it times, as one frozen object.

    validate_optimization(original, optimized, inputs, check_performance=False)      # a field as a keyword
    validate_optimization(original, optimized, inputs, options=ValidationOptions(reference="none"))
    optimize(model, inputs, validate_options=ValidationOptions.correctness_only())   # optimize()'s default

Keyword arguments of `validate_optimization` are these fields; they override `options` field by field.
A field that does not exist, or a value of the wrong kind, raises naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Reference = Literal["auto", "fp64", "none"]
_REFERENCES = ("auto", "fp64", "none")


@dataclass(frozen=True)
class ValidationOptions:
    """What `validate_optimization` runs beside the correctness check, which always runs.

    Fields:
        check_gradients: also compare gradients of floating-point inputs and shared parameters,
            with a fixed random upstream gradient per output.
        reference: "auto" builds an fp64 copy of the original so a tensor failing the table may pass
            the fp64-derived budget; "fp64" requires it; "none" uses the table alone.
        check_performance: time both models (forward, and forward+backward with gradients) and
            measure their peak memory.
        check_compile: try torch.compile(optimized, fullgraph=True, backend=compile_backend).
        check_determinism: run `optimized` twice and compare bit for bit.
        compile_backend: "inductor", or "aot_eager"/"eager" for a cheaper tracing check.
        train: validate in training mode (dropout active: expect failures); default eval mode.
        warmup_ms, rep_ms: CUDA timing budget per measurement; cpu_min_run_time: the CPU's, in seconds.
    """

    check_gradients: bool = True
    reference: Reference = "auto"
    check_performance: bool = True
    check_compile: bool = True
    check_determinism: bool = True
    compile_backend: str = "inductor"
    train: bool = False
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    cpu_min_run_time: float = 0.2

    def __post_init__(self) -> None:
        for f in ("check_gradients", "check_performance", "check_compile", "check_determinism", "train"):
            if not isinstance(getattr(self, f), bool):
                raise TypeError(f"ValidationOptions.{f} must be a bool (got {getattr(self, f)!r})")
        if self.reference not in _REFERENCES:
            raise ValueError(f"ValidationOptions.reference must be one of {', '.join(map(repr, _REFERENCES))} "
                             f"(got {self.reference!r})")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise TypeError(f"ValidationOptions.compile_backend must be a backend name (got {self.compile_backend!r})")
        for f in ("warmup_ms", "rep_ms", "cpu_min_run_time"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ValidationOptions.{f} must be a positive number (got {value!r})")

    @classmethod
    def correctness_only(cls) -> ValidationOptions:
        """Outputs and gradients on every seed, nothing timed, compiled or rerun: what `optimize()`
        validates with unless given other options."""
        return cls(check_performance=False, check_compile=False, check_determinism=False)

    def replace(self, **changes: Any) -> ValidationOptions:
        """A copy with `changes` (field -> value); an unknown field raises naming it and the fields there are."""
        known = [f.name for f in dataclasses.fields(self)]
        unknown = [k for k in changes if k not in known]
        if unknown:
            raise TypeError(f"no ValidationOptions field {', '.join(map(repr, unknown))}; "
                            f"the fields: {', '.join(known)}")
        return dataclasses.replace(self, **changes)


__all__ = ["Reference", "ValidationOptions"]
