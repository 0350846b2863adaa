"""The four checks of `validate_optimization`, each from runs of the models to one report:

    correctness   the optimized module against the original over the seeds (the one rule of compare.py)
    performance   time and peak memory of both, per pass
    compilation   torch.compile(optimized, fullgraph=True): success, graph breaks, compiled vs eager
    determinism   two runs of the optimized module, bit for bit
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import flatten, split_inputs
from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.locate import user_location
from kernel_pytorch.assistant.records import BreakRecord
from kernel_pytorch.benchmark.memory import MemoryMeasurement
from kernel_pytorch.benchmark.module import ModuleBenchmark, benchmark_module
from kernel_pytorch.benchmark.timer import speedup
from kernel_pytorch.validation.compare import TensorCheck, compare_named, failures
from kernel_pytorch.validation.inputs import inputs_for, is_drawn
from kernel_pytorch.validation.parts import (
    CompilationReport,
    CorrectnessReport,
    DeterminismReport,
    MemoryReport,
    PassComparison,
    PassMemory,
    PerformanceReport,
)
from kernel_pytorch.validation.reference64 import fp64_copy
from kernel_pytorch.validation.runs import (
    GradOutputs,
    InputsArg,
    Reference,
    Run,
    bitwise_equal,
    matched_params,
    named,
    run_model,
)

# ---- correctness ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correctness:
    """The correctness report, and what the later checks reuse: they rerun the first seed's inputs."""

    report: CorrectnessReport
    shared: list[str]  # parameters whose gradients are compared (matched by name and shape)
    inputs: tuple | dict  # the first seed's inputs
    cand: Run | None  # the optimized module's run on them; None when the first seed failed
    hi: Run | None  # the fp64 reference's run on them, if there was one
    grad_outs: GradOutputs  # the outputs differentiated on the first seed, which the reruns repeat


def correctness(
    original: nn.Module,
    optimized: nn.Module,
    inputs: InputsArg,
    seeds: Sequence[int],
    check_gradients: bool,
    reference: Reference,
) -> Correctness:
    """Run both modules (and the fp64 copy) on every seed's inputs and compare them leaf by leaf."""
    checks: dict[int, list[TensorCheck]] = {}
    errors: list[str] = []
    shared, notes = matched_params(original, optimized) if check_gradients else ([], [])
    first_inputs = inputs_for(inputs, seeds[0], seeds[0], original)
    ref64, ref_label = fp64_copy(original, first_inputs, reference)
    if reference == "fp64" and ref64 is None:
        errors.append(f"reference='fp64' requested but unavailable: {ref_label}")
    grad_label = "disabled" if not check_gradients else (
        f"inputs and {len(shared)} parameters" if shared else "inputs only")
    first_cand: Run | None = None
    first_hi: Run | None = None
    first_grad_outs: GradOutputs = []
    given: list[int] = []
    for seed in seeds:
        args = first_inputs if seed == seeds[0] else inputs_for(inputs, seed, seeds[0], original)
        # inputs validation drew are validation's to get right, never the user's model's fault: where the
        # original cannot run them, the seed falls back to the inputs as given
        drawn = seed != seeds[0] and is_drawn(inputs)
        base = None
        for attempt in (args, first_inputs) if drawn else (args,):
            try:
                base = run_model(original, named(original, shared), attempt, with_grads=check_gradients, seed=seed,
                                 grad_outputs=None)
                args = attempt
                break
            except Exception as exc:
                if drawn and attempt is args:
                    notes.append(f"seed {seed}: the original model does not run on the inputs drawn for it "
                                 f"({short_error(exc, 300)}): this seed uses the inputs as given")
                    given.append(seed)
                else:
                    errors.append(f"seed {seed}: the original failed: {short_error(exc, 2000, lines=6)}")
        if base is None:
            break
        # each seed differentiates what the original's outputs on it allow (their structure may
        # depend on the inputs); the optimized module and the fp64 copy follow that list
        grad_outs = base.differentiated
        if seed == seeds[0]:
            first_grad_outs = grad_outs
        try:
            cand = run_model(optimized, named(optimized, shared), args, with_grads=check_gradients, seed=seed,
                             grad_outputs=grad_outs)
        except Exception as exc:
            errors.append(f"seed {seed}: the optimized module failed: {short_error(exc, 2000, lines=6)}")
            break
        hi = None
        if ref64 is not None:
            try:
                hi = ref64.run(shared, args, with_grads=check_gradients, seed=seed, grad_outputs=grad_outs)
                ref_label = ref64.label
            except Exception as exc:
                notes.append(f"fp64 reference failed, table only from seed {seed}: {short_error(exc, 2000, lines=2)}")
                ref64, ref_label = None, f"none: the fp64 copy failed ({type(exc).__name__})"
        checks[seed] = compare_runs(cand, base, hi)
        if seed == seeds[0]:
            first_cand, first_hi = cand, hi
    passed = not errors and bool(checks) and all(c.passed for cs in checks.values() for c in cs)
    report = CorrectnessReport(passed, list(seeds), checks, ref_label, grad_label, errors, notes, given)
    return Correctness(report, shared, first_inputs, first_cand, first_hi, first_grad_outs)


def compare_runs(cand: Run, base: Run, hi: Run | None, *, reordered: bool = False) -> list[TensorCheck]:
    """Outputs and gradients of `cand` against `base`, with `hi` (fp64) for the budget; `reordered`
    when `cand` is `base`'s own module compiled (see `compare.check_tensor`)."""
    out_c = dict(flatten(cand.outputs, "output"))
    out_b = dict(flatten(base.outputs, "output"))
    out_h = dict(flatten(hi.outputs, "output")) if hi is not None else None
    checks = compare_named(out_c, out_b, reference_hi=out_h, reordered=reordered)
    checks += [TensorCheck(n, False, "structure", note="carries no gradient in the optimized module "
                           "(detached or computed without autograd)") for n in cand.missing_grad_outputs]
    checks += compare_named(cand.grads, base.grads, reference_hi=hi.grads if hi is not None else None,
                            reordered=reordered)
    return checks


# ---- performance and memory ----------------------------------------------------------------------

def performance(
    original: nn.Module, optimized: nn.Module, inputs: tuple | dict, passes: Sequence[str],
    timing_kwargs: dict[str, Any],
) -> tuple[PerformanceReport, MemoryReport]:
    """Time both modules and measure their peak memory on `inputs`, for each of `passes`."""
    bo: ModuleBenchmark = benchmark_module(original, inputs, passes=passes, **timing_kwargs)
    bn: ModuleBenchmark = benchmark_module(optimized, inputs, passes=passes, **timing_kwargs)
    perf: dict[str, PassComparison] = {}
    mem: dict[str, PassMemory] = {}
    method = "not measured"
    for p in passes:
        po, pn = bo.passes[p], bn.passes[p]
        err = "; ".join(f"{who}: {e}" for who, e in (("original", po.error), ("optimized", pn.error)) if e)
        ratios = speedup(po.timing, pn.timing) if po.timing and pn.timing else (None, None, None)
        perf[p] = PassComparison(p, po.timing, pn.timing, *ratios, error=err or None)
        mo: MemoryMeasurement | None = po.memory
        mn: MemoryMeasurement | None = pn.memory
        ob = mo.peak_bytes if mo else None
        nb = mn.peak_bytes if mn else None
        if mo is not None:
            method = mo.method
        ratio = nb / ob if ob and nb is not None else None
        mem[p] = PassMemory(p, ob, nb, ratio, ob - nb if ob is not None and nb is not None else None)
    return PerformanceReport(bo.device, perf), MemoryReport(method, mem)


# ---- compilation ---------------------------------------------------------------------------------

# the first seed's run of the optimized module, repeated with the given model (compiled, or itself)
Rerun = Callable[[Callable[..., Any]], Run]


def compilation(
    optimized: nn.Module,
    inputs: tuple | dict,
    backend: str,
    rerun: Rerun,
    eager: Run | None,
    hi: Run | None,
) -> CompilationReport:
    """torch.compile(optimized, fullgraph=True): the first call's time and its results against `eager`;
    on failure, the graphs and breaks of a compile without fullgraph."""
    try:
        compiled = torch.compile(optimized, fullgraph=True, backend=backend)
        start = time.perf_counter()
        run = rerun(compiled)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    except Exception as exc:
        return _compile_failure(optimized, inputs, backend, short_error(exc, 2000, lines=6))
    matches, mismatch = None, None
    if eager is not None:
        # a compiled graph sums in its own order: beyond the table, the fp64 budget (with an fp64 run)
        # or the rounding a reordered sum may make (compare_reordered) lets it pass; the budget alone
        # is not enough, since eager's CPU sums can be 10x more accurate than a compiled loop's
        bad = failures(compare_runs(run, eager, hi, reordered=True))
        matches = not bad
        mismatch = bad[0].message() if bad else None
    # fullgraph=True succeeded, so Dynamo produced exactly one graph for the forward
    return CompilationReport(True, backend, 1, 0, [], elapsed, None, matches, mismatch)


def _compile_failure(optimized: nn.Module, inputs: tuple | dict, backend: str, error: str) -> CompilationReport:
    """The analyser's Dynamo trace of a compile without fullgraph: its graphs, and its breaks with
    their first-line reasons and the user's line of each."""
    args, kwargs = split_inputs(inputs)
    try:
        # graph breaks are decided by Dynamo before any backend runs: the cheap "eager" backend finds them
        trace = AnalysisContext(optimized, args, kwargs, AnalysisOptions(trace_backend="eager")).trace
        failed = trace.error
    except Exception as exc:  # the trace records the call's errors; this is anything else going wrong
        failed = exc
    if failed is not None:  # not even a graph-broken compile works
        reason = f"compile without fullgraph also failed: {short_error(failed, 2000, lines=2)}"
        return CompilationReport(False, backend, None, None, [reason], None, error, None, break_locations=[None])
    sites: dict[tuple[str, str | None], None] = {}  # distinct (reason, site), in the order Dynamo met them
    for b in trace.breaks:
        sites.setdefault((b.reason.splitlines()[0][:200] if b.reason else "?", _break_site(b)), None)
    reasons = [r for r, _ in sites]
    locations = [loc for _, loc in sites]
    if trace.failed_frames:
        reasons.append(f"Dynamo gave up on {len(trace.failed_frames)} frame(s): they run eagerly")
        locations.append(None)
    graphs = len(trace.graphs)
    # a break right before `return` leaves no second graph, so count the recorded breaks too
    breaks = max(graphs - 1, len(trace.breaks))
    return CompilationReport(False, backend, graphs, breaks, reasons, None, error, None, break_locations=locations)


def _break_site(brk: BreakRecord) -> str | None:
    """file:line of the innermost frame of a break's stack in the user's code: the line that broke."""
    loc = user_location(brk.frames)
    return f"{loc.file}:{loc.line}" if loc is not None else None


# ---- determinism ---------------------------------------------------------------------------------


def determinism(first: Run, second: Run) -> DeterminismReport:
    """Every output and gradient of two runs compared bit for bit."""
    a = dict(flatten(first.outputs, "output")) | first.grads
    b = dict(flatten(second.outputs, "output")) | second.grads
    differing, n = [], 0
    for name, x in a.items():
        y = b.get(name)
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            continue
        n += 1
        if not bitwise_equal(x, y):
            diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
            differing.append(f"{name}: max abs diff {diff:.3g}")
    return DeterminismReport(not differing, n, differing)


__all__ = ["Correctness", "compare_runs", "compilation", "correctness", "determinism", "performance"]
