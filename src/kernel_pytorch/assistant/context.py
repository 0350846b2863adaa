"""The analysis context: the component, its example inputs and options, and the expensive runs the
analyses share (one eager run, one Dynamo trace, one backend compile, the recompilation sweeps), each
done once and cached.

Every compile here starts from `torch._dynamo.reset()` and ends with another, runs under
`torch.no_grad()` (the analysis is of inference), and changes Dynamo's config only through
`torch._dynamo.config.patch`, so the caller's state is restored afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import logging
import os
import re
import sysconfig
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._inductor.config
from torch import nn

from kernel_pytorch._env import recompile_limit_name
from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import move, split_inputs
from kernel_pytorch.assistant.findings import Location

InputKey = int | str  # position of a positional argument, or name of a keyword argument
InputDims = Mapping[InputKey, Mapping[int, str]]  # {input: {dim: kind}}


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
            a positional index or keyword name; None infers them (dim 0 batch; dim 1 seq for (B, T)
            integer and (B, T, C) floating inputs).
        vary_scalars: also call with other values of Python int/float arguments.
        measure_compile_time: run the `backend` compile (the most expensive step).
        cold_cache: measure that compile with Inductor's on-disk caches bypassed (a first compile on a
            fresh machine) instead of as they are.
    """

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    trace_backend: str | Callable[..., Any] = "eager"
    shapes: Mapping[str, tuple[int, ...]] | None = None
    input_dims: InputDims | None = None
    vary_scalars: bool = True
    measure_compile_time: bool = True
    cold_cache: bool = False


def backend_name(backend: str | Callable[..., Any]) -> str:
    """How reports name a torch.compile backend: a callable's `__name__`, else `str(backend)`."""
    return getattr(backend, "__name__", str(backend))


# ---------------------------------------------------------------------------------------------------
# Dynamo state
# ---------------------------------------------------------------------------------------------------


def _clear_compilation_metrics() -> None:
    clear = getattr(torch._dynamo.utils, "clear_compilation_metrics", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def _metrics_room(size: int) -> Iterator[None]:
    """Let Dynamo keep at least `size` compile records (its deque keeps the last 64) for a while."""
    utils = torch._dynamo.utils
    old = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
    setter = getattr(utils, "set_compilation_metrics_limit", None)
    if setter is None or old is None or old >= size:
        yield
        return
    setter(size)
    try:
        yield
    finally:
        setter(old)


def compilation_metrics() -> list[Any]:
    """Dynamo's per-frame compile records since the last clear (CompilationMetrics objects)."""
    get = getattr(torch._dynamo.utils, "get_compilation_metrics", None)
    return list(get()) if get is not None else []


@contextlib.contextmanager
def fresh_dynamo(**config: Any) -> Iterator[None]:
    """Reset Dynamo, patch its config with `config`, run in no_grad; reset again and restore after.

    Unknown config names are dropped, so callers can ask for options that only some torch versions have.
    Dynamo's own warnings are silenced meanwhile (see `_quiet_dynamo`).
    """
    known = {k: v for k, v in config.items() if hasattr(torch._dynamo.config, k)}
    torch._dynamo.reset()
    _clear_compilation_metrics()
    try:
        with torch._dynamo.config.patch(**known), torch.no_grad(), _quiet_dynamo():
            yield
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Silence Dynamo's log warnings and Python warnings about graph breaks and recompile limits for a
    while: the analysis provokes them on purpose and reports them as findings."""
    dynamo_log = logging.getLogger("torch._dynamo")
    level = dynamo_log.level
    dynamo_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"torch\._dynamo")
            yield
    finally:
        dynamo_log.setLevel(level)


@contextlib.contextmanager
def _inductor_caches(enabled: bool) -> Iterator[None]:
    """Leave Inductor's caches as configured, or bypass them all for the duration."""
    if enabled or not hasattr(torch._inductor.config, "force_disable_caches"):
        yield
        return
    with torch._inductor.config.patch(force_disable_caches=True):
        yield


def counters_snapshot() -> dict[str, dict[str, int]]:
    """A copy of `torch._dynamo.utils.counters` (global and never reset by torch; we diff it)."""
    return {k: {str(kk): int(vv) for kk, vv in v.items()} for k, v in torch._dynamo.utils.counters.items()}


def counters_diff(before: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """What the counters gained since `before`; empty groups are dropped."""
    out: dict[str, dict[str, int]] = {}
    for group, values in counters_snapshot().items():
        old = before.get(group, {})
        delta = {k: v - old.get(k, 0) for k, v in values.items() if v - old.get(k, 0)}
        if delta:
            out[group] = delta
    return out


# ---------------------------------------------------------------------------------------------------
# Locating user code
# ---------------------------------------------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


def is_user_file(filename: str) -> bool:
    """False for torch's own files, the standard library and synthetic frames (`<frozen ...>`)."""
    if not filename or filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if filename.startswith(_TORCH_DIR) or real.startswith(os.path.realpath(_TORCH_DIR)):
        return False
    return not any(real.startswith(d) and "site-packages" not in real[len(d) :] for d in _STDLIB_DIRS)


_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_\d+$")


def location_of(filename: str, lineno: int | None, function: str | None = None) -> Location | None:
    """A Location with the source line read back from the file; None without a line number."""
    if lineno is None:
        return None
    code = linecache.getline(filename, lineno).strip() or None
    if function:
        m = _RESUME.match(function)  # Dynamo names the code after a graph break "resume_in_<fn>"
        function = m.group(1) if m else function
    return Location(file=filename, line=int(lineno), function=function, code=code)


def user_location(frames: Sequence[traceback.FrameSummary]) -> Location | None:
    """The innermost frame of `frames` in the user's code, else the innermost frame at all."""
    for fr in reversed(frames):
        if is_user_file(fr.filename):
            return location_of(fr.filename, fr.lineno, fr.name)
    if frames:
        fr = frames[-1]
        return location_of(fr.filename, fr.lineno, fr.name)
    return None


_FROM_USER_CODE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def error_location(exc: BaseException) -> Location | None:
    """Where in the user's code `exc` arose: Dynamo's "from user code" frames, else the traceback."""
    frames = getattr(exc, "real_stack", None)
    if frames:
        loc = user_location(list(frames))
        if loc is not None and is_user_file(loc.file):
            return loc
    hits = [m for m in _FROM_USER_CODE.finditer(str(exc)) if is_user_file(m.group(1))]
    if hits:
        m = hits[-1]
        return location_of(m.group(1), int(m.group(2)), m.group(3))
    return user_location(traceback.extract_tb(exc.__traceback__)) if exc.__traceback__ else None


def definition_location(module: nn.Module) -> Location | None:
    """The `def forward` line of the module's class."""
    fn = type(module).forward
    try:
        file = inspect.getsourcefile(fn)
        _, line = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    return location_of(file, line, "forward") if file else None


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------


def prepare(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: str | torch.device | None,
    dtype: torch.dtype | None,
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Move the module and the tensors of the inputs to `device`; cast floating ones to `dtype`."""
    dev = torch.device(device) if device is not None else None
    if dev is not None or dtype is not None:
        module = module.to(device=dev, dtype=dtype) if dtype is not None else module.to(device=dev)
    return (module, *prepare_inputs(args, kwargs, dev, dtype))


def prepare_inputs(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: str | torch.device | None,
    dtype: torch.dtype | None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Move the tensors of the inputs to `device`; cast floating ones to `dtype` (the module is left alone)."""
    return move(args, device, dtype), move(kwargs, device, dtype)


def clone_inputs(value: Any) -> Any:
    """Fresh tensors with the same values: marks like mark_dynamic must not stick to the originals.

    Parameters stay Parameters: whether an argument is one is part of what Dynamo guards on.
    """
    if isinstance(value, nn.Parameter):
        return nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_inputs(v) for v in value)
    if isinstance(value, dict):
        return {k: clone_inputs(v) for k, v in value.items()}
    return value


def resize(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """`t` with dim `dim` cut or tiled to `size`, contiguous (a view's strides would add guards).

    Tiling repeats the existing values, so token ids stay inside the vocabulary and masks stay masks.
    """
    n = t.shape[dim]
    if size > n:
        reps = [1] * t.dim()
        reps[dim] = -(-size // n)
        t = t.repeat(*reps)
    return t.narrow(dim, 0, size).contiguous()


def infer_input_dims(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[InputKey, dict[int, str]]:
    """Guess which dims of the tensor inputs are the batch and the sequence.

    Batch: dim 0 of every tensor input whose size there is the most common dim-0 size among the
    inputs of 2 or more dims (of all inputs when every one is 1-D). Sequence: dim 1 of (B, T) integer
    or boolean inputs (token ids, masks) and (B, T, C) floating inputs. Images (B, C, H, W) get
    only a batch dim: which of their dims may vary depends on the model.
    """
    tensors: dict[InputKey, torch.Tensor] = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    tensors.update({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    multi = [t.shape[0] for t in tensors.values() if t.dim() >= 2]
    pool = multi or [t.shape[0] for t in tensors.values() if t.dim() >= 1]
    if not pool:
        return {}
    batch = max(set(pool), key=pool.count)
    out: dict[InputKey, dict[int, str]] = {}
    for key, t in tensors.items():
        dims: dict[int, str] = {}
        if t.dim() >= 1 and t.shape[0] == batch:
            dims[0] = "batch"
        integral = not t.is_floating_point() and not t.is_complex()
        if (t.dim() == 2 and integral) or (t.dim() == 3 and t.is_floating_point()):
            dims[1] = "seq"
        if dims:
            out[key] = dims
    return out


def default_sizes(kind: str, example: int) -> tuple[int, ...]:
    """Sizes to sweep for a dim of `kind` whose example size is `example`; the example size first.

    Batch grows (2x, 3x): serving varies it upward and any size works. Sequence and spatial sizes
    shrink (1/2, 3/4) so a model with a position table of the example length still accepts them.
    Size 1 is avoided unless it is the example: torch specialises dims of size 0 and 1 anyway.
    """
    if kind == "batch":
        sizes = [example, 2 * example, 3 * example]
    else:
        sizes = [example, example // 2, (3 * example) // 4]
    out: list[int] = []
    for s in sizes:
        if (s >= 2 or s == example) and s not in out:
            out.append(s)
    return tuple(out)


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
    """

    mark_dynamic: tuple[tuple[InputKey, int], ...] = ()
    tensorize: tuple[InputKey, ...] = ()
    dynamic: bool | None = None
    recompile_limit: int | None = None

    def is_empty(self) -> bool:
        return not (self.mark_dynamic or self.tensorize or self.dynamic is not None or self.recompile_limit)


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

    @property
    def after_graph_break(self) -> bool:
        """True for the code Dynamo resumes after a graph break (its inputs are the break's live locals)."""
        return bool(self.co_name and _RESUME.match(self.co_name))

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


@dataclass(frozen=True)
class GraphInfo:
    """One graph Dynamo handed to the backend: its FX ops (call_function/method/module targets)."""

    ops: tuple[str, ...]


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
class FullgraphResult:
    """Whether torch.compile(fullgraph=True) traced the model; the error if not."""

    ok: bool
    error: BaseException | None
    seconds: float


@dataclass(frozen=True)
class EagerResult:
    """The plain eager call on the example inputs."""

    ok: bool
    error: BaseException | None
    seconds: float


@dataclass(frozen=True)
class CompileProfile:
    """One cold compile with the real backend, as torch's own instrumentation saw it.

    Attributes:
        records: per-frame CompilationMetrics fields (microseconds and counts), one dict per frame.
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


_RECORD_FIELDS = (
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


class _GraphRecorder:
    """A torch.compile backend that records each graph's ops, then hands the graph to `inner`."""

    def __init__(self, inner: str | Callable[..., Any]) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.inner = lookup_backend(inner)
        self.graphs: list[GraphInfo] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        ops = tuple(
            _target_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
        )
        self.graphs.append(GraphInfo(ops))
        return self.inner(gm, example_inputs)


def _target_name(target: Any) -> str:
    """A short name for an FX node target: method and module names as they are, functions by name."""
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)


# ---------------------------------------------------------------------------------------------------
# The context
# ---------------------------------------------------------------------------------------------------


class AnalysisContext:
    """A component under analysis plus the shared, cached runs of it.

    Args:
        module: the component; called as `module(*args, **kwargs)`.
        args, kwargs: example inputs (already on the analysis device and dtype).
        options: see `AnalysisOptions`.
        name: how reports call the component.
        progress: called with a short line before each expensive step (for progress displays).
        extra_inputs: more calls for the recompilation sweep, each like the example inputs (a tuple of
            args or a dict of kwargs): inputs the model meets in use (other dtypes, masks, lengths).
    """

    def __init__(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        options: AnalysisOptions | None = None,
        name: str | None = None,
        progress: Callable[[str], None] | None = None,
        extra_inputs: Sequence[Any] = (),
    ) -> None:
        self.module = module
        self.extra_inputs = tuple(split_inputs(x) for x in extra_inputs)
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.options = options or AnalysisOptions()
        self.name = name or type(module).__name__
        self._progress = progress
        self._sweeps: dict[Fix, SweepResult] = {}

    def progress(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    @property
    def device(self) -> torch.device:
        """Where the module's parameters live (CPU for a parameterless module)."""
        for p in self.module.parameters():
            return p.device
        for t in [*self.args, *self.kwargs.values()]:
            if isinstance(t, torch.Tensor):
                return t.device
        return torch.device("cpu")

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """fn(*args, **kwargs) then wait for the device, so timings include the work."""
        out = fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return out

    def _call_example(self, fn: Callable[..., Any]) -> Any:
        """`call` on fresh copies of the example inputs."""
        return self.call(fn, clone_inputs(self.args), clone_inputs(self.kwargs))

    # ----- names ------------------------------------------------------------------------------------

    @functools.cached_property
    def input_names(self) -> dict[InputKey, str]:
        """{input key: the forward parameter it binds to}; positional ones beyond the signature keep
        Dynamo's `args[i]` name."""
        names: dict[InputKey, str] = {k: k for k in self.kwargs}
        try:
            params = list(inspect.signature(self.module.forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for i in range(len(self.args)):
            names[i] = positional[i].name if i < len(positional) else f"args[{i}]"
        return names

    def resolve_input(self, name: str) -> InputKey | None:
        """The input key a name in a guard refers to: "x", "L['x']", "args[0]", "kwargs['x']"."""
        m = re.fullmatch(r"L\['([^']+)'\](.*)", name)
        if m:
            name = m.group(1) + m.group(2)
        m = re.fullmatch(r"args\[(\d+)\]", name)
        if m and int(m.group(1)) < len(self.args):
            return int(m.group(1))
        m = re.fullmatch(r"kwargs\['([^']+)'\]", name)
        if m and m.group(1) in self.kwargs:
            return m.group(1)
        for key, pname in self.input_names.items():
            if pname == name:
                return key
        return None

    def input_value(self, key: InputKey) -> Any:
        return self.args[key] if isinstance(key, int) else self.kwargs[key]

    @staticmethod
    def _with_input(
        args: Sequence[Any], kwargs: Mapping[str, Any], key: InputKey, value: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """New (args, kwargs) with input `key` (a position or a keyword) set to `value`."""
        args, kwargs = list(args), dict(kwargs)
        if isinstance(key, int):
            args[key] = value
        else:
            kwargs[key] = value
        return tuple(args), kwargs

    # ----- shared runs ------------------------------------------------------------------------------

    @functools.cached_property
    def eager(self) -> EagerResult:
        """The example inputs through the plain module once (errors captured, not raised)."""
        self.progress("eager reference run")
        start = time.perf_counter()
        try:
            with torch.no_grad():
                self._call_example(self.module)
        except Exception as exc:
            return EagerResult(False, exc, time.perf_counter() - start)
        return EagerResult(True, None, time.perf_counter() - start)

    @functools.cached_property
    def trace(self) -> TraceResult:
        """Dynamo's trace of the example call with the cheap trace backend: graphs and breaks."""
        self.progress(f"tracing with Dynamo (backend={self.options.trace_backend})")
        recorder = _GraphRecorder(self.options.trace_backend)
        error: BaseException | None = None
        before = counters_snapshot()
        start = time.perf_counter()
        with fresh_dynamo():
            compiled = torch.compile(self.module, backend=recorder, dynamic=self.options.dynamic)
            try:
                self._call_example(compiled)
            except Exception as exc:
                error = exc
            # every break, including those before the first op (explain() misses those: no graph)
            reasons = list(getattr(torch._dynamo.utils, "graph_break_reasons", []))
            breaks = tuple(BreakRecord(r.reason, tuple(r.user_stack)) for r in reasons)
            failed = tuple(
                FailedFrame(
                    fail_type=str(rec.fail_type),
                    reason=str(getattr(rec, "fail_reason", "") or ""),
                    location=location_of(
                        str(getattr(rec, "fail_user_frame_filename", None) or ""),
                        getattr(rec, "fail_user_frame_lineno", None),
                        getattr(rec, "co_name", None),
                    ),
                )
                for rec in compilation_metrics()
                if getattr(rec, "fail_type", None)
            )
        frames = counters_diff(before).get("frames", {})
        return TraceResult(
            graphs=tuple(recorder.graphs),
            breaks=breaks,
            failed_frames=failed,
            error=error,
            seconds=time.perf_counter() - start,
            frames_total=frames.get("total", 0),
        )

    @functools.cached_property
    def fullgraph(self) -> FullgraphResult:
        """torch.compile(fullgraph=True) with the trace backend on the example call."""
        self.progress("checking fullgraph=True")
        start = time.perf_counter()
        with fresh_dynamo():
            compiled = torch.compile(
                self.module, backend=self.options.trace_backend, fullgraph=True, dynamic=self.options.dynamic
            )
            try:
                self._call_example(compiled)
            except Exception as exc:
                return FullgraphResult(False, exc, time.perf_counter() - start)
        return FullgraphResult(True, None, time.perf_counter() - start)

    @functools.cached_property
    def profile(self) -> CompileProfile:
        """One cold compile (fresh Dynamo state; on-disk caches as they are) with the real backend."""
        opts = self.options
        self.progress(f"compiling with backend={opts.backend}" + (f", mode={opts.mode}" if opts.mode else ""))
        before = counters_snapshot()
        error: BaseException | None = None
        steady: float | None = None
        with fresh_dynamo(), _inductor_caches(enabled=not opts.cold_cache):
            kwargs: dict[str, Any] = {"backend": opts.backend, "dynamic": opts.dynamic}
            if opts.mode is not None:
                kwargs["mode"] = opts.mode
            start = time.perf_counter()
            try:
                compiled = torch.compile(self.module, **kwargs)
                self._call_example(compiled)
            except Exception as exc:
                error = exc
            first = time.perf_counter() - start
            if error is None:
                try:
                    times = []
                    for _ in range(3):  # the best of three: the first calls may still warm up
                        start = time.perf_counter()
                        self._call_example(compiled)
                        times.append(time.perf_counter() - start)
                    steady = min(times)
                except Exception as exc:  # a later call may still recompile and fail
                    error = exc
            records = tuple({f: getattr(rec, f, None) for f in _RECORD_FIELDS} for rec in compilation_metrics())
            timed = {k: float(sum(v)) for k, v in torch._dynamo.utils.compilation_time_metrics.items()}
        return CompileProfile(
            backend=opts.backend,
            mode=opts.mode,
            records=records,
            timed=timed,
            counters=counters_diff(before),
            first_call_s=first,
            steady_call_s=steady,
            error=error,
        )

    # ----- the recompilation sweep ----------------------------------------------------------------

    @functools.cached_property
    def input_dims(self) -> dict[InputKey, dict[int, str]]:
        """{input: {dim: kind}} for the sweep: options.input_dims if given, else inferred."""
        given = self.options.input_dims
        if given is not None:
            return {k: dict(v) for k, v in given.items()}
        return infer_input_dims(self.args, self.kwargs)

    @functools.cached_property
    def sweep_sizes(self) -> dict[str, tuple[int, ...]]:
        """{dim kind: sizes}, the example size first; from options.shapes where given."""
        examples: dict[str, int] = {}
        for key, dims in self.input_dims.items():
            value = self.input_value(key)
            for dim, kind in dims.items():
                if isinstance(value, torch.Tensor) and dim < value.dim():
                    examples.setdefault(kind, int(value.shape[dim]))
        given = dict(self.options.shapes or {})
        out: dict[str, tuple[int, ...]] = {}
        for kind, example in examples.items():
            sizes = tuple(given[kind]) if kind in given else default_sizes(kind, example)
            out[kind] = (example, *[s for s in sizes if s != example])
        return out

    def _resized(self, kind: str, size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = self.args, dict(self.kwargs)
        for key, dims in self.input_dims.items():
            value = args[key] if isinstance(key, int) else kwargs[key]
            if not isinstance(value, torch.Tensor):
                continue
            for dim, k in dims.items():
                if k == kind and dim < value.dim():
                    value = resize(value, dim, size)
            args, kwargs = self._with_input(args, kwargs, key, value)
        return args, kwargs

    @functools.cached_property
    def variants(self) -> tuple[tuple[Variant, ...], tuple[tuple[str, str], ...]]:
        """(calls of the sweep, (label, error) of candidate calls the eager model rejected).

        One dim kind changes at a time, so each recompilation has a single cause; then each Python
        int/float argument takes two other values. Every candidate runs eagerly first: a size the
        model cannot take (a sequence longer than its position table) is left out, not blamed on
        torch.compile.
        """
        self.progress("preparing the shape sweep")
        candidates = [Variant("example", "example", self.args, self.kwargs)]
        for i, (args, kwargs) in enumerate(self.extra_inputs):
            candidates.append(Variant(f"extra_inputs[{i}]", "given", args, kwargs))
        for kind, sizes in self.sweep_sizes.items():
            for size in sizes[1:]:
                args, kwargs = self._resized(kind, size)
                candidates.append(Variant(f"{kind}={size}", kind, args, kwargs, varied=kind, value=size))
        if self.options.vary_scalars:
            for key, name in self.input_names.items():
                value = self.input_value(key)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                for new in _other_values(value):
                    args, kwargs = self._with_input(self.args, self.kwargs, key, new)
                    candidates.append(Variant(f"{name}={new}", "scalar", args, kwargs, varied=name, value=new))
        kept: list[Variant] = []
        rejected: list[tuple[str, str]] = []
        with torch.no_grad():
            for v in candidates:
                if v.kind == "example":
                    kept.append(v)
                    continue
                try:
                    self.call(self.module, clone_inputs(v.args), clone_inputs(v.kwargs))
                except Exception as exc:
                    rejected.append((v.label, short_error(exc, 200)))
                    continue
                kept.append(v)
        return tuple(kept), tuple(rejected)

    def apply_fix(self, fix: Fix, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """Fresh copies of the inputs with `fix` applied (scalars as tensors, dims marked dynamic)."""
        args, kwargs = tuple(clone_inputs(args)), dict(clone_inputs(kwargs))

        def get(key: InputKey) -> Any:
            return args[key] if isinstance(key, int) else kwargs.get(key)

        for key in fix.tensorize:
            value = get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                args, kwargs = self._with_input(args, kwargs, key, torch.tensor(value, device=self.device))
        for key, dim in fix.mark_dynamic:
            value = get(key)
            if isinstance(value, torch.Tensor) and dim < value.dim():
                torch._dynamo.mark_dynamic(value, dim)
        return tuple(args), kwargs

    def sweep(self, fix: Fix = Fix()) -> SweepResult:
        """Compile once with the trace backend and call on every variant, recording each compile."""
        if fix in self._sweeps:
            return self._sweeps[fix]
        variants, _ = self.variants
        self.progress("recompilation sweep" + ("" if fix.is_empty() else " with the fix applied"))
        config: dict[str, Any] = {}
        if fix.recompile_limit is not None:
            config[recompile_limit_name()] = fix.recompile_limit
        dynamic = fix.dynamic if fix.dynamic is not None else self.options.dynamic
        compiles: list[CompileRecord] = []
        errors: list[tuple[str, str]] = []
        start = time.perf_counter()
        with fresh_dynamo(**config), _metrics_room(4 * len(variants) + 64):
            compiled = torch.compile(self.module, backend=self.options.trace_backend, dynamic=dynamic)
            seen = 0
            for v in variants:
                args, kwargs = self.apply_fix(fix, v.args, v.kwargs)
                try:
                    self.call(compiled, args, kwargs)
                except Exception as exc:
                    errors.append((v.label, short_error(exc, 400)))
                records = compilation_metrics()
                for rec in records[seen:]:
                    compiles.append(
                        CompileRecord(
                            compile_id=str(getattr(rec, "compile_id", "") or ""),
                            variant=v.label,
                            recompile_reason=getattr(rec, "recompile_reason", None),
                            fail_type=getattr(rec, "fail_type", None),
                            fail_reason=getattr(rec, "fail_reason", None),
                            co_name=getattr(rec, "co_name", None),
                        )
                    )
                seen = len(records)
        result = SweepResult(fix, tuple(compiles), tuple(errors), time.perf_counter() - start)
        self._sweeps[fix] = result
        return result


def _other_values(value: int | float) -> tuple[int | float, ...]:
    """Two other values of a Python scalar argument for the sweep (same type, same sign)."""
    if isinstance(value, int):
        return (value + 1, value + 2)
    if value == 0.0:
        return (0.5, 1.5)
    return (value * 0.5, value * 1.5)
