"""The analysis context: the component, its example inputs and options, and the expensive runs the
analyses share (one eager run, one Dynamo trace, one fullgraph check, one backend compile), each done
once and cached.

The pieces live beside it: Dynamo state in `dynamo`, user-code locations in `locate`, input handling in
`inputs`, the records the runs return in `records`. State that one analysis keeps per context (the
recompilation sweep of `sweep`) is built through `AnalysisContext.part`, not written into this class.
"""

from __future__ import annotations

import functools
import re
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from kernel_pytorch._tree import split_inputs
from kernel_pytorch.assistant.dynamo import (
    GraphRecorder,
    compilation_metrics,
    counters_diff,
    counters_snapshot,
    fresh_dynamo,
    inductor_caches,
)
from kernel_pytorch.assistant.inputs import (
    InputKey,
    clone_inputs,
    get_input,
    infer_input_dims,
    leaves,
    positional_names,
    root_of,
)
from kernel_pytorch.assistant.kernels.profile import RuntimeProfile, measure_compiled, measure_runtime
from kernel_pytorch.assistant.locate import location_of
from kernel_pytorch.assistant.options import AnalysisOptions
from kernel_pytorch.assistant.records import (
    PROFILE_FIELDS,
    BreakRecord,
    CompileProfile,
    FailedFrame,
    RunResult,
    TraceResult,
)

T = TypeVar("T")
# warm eager forwards timed for per-step estimates (`AnalysisContext.warm_forward_s`)
WARM_CALLS = 3


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
        self._parts: dict[Hashable, Any] = {}
        self.compiled_runs: Any = None  # the compiled forward measured inside `profile` (see `runtime`)
        self.trace_scratch: str | None = None  # per-run Chrome traces before they are merged
        # the findings of the analyses run so far, by section (filled by the assistant as they run),
        # for the analyses that build on the others (the ranked suggestions)
        self.findings: dict[str, list[Any]] = {}

    def progress(self, message: str) -> None:
        if self._progress is not None:
            self._progress(message)

    def part(self, build: Callable[[AnalysisContext], T]) -> T:
        """`build(self)`, built on first use and kept (keyed by `build`): state one analysis keeps per
        context beside the shared runs, e.g. `part(ShapeSweep)` holds the recompilation sweeps."""
        if build not in self._parts:
            self._parts[build] = build(self)
        return self._parts[build]

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

    # ----- input names and dims -------------------------------------------------------------------

    @functools.cached_property
    def input_names(self) -> dict[int | str, str]:
        """{argument key: the forward parameter it binds to}; positional ones beyond the signature keep
        Dynamo's `args[i]` name. Whole arguments only; `input_name` names any input key."""
        names: dict[int | str, str] = {k: k for k in self.kwargs}
        positional = positional_names(self.module)
        for i in range(len(self.args)):
            names[i] = positional[i] if i < len(positional) else f"args[{i}]"
        return names

    def input_name(self, key: InputKey) -> str:
        """How reports name an input: its parameter name, plus the access path for a tensor inside an
        argument (`batch['x']`)."""
        if isinstance(key, tuple):
            return self.input_names.get(key[0], str(key[0])) + key[1]
        return self.input_names.get(key, str(key))

    @functools.cached_property
    def _leaf_keys(self) -> dict[tuple[int | str, str], InputKey]:
        """{(argument, access path): input key} of every input, "" the path of a whole argument."""
        return {(root_of(k), k[1] if isinstance(k, tuple) else ""): k for k, _ in leaves(self.args, self.kwargs)}

    def resolve_input(self, name: str) -> InputKey | None:
        """The input key a name in a guard refers to, None if it is no input of the component.

        Takes Dynamo's source names as its guards print them: "x", "L['x']", "args[0]", "kwargs['x']",
        "L['kwargs']['x']" (a forward behind a `(*args, **kwargs)` wrapper), and paths into an argument:
        "L['batch']['x']", "kwargs['batch'].mask", "L['xs'][0]".
        """
        name = re.sub(r'\["([^"\'\\]*)"\]', r"['\1']", name.strip())  # ["x"] -> ['x']
        m = re.fullmatch(r"L\['([^']+)'\](.*)", name)
        if m:
            name = m.group(1) + m.group(2)
        root: int | str | None = None
        m = re.fullmatch(r"args\[(\d+)\](.*)", name)
        if m and int(m.group(1)) < len(self.args):
            root, rest = int(m.group(1)), m.group(2)
        m = re.fullmatch(r"kwargs\['([^']+)'\](.*)", name)
        if root is None and m and m.group(1) in self.kwargs:
            root, rest = m.group(1), m.group(2)
        if root is None:
            m = re.fullmatch(r"(\w+)(.*)", name)
            if not m:
                return None
            root = next((k for k, pname in self.input_names.items() if pname == m.group(1)), None)
            if root is None:
                return None
            rest = m.group(2)
        for path in (rest, re.sub(r"\.(\w+)", r"['\1']", rest), re.sub(r"\['(\w+)'\]", r".\1", rest)):
            key = self._leaf_keys.get((root, path))
            if key is not None:
                return key
        return None

    def input_value(self, key: InputKey) -> Any:
        """The example input at `key` (a position, a keyword, or a tensor inside an argument)."""
        return get_input(self.args, self.kwargs, key)

    @functools.cached_property
    def input_dims(self) -> dict[InputKey, dict[int, str]]:
        """{input: {dim: kind}}: options.input_dims if given, else inferred from the example inputs (and
        the module's recurrent layers: sequence-first inputs)."""
        given = self.options.input_dims
        if given is not None:
            return {k: dict(v) for k, v in given.items()}
        return infer_input_dims(self.args, self.kwargs, self.module)

    # ----- shared runs ----------------------------------------------------------------------------

    @functools.cached_property
    def eager(self) -> RunResult:
        """The example inputs through the plain module once (errors captured, not raised)."""
        self.progress("eager reference run")
        start = time.perf_counter()
        try:
            with torch.no_grad():
                self._call_example(self.module)
        except Exception as exc:
            return RunResult(False, exc, time.perf_counter() - start)
        return RunResult(True, None, time.perf_counter() - start)

    @functools.cached_property
    def warm_forward_s(self) -> float | None:
        """Median seconds of a warm eager forward (no_grad; two calls first, then WARM_CALLS timed), or
        None when the forward fails. A first call carries lazy set-up (CUDA context, autotuning,
        allocator growth) that can be 30x a steady call on a GPU: estimates per step use this instead."""
        if not self.eager.ok:
            return None
        self.progress("timing a warm eager forward")
        times = []
        try:
            with torch.no_grad():
                for i in range(2 + WARM_CALLS):
                    start = time.perf_counter()
                    self._call_example(self.module)
                    if i >= 2:
                        times.append(time.perf_counter() - start)
        except Exception:  # the first call ran: a later failure (state, memory) leaves no estimate
            return None
        return statistics.median(times)

    @functools.cached_property
    def trace(self) -> TraceResult:
        """Dynamo's trace of the example call with the cheap trace backend: graphs and breaks."""
        self.progress(f"tracing with Dynamo (backend={self.options.trace_backend})")
        recorder = GraphRecorder(self.options.trace_backend)
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
    def fullgraph(self) -> RunResult:
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
                return RunResult(False, exc, time.perf_counter() - start)
        return RunResult(True, None, time.perf_counter() - start)

    @functools.cached_property
    def profile(self) -> CompileProfile:
        """One cold compile (fresh Dynamo state; on-disk caches as they are) with the real backend."""
        opts = self.options
        self.progress(f"compiling with backend={opts.backend}" + (f", mode={opts.mode}" if opts.mode else ""))
        before = counters_snapshot()
        error: BaseException | None = None
        steady: float | None = None
        with fresh_dynamo(), inductor_caches(enabled=not opts.cold_cache):
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
            if error is None and opts.kernel_profile:  # measured while the compiled model lives
                self.compiled_runs = measure_compiled(self, compiled)
            records = tuple({f: getattr(rec, f, None) for f in PROFILE_FIELDS} for rec in compilation_metrics())
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

    # ----- profiling runs -------------------------------------------------------------------------
    # The profiling part: timed eager and compiled calls under torch.profiler, the plumbing in
    # `profile` and `kernels.stats`, shared by the kernel-efficiency analysis and the compile verdict.

    @functools.cached_property
    def runtime(self) -> RuntimeProfile:
        """The eager and the compiled model timed (benchmark.timer) and profiled (torch.profiler),
        forward and, with `options.train`, forward+backward, with the device's measured ceilings; the
        compiled forward comes from `profile`'s compile (see `assistant.kernels.profile`)."""
        return measure_runtime(self)
