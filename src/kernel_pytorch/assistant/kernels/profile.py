"""The profiling runs the kernel-efficiency analysis and the compile verdict share: the eager and the
compiled model, each timed (`kernel_pytorch.benchmark.timer`) and profiled (`torch.profiler`, CPU and
CUDA activities as available), forward and, when the model trains, forward+backward.

The compiled forward is measured while the compile-time analysis's compiled model is still alive
(`AnalysisContext.profile` calls `measure_compiled`), so the model is compiled once for both. The
forward+backward pass needs a compile of its own (a joint graph); its compile time is the first call's
cost beyond a steady call.

The eager and the compiled step of a pass are timed interleaved, so a drift of the machine's speed (other
processes' load, a GPU's clock at its power cap) falls on both alike: on the CPU one call of each per round,
rounds that waited for a CPU left out (`benchmark.paired.paired_cpu`); on CUDA turns of back-to-back calls
between CUDA events (`benchmark.paired.paired_cuda`). A side without the other is timed alone (`time_fn`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import map_tensors, tensors
from kernel_pytorch.assistant.dynamo import fresh_dynamo, inductor_caches
from kernel_pytorch.assistant.inputs import clone_inputs
from kernel_pytorch.assistant.kernels.profiler import ProfiledRun, profile_steps
from kernel_pytorch.assistant.kernels.traces import scratch_dir, write_trace
from kernel_pytorch.assistant.options import AnalysisOptions
from kernel_pytorch.assistant.records import CompileProfile, RunResult
from kernel_pytorch.benchmark.ceilings import Ceilings, device_name, measure_ceilings
from kernel_pytorch.benchmark.module import pass_closure
from kernel_pytorch.benchmark.paired import PairedStats, paired_cpu, paired_cuda
from kernel_pytorch.benchmark.timer import Timing, time_fn

PASSES = ("fwd", "fwd+bwd")
# CPU timing: seconds `blocked_autorange` measures each run for (a 2-core machine is noisy; the verdict
# compares the q20-q80 bands, not only the medians)
CPU_MIN_RUN_S = 0.3
CUDA_REP_MS = 200.0
PROFILE_TARGET_MS = 60.0  # profile about this much of the model per run, at least 2 and at most 10 steps


class Analysed(Protocol):
    """What these runs read from (and leave on) the analysis context: `AnalysisContext` is one. Typed
    by what is used, so this module, which the context calls, does not import the context."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: AnalysisOptions
    compiled_runs: Any  # the compiled forward's runs, left by `profile` (`measure_compiled`)
    trace_scratch: str | None  # per-run Chrome traces before they are merged

    @property
    def device(self) -> torch.device: ...

    @property
    def eager(self) -> RunResult: ...

    @property
    def profile(self) -> CompileProfile: ...

    def progress(self, message: str) -> None: ...


@dataclass(frozen=True)
class RuntimeProfile:
    """Everything measured about running the model, keyed "eager fwd", "compiled fwd+bwd", ... (the
    measuring functions fill its dicts in place before they hand it out).

    Attributes:
        device_type: "cuda" or "cpu"; device: its name (`benchmark.ceilings.device_name`).
        ceilings: the copy and matmul ceilings measured on this device (cached per device); None on the
            CPU (not measured there) or when measuring them failed.
        timings: step times from `benchmark.timer.time_fn`.
        runs: the profiled runs.
        compile_s: per pass, what compiling cost: the first compiled call beyond a steady one.
        compile_source: per pass, where that number comes from.
        errors: per key, a run that raised.
        skipped: per key, why it was not measured.
        trace_path: the Chrome trace written (all runs in one file), when asked for.
        paired: per pass timed interleaved on the CPU, how many rounds were kept (`benchmark.paired.PairedStats`).
    """

    device_type: str
    device: str
    ceilings: Ceilings | None
    timings: dict[str, Timing] = field(default_factory=dict)
    runs: dict[str, ProfiledRun] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    compile_source: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    trace_path: str | None = None
    paired: dict[str, PairedStats] = field(default_factory=dict)

    def passes(self) -> list[str]:
        """The passes with an eager timing, forward first."""
        return [p for p in PASSES if f"eager {p}" in self.timings]


def _time(fn: Callable[[], Any], device: torch.device) -> Timing:
    return time_fn(fn, device=device, warmup_ms=25.0, rep_ms=CUDA_REP_MS, flush_l2=False,
                   cpu_min_run_time=CPU_MIN_RUN_S)


def _steps_for(timing: Timing) -> int:
    return max(2, min(10, round(PROFILE_TARGET_MS / max(timing.median_ms, 1e-3))))


def _empty(ctx: Analysed) -> RuntimeProfile:
    return RuntimeProfile(ctx.device.type, device_name(ctx.device), None)


def _step_fn(ctx: Analysed, model: Callable[..., Any], pass_name: str) -> Callable[[], Any]:
    """One step of `model` on a private copy of the example inputs (never the example itself: a model
    that writes into its inputs must not change what the other analyses see)."""
    args, kwargs = clone_inputs(ctx.args), clone_inputs(ctx.kwargs)
    if pass_name == "fwd":
        return pass_closure(lambda: model(*args, **kwargs), (), "fwd")
    grad = lambda t: t.detach().requires_grad_(True) if t.is_floating_point() else t  # noqa: E731
    args, kwargs = map_tensors(grad, args), map_tensors(grad, kwargs)
    wrt = [t for t in tensors((args, kwargs)) if t.requires_grad]
    wrt += [p for p in ctx.module.parameters() if p.requires_grad]
    return pass_closure(lambda: model(*args, **kwargs), wrt, "fwd+bwd")


def _measure(ctx: Analysed, out: RuntimeProfile, label: str, pass_name: str, fn: Callable[[], Any]) -> None:
    """Time `fn` (unless a paired timing is in `out` already), then profile it, into `out` under
    "<label> <pass>"; an error is recorded, not raised."""
    key = f"{label} {pass_name}"
    try:
        timing = out.timings.get(key)
        if timing is None:
            ctx.progress(f"timing the {label} model ({pass_name})")
            timing = _time(fn, ctx.device)
        out.timings[key] = timing
        ctx.progress(f"profiling the {label} model ({pass_name})")
        dtype = next((p.dtype for p in ctx.module.parameters() if p.is_floating_point()), None)
        out.runs[key] = profile_steps(fn, _steps_for(timing), ctx.device.type, label, pass_name, scratch_dir(ctx),
                                      dtype)
    except Exception as exc:  # a model that runs once may still fail when timed (memory, state)
        out.errors[key] = short_error(exc)


def _pair(ctx: Analysed, out: RuntimeProfile, pass_name: str, eager: Callable[[], Any] | None,
          compiled: Callable[[], Any]) -> None:
    """The eager and compiled steps of `pass_name` timed interleaved into `out` (module docstring)."""
    if eager is None:
        return
    ctx.progress(f"timing the eager and the compiled model ({pass_name}, interleaved)")
    steps = {"eager": eager, "compiled": compiled}
    try:
        timings, out.paired[pass_name] = (paired_cuda(steps, ctx.device) if ctx.device.type == "cuda"
                                          else paired_cpu(steps))
        out.timings[f"eager {pass_name}"], out.timings[f"compiled {pass_name}"] = timings["eager"], timings["compiled"]
    except Exception as exc:
        out.errors[f"compiled {pass_name}"] = short_error(exc)


def measure_compiled(ctx: Analysed, compiled: Callable[..., Any]) -> RuntimeProfile:
    """The compiled forward, timed and profiled while the compile-time analysis's compiled model lives
    (called from `AnalysisContext.profile`, inside its Dynamo scope); on the CPU timed interleaved with
    the eager forward."""
    out = _empty(ctx)
    fn = _step_fn(ctx, compiled, "fwd")
    _pair(ctx, out, "fwd", _step_fn(ctx, ctx.module, "fwd") if ctx.eager.ok else None, fn)
    if "compiled fwd" not in out.errors:
        _measure(ctx, out, "compiled", "fwd", fn)
    return out


def _compile_and_measure(ctx: Analysed, out: RuntimeProfile, pass_name: str,
                         eager: Callable[[], Any] | None = None) -> None:
    """Compile the model for `pass_name` (a compile of its own) and measure it (on the CPU interleaved
    with `eager`, the eager step); the compile cost is the first step's time beyond the steady step's."""
    opts = ctx.options
    key = f"compiled {pass_name}"
    ctx.progress(f"compiling for {pass_name} with backend={getattr(opts.backend, '__name__', opts.backend)}")
    kwargs: dict[str, Any] = {"backend": opts.backend, "dynamic": opts.dynamic}
    if opts.mode is not None:
        kwargs["mode"] = opts.mode
    with fresh_dynamo(), inductor_caches(enabled=not opts.cold_cache), torch.enable_grad():
        try:
            start = time.perf_counter()
            fn = _step_fn(ctx, torch.compile(ctx.module, **kwargs), pass_name)
            fn()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize(ctx.device)
            first = time.perf_counter() - start
        except Exception as exc:
            out.errors[key] = short_error(exc)
            return
        _pair(ctx, out, pass_name, eager, fn)
        if key not in out.errors:
            _measure(ctx, out, "compiled", pass_name, fn)
        if key in out.timings:
            # (for fwd+bwd the first step also ran the forward that sized the upstream gradient: the
            # compile cost is overstated by one forward, well inside a compile's seconds)
            steady = out.timings[key].median_ms / 1e3
            out.compile_s[pass_name] = max(first - steady, 0.0)
            out.compile_source[pass_name] = "first compiled step beyond a steady step, measured here"


def measure_runtime(ctx: Analysed) -> RuntimeProfile:
    """Time and profile the eager and the compiled model (see the module docstring)."""
    opts = ctx.options
    out = _empty(ctx)
    train = opts.train if opts.train is not None else ctx.module.training
    passes = ["fwd"] + (["fwd+bwd"] if train else [])
    compiled_ok = opts.measure_compile_time and ctx.eager.ok
    if compiled_ok:
        profile = ctx.profile  # the compile-time analysis's compile; it measures the compiled forward
        measured = ctx.compiled_runs
        if profile.error is not None:
            out.errors["compiled fwd"] = short_error(profile.error)
        elif measured is not None:
            for name in ("timings", "runs", "errors", "paired"):
                getattr(out, name).update(getattr(measured, name))
            if profile.steady_call_s is not None:
                out.compile_s["fwd"] = max(profile.first_call_s - profile.steady_call_s, 0.0)
                out.compile_source["fwd"] = "first compiled call beyond a steady one, from the compile-time analysis"
        else:  # that compile ran before the profiling runs were asked for: compile once more
            _compile_and_measure(ctx, out, "fwd", _step_fn(ctx, ctx.module, "fwd"))
    for pass_name in passes:
        if not ctx.eager.ok:
            out.skipped[f"eager {pass_name}"] = "the model does not run eagerly on its example inputs"
            continue
        with torch.no_grad() if pass_name == "fwd" else torch.enable_grad():
            try:
                fn = _step_fn(ctx, ctx.module, pass_name)
            except Exception as exc:  # fwd+bwd of a model with nothing to differentiate
                out.errors[f"eager {pass_name}"] = short_error(exc)
                continue
        if pass_name != "fwd" and compiled_ok:
            _compile_and_measure(ctx, out, pass_name, fn)
        _measure(ctx, out, "eager", pass_name, fn)
    if not compiled_ok:
        why = ("compile-time measurement is off (--no-compile-time), so nothing was compiled"
               if not opts.measure_compile_time else "the model does not run eagerly")
        for pass_name in passes:
            out.skipped[f"compiled {pass_name}"] = why
    ceilings = None
    if ctx.device.type == "cuda":  # the CPU's are not measured: its op times are reported without roofs
        try:
            ctx.progress("reading the device's copy and matmul ceilings")
            ceilings = measure_ceilings(ctx.device)
        except Exception as exc:
            out.errors["ceilings"] = short_error(exc)
    trace_path = write_trace(ctx, out.runs, out.errors)
    return replace(out, ceilings=ceilings, trace_path=trace_path)


__all__ = ["PASSES", "Analysed", "RuntimeProfile", "measure_compiled", "measure_runtime"]
