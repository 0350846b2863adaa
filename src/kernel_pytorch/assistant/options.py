"""What an analysis measures and how (`AnalysisOptions`): the analysis context's options, apart so that
the runs the context delegates to (`profile`) read them without importing the context."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernel_pytorch.assistant.inputs import InputDims


@dataclass(frozen=True)
class AnalysisOptions:
    """What to analyse and how.

    Attributes:
        backend: torch.compile backend whose compile time is measured ("inductor" by default).
        mode: torch.compile mode for that compile (None, "reduce-overhead", "max-autotune", ...).
        dynamic: the `dynamic=` argument the model is meant to be compiled with (None: automatic).
        trace_backend: backend for the graph-break trace and the recompilation sweeps. Graph breaks and
            guards are decided by Dynamo before any backend runs, so the default "eager" gives the same
            breaks and recompilations as Inductor at a fraction of the time.
        shapes: sizes to sweep per dimension kind, e.g. {"batch": (1, 2, 4), "seq": (16, 32)}; kinds
            not given are derived from the example inputs.
        input_dims: which dims of which input are batch / seq / spatial, {input: {dim: kind}} with input
            a positional index, a keyword name, or (index or name, path) for a tensor inside an argument
            (`(0, "['x']")`); None infers them (dim 0 batch; dim 1 seq for (B, T) integer and (B, T, C)
            floating inputs; sequence-first inputs of recurrent layers).
        vary_scalars: also call with other values of Python int/float arguments.
        measure_compile_time: run the `backend` compile (the most expensive step).
        cold_cache: measure that compile with Inductor's on-disk caches bypassed (a first compile on a
            fresh machine) instead of as they are.
        optimizer: builds the optimizer the memory analysis steps once (`torch.optim.AdamW`, called with
            the trainable parameters); None: no step, its state estimated.
        kernel_profile: time and profile the eager and the compiled model (`runtime`: kernel efficiency,
            the compile verdict); the compiled forward is measured inside that compile.
        train: the model trains: also time and profile forward+backward (a compile of its own); None:
            when the module is in training mode.
        chrome_trace: write the profiled runs as one Chrome trace (Perfetto, chrome://tracing) here.
    """

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    trace_backend: str | Callable[..., Any] = "eager"
    shapes: Mapping[str, Sequence[int]] | None = None
    input_dims: InputDims | None = None
    vary_scalars: bool = True
    measure_compile_time: bool = True
    cold_cache: bool = False
    optimizer: Callable[..., Any] | None = None
    kernel_profile: bool = True
    train: bool | None = None
    chrome_trace: str | None = None

    def __post_init__(self) -> None:
        # sizes as given (lists, ranges) become tuples of ints; no sizes at all is "derive them"
        shapes = {k: tuple(int(s) for s in v) for k, v in self.shapes.items()} if self.shapes else None
        object.__setattr__(self, "shapes", shapes)


__all__ = ["AnalysisOptions"]
