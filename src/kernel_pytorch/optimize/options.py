"""`CompileOptions`: how `optimize()` compiles each repeated block (`nn.Module.compile`), as one frozen
object, also what `kernel_pytorch.save` records in the manifest and `kernel_pytorch.load` compiles with.

    optimize(model, inputs, compile=True, compile_options=CompileOptions(backend="eager"))

The fields are `torch.compile`'s; a field left at its default is not passed, so torch's own default
applies. A field that does not exist, or a value of the wrong kind, raises naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

# torch.compile's modes ("default" is None's spelling)
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class CompileOptions:
    """Keyword arguments for each compiled block's `nn.Module.compile`.

    Fields:
        backend: a registered backend's name ("inductor", "aot_eager", "eager") or a backend callable
            (a callable cannot be saved in a manifest).
        mode: None (torch's default) or one of `MODES`; "reduce-overhead" and "max-autotune" capture
            CUDA graphs for calls with gradients only (`compile_steps.compile_blocks`). Not with `options`.
        dynamic: None (torch decides), True (dynamic shapes from the start) or False (specialise).
        fullgraph: raise at a graph break instead of splitting the block's graph.
        options: Inductor's options (`kernel_pytorch.optimize.INDUCTOR_OPTIONS`, ...). Not with `mode`.
    """

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not (callable(self.backend) or (isinstance(self.backend, str) and self.backend)):
            raise TypeError(f"CompileOptions.backend must be a backend name or callable (got {self.backend!r})")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"CompileOptions.mode must be None or one of {', '.join(map(repr, MODES))} "
                             f"(got {self.mode!r})")
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise TypeError(f"CompileOptions.dynamic must be None, True or False (got {self.dynamic!r})")
        if not isinstance(self.fullgraph, bool):
            raise TypeError(f"CompileOptions.fullgraph must be a bool (got {self.fullgraph!r})")
        if self.options is not None and not isinstance(self.options, Mapping):
            raise TypeError(f"CompileOptions.options must be a mapping of Inductor options (got {self.options!r})")
        if self.mode is not None and self.options:
            raise ValueError("CompileOptions takes mode or options, not both (as torch.compile does)")
        if self.options is not None:  # a private read-only copy: torch.compile keeps the dict it is given
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def kwargs(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as `nn.Module.compile` keywords (JSON-able when
        the backend is a name: the manifest's `compile.options`)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str = "compile options") -> CompileOptions:
        """The options a manifest records (`kwargs()`'s output); an unknown key raises naming it."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in values if k not in known]
        if unknown:
            raise TypeError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                            f"CompileOptions fields: {', '.join(known)}")
        return cls(**values)


def typed(value: Any, cls: type, argument: str) -> Any:
    """`value` when it is a `cls` or None; a dict (the untyped form) or anything else raises a TypeError
    naming `argument` and, for a dict, the `cls(...)` call that says the same."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        spelled = ", ".join(f"{k}={v!r}" for k, v in value.items())
        package = cls.__module__.rsplit(".", 1)[0]  # kernel_pytorch.optimize, kernel_pytorch.validation
        raise TypeError(f"{argument} takes a {package}.{cls.__name__}, not a dict: "
                        f"{argument}={cls.__name__}({spelled})")
    raise TypeError(f"{argument} takes a {cls.__name__} (got {type(value).__name__})")


__all__ = ["MODES", "CompileOptions", "typed"]
