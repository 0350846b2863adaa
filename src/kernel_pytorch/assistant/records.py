"""What the analysis runs record: frozen data the analyses read.

The shared runs of `AnalysisContext` return `RunResult` (eager, fullgraph), `TraceResult` (with
`GraphInfo` and its `NodeInfo`s, `BreakRecord`, `FailedFrame`) and `CompileProfile`; the recompilation
sweep calls `Variant`s, applies a `Fix` and returns a `SweepResult` of `CompileRecord`s.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel_pytorch.assistant.findings import Location
from kernel_pytorch.assistant.inputs import InputKey
from kernel_pytorch.assistant.locate import resumed_function

# ----- the shared runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One call on the example inputs that either went through or raised: the plain eager call, or
    the torch.compile(fullgraph=True) check (ok is then whether it traced as one graph)."""

    ok: bool
    error: BaseException | None
    seconds: float


@dataclass(frozen=True)
class NodeRef:
    """An FX node among another node's arguments, by its name in the graph."""

    name: str


@dataclass(frozen=True)
class NodeInfo:
    """One node of a captured FX graph as plain data: what it calls, on what, what it makes, and where.

    Attributes:
        name: the node's name in its graph (unique there).
        op: the FX opcode: "placeholder", "call_function", "call_method", "call_module", "get_attr", "output".
        target: the callee's short name ("mul", "silu", "scaled_dot_product_attention", "pow").
        args, kwargs: the arguments, other nodes as `NodeRef`, containers as tuples, dtypes and
            devices as text, sizes as ints (None where Dynamo left a size symbolic without a hint).
        shape: the example value's shape, None for non-tensors.
        itemsize: bytes per element of the example value (0 for non-tensors).
        dtype: the example value's dtype as text ("float32"), None for non-tensors.
        contiguous: whether the example value is contiguous (None for non-tensors).
        module_path: the innermost module of the model whose forward made the node
            ("model.layers.0.mlp"; "" the root module), None when Dynamo recorded none.
        module_type: that module's class name.
        stack: the user stack Dynamo recorded for the node (its `stack_trace`, outermost first).
    """

    name: str
    op: str
    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    shape: tuple[int | None, ...] | None = None
    itemsize: int = 0
    dtype: str | None = None
    contiguous: bool | None = None
    module_path: str | None = None
    module_type: str | None = None
    stack: str = ""

    @property
    def inputs(self) -> tuple[str, ...]:
        """Names of the nodes among the arguments, in argument order (nested containers flattened)."""
        out: list[str] = []
        _refs((self.args, tuple(self.kwargs.values())), out)
        return tuple(out)

    @property
    def numel(self) -> int | None:
        """Elements of the example value; None for non-tensors or unknown sizes."""
        if self.shape is None or any(s is None for s in self.shape):
            return None
        n = 1
        for s in self.shape:
            n *= int(s)  # type: ignore[arg-type]
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the example value (0 when unknown)."""
        return (self.numel or 0) * self.itemsize


def _refs(value: Any, out: list[str]) -> None:
    if isinstance(value, NodeRef):
        out.append(value.name)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _refs(v, out)


@dataclass(frozen=True)
class GraphInfo:
    """One graph Dynamo handed to the backend: its FX ops (call_function/method/module targets) and,
    where they could be read, its nodes with their example shapes, module paths and source stacks."""

    ops: tuple[str, ...]
    nodes: tuple[NodeInfo, ...] = ()


@dataclass(frozen=True)
class BreakRecord:
    """One graph break as Dynamo recorded it: its full reason text and the user stack."""

    reason: str
    frames: tuple[traceback.FrameSummary, ...]


@dataclass(frozen=True)
class FailedFrame:
    """A frame Dynamo gave up on (it then runs eagerly): torch's reason and the user line."""

    fail_type: str
    reason: str
    location: Location | None


@dataclass(frozen=True)
class TraceResult:
    """The graph-break trace: graphs, breaks, frames Dynamo gave up on, and the error if it raised."""

    graphs: tuple[GraphInfo, ...]
    breaks: tuple[BreakRecord, ...]
    failed_frames: tuple[FailedFrame, ...]
    error: BaseException | None
    seconds: float
    frames_total: int = 0


@dataclass(frozen=True)
class CompileProfile:
    """One cold compile with the real backend, as torch's own instrumentation saw it.

    Attributes:
        records: per-frame CompilationMetrics fields (microseconds and counts), one dict per frame
            (the fields in PROFILE_FIELDS).
        timed: seconds per `dynamo_timed` region (torch._dynamo.utils.compilation_time_metrics).
        counters: what torch._dynamo.utils.counters gained (cache hits and misses among them).
        first_call_s: wall time of the first compiled call (compile + one run).
        steady_call_s: wall time of the second call (no compile).
    """

    backend: str | Callable[..., Any]
    mode: str | None
    records: tuple[Mapping[str, Any], ...]
    timed: Mapping[str, float]
    counters: Mapping[str, Mapping[str, int]]
    first_call_s: float
    steady_call_s: float | None
    error: BaseException | None


PROFILE_FIELDS = (
    "compile_id",
    "co_name",
    "co_filename",
    "is_forward",
    "graph_op_count",
    "guard_count",
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "inductor_compile_time_s",
    "code_gen_time_s",
    "dynamo_cumulative_compile_time_us",
    "aot_autograd_cumulative_compile_time_us",
    "inductor_cumulative_compile_time_us",
    "inductor_code_gen_cumulative_compile_time_us",
    "triton_compile_time_us",
    "compile_time_autotune_time_us",
    "runtime_triton_autotune_time_us",
    "inductor_fx_local_cache_hit_count",
    "inductor_fx_local_cache_miss_count",
    "inductor_fx_remote_cache_hit_count",
    "inductor_fx_remote_cache_miss_count",
    "aotautograd_local_cache_hit_count",
    "aotautograd_local_cache_miss_count",
    "aotautograd_remote_cache_hit_count",
    "aotautograd_remote_cache_miss_count",
    "fail_type",
    "fail_reason",
)

# ----- the recompilation sweep --------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One call of the recompilation sweep.

    Attributes:
        label: what differs from the example, e.g. "batch=4" or "scale=0.5"; "example" for the example.
        kind: "example", "given" (one of the extra inputs), a dim kind ("batch", "seq", "spatial") or
            "scalar".
        args, kwargs: the inputs (templates: the sweep clones them before each call).
        varied: what differs from the example: the dim kind, or the scalar's parameter name; None for
            the example and the extra inputs.
        value: the value `varied` takes in this call (a size or a scalar value).
    """

    label: str
    kind: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    varied: str | None = None
    value: Any = None


@dataclass(frozen=True)
class Fix:
    """A change to how the model is compiled or called, applied in a verification sweep.

    Attributes:
        mark_dynamic: (input, dim) pairs passed to `torch._dynamo.mark_dynamic` before each call.
        tensorize: inputs that are Python scalars, passed as 0-dim tensors instead.
        dynamic: overrides the `dynamic=` of torch.compile when not None.
        recompile_limit: overrides Dynamo's per-frame compile limit when not None.
        duck_shape: overrides `torch.fx.experimental._config.use_duck_shape` when not None (False: equal
            sizes of the first call get symbols of their own instead of one shared symbol).
    """

    mark_dynamic: tuple[tuple[InputKey, int], ...] = ()
    tensorize: tuple[InputKey, ...] = ()
    dynamic: bool | None = None
    recompile_limit: int | None = None
    duck_shape: bool | None = None

    def is_empty(self) -> bool:
        return not (
            self.mark_dynamic
            or self.tensorize
            or self.dynamic is not None
            or self.recompile_limit
            or self.duck_shape is not None
        )


@dataclass(frozen=True)
class CompileRecord:
    """One Dynamo frame compile of a sweep: its id ("frame/attempt"), the call that triggered it, and
    the guard that failed (None for a first compile)."""

    compile_id: str
    variant: str
    recompile_reason: str | None
    fail_type: str | None = None
    fail_reason: str | None = None
    co_name: str | None = None

    @classmethod
    def of(cls, rec: Any, variant: str) -> CompileRecord:
        """One of Dynamo's CompilationMetrics as the compile record of the call `variant`."""
        return cls(
            compile_id=str(getattr(rec, "compile_id", "") or ""),
            variant=variant,
            recompile_reason=getattr(rec, "recompile_reason", None),
            fail_type=getattr(rec, "fail_type", None),
            fail_reason=getattr(rec, "fail_reason", None),
            co_name=getattr(rec, "co_name", None),
        )

    @property
    def after_graph_break(self) -> bool:
        """True for the code Dynamo resumes after a graph break (its inputs are the break's live locals)."""
        return resumed_function(self.co_name) is not None

    @property
    def frame(self) -> int | None:
        """Dynamo's index of the compiled frame (the F of compile id "F/A"); None when unknown."""
        m = re.search(r"(\d+)/(\d+)", self.compile_id)
        return int(m.group(1)) if m else None

    @property
    def is_recompile(self) -> bool:
        m = re.search(r"(\d+)/(\d+)", self.compile_id)
        return bool(self.recompile_reason) or (m is not None and int(m.group(2)) > 0)

    @property
    def hit_limit(self) -> bool:
        """True for the compile Dynamo refused because the frame reached its recompile limit."""
        text = (self.fail_reason or "").lower()
        return "recompile limit" in text or "recompile_limit" in text or "cache_size_limit" in text


@dataclass(frozen=True)
class SweepResult:
    """The outcome of calling the compiled model on every variant."""

    fix: Fix
    compiles: tuple[CompileRecord, ...]
    errors: tuple[tuple[str, str], ...]  # (variant label, short error) of calls that raised
    seconds: float

    @property
    def recompiles(self) -> tuple[CompileRecord, ...]:
        """Compiles after a frame's first; a compile refused at the recompile limit is not one."""
        return tuple(c for c in self.compiles if c.is_recompile and not c.hit_limit)
