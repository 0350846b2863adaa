"""`validate_optimization(original, optimized, inputs)`: is the optimized module right, faster, leaner,
compilable and deterministic? One call, one result object with the four parts users ask for:

    correctness_check        outputs (any nesting) and gradients of inputs and parameters, per tensor,
                             under the one tolerance table, or the fp64-derived budget against an fp64
                             copy of the original; over several seeds
    performance_improvement  median time of each model with spread, and the speedup, for the forward
                             and the forward+backward
    memory_efficiency        peak memory of each and the ratio (CUDA allocator; CPU: profiler trace)
    compilation_success      torch.compile(optimized, fullgraph=True): success, graphs, graph breaks,
                             first-call time; failures are reported, never raised
    determinism              two runs of `optimized`, compared bit for bit

The two modules are expected to hold the same weights (the optimized one is normally derived from the
original); parameters are matched by name for the gradient comparison.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import flatten, map_tensors, tensors
from kernel_pytorch.benchmark.ceilings import device_name
from kernel_pytorch.benchmark.memory import MemoryMeasurement
from kernel_pytorch.benchmark.module import (
    ModuleBenchmark,
    as_inputs,
    benchmark_module,
    call,
    infer_device,
    upstream_gradients,
    with_input_grads,
)
from kernel_pytorch.benchmark.timer import Timing, speedup
from kernel_pytorch.validation.compare import TensorCheck, compare_named, failures
from kernel_pytorch.validation.tolerances import BUDGET_FACTOR, TOLERANCES

Reference = Literal["auto", "fp64", "none"]
InputsArg = Any  # tuple | list | dict | Tensor | Callable[[int], those]

# How many failing tensors a text summary lists before saying "and N more".
_MAX_LISTED_FAILURES = 12


# ---- result types --------------------------------------------------------------------------------


@dataclass
class CorrectnessReport:
    """Per-tensor checks of the optimized module against the original, for every seed."""

    passed: bool
    seeds: list[int]
    checks: dict[int, list[TensorCheck]]  # seed -> checks
    reference: str  # what the budget compares against, or why there is none
    gradients: str  # what was differentiated
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def failures(self) -> list[tuple[int, TensorCheck]]:
        return [(s, c) for s, cs in self.checks.items() for c in cs if not c.passed]

    def worst_by_name(self) -> list[tuple[str, TensorCheck, bool]]:
        """Per leaf name: the check with the largest abs error over the seeds, and whether all passed."""
        out: dict[str, tuple[TensorCheck, bool]] = {}
        for cs in self.checks.values():
            for c in cs:
                prev = out.get(c.name)
                if prev is None:
                    out[c.name] = (c, c.passed)
                    continue
                worst = c if (not c.passed and prev[0].passed) or c.max_abs_err > prev[0].max_abs_err else prev[0]
                out[c.name] = (worst, prev[1] and c.passed)
        return [(n, c, ok) for n, (c, ok) in out.items()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seeds": self.seeds,
            "reference": self.reference,
            "gradients": self.gradients,
            "tolerances": {str(d).removeprefix("torch."): [t.atol, t.rtol] for d, t in TOLERANCES.items()},
            "budget_factor": BUDGET_FACTOR,
            "checks": [{"seed": s, "checks": [c.to_dict() for c in cs]} for s, cs in self.checks.items()],
            "failures": [f"seed {s}: {c.message()}" for s, c in self.failures()],
            "errors": self.errors,
            "notes": self.notes,
        }


@dataclass
class PassComparison:
    """Original vs optimized timing for one pass; speedup = original / optimized (>1 is faster)."""

    pass_name: str
    original: Timing | None
    optimized: Timing | None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_name,
            "original": self.original.to_dict() if self.original else None,
            "optimized": self.optimized.to_dict() if self.optimized else None,
            "speedup": self.speedup,
            "speedup_low": self.speedup_low,
            "speedup_high": self.speedup_high,
            "error": self.error,
        }


@dataclass
class PerformanceReport:
    device: str
    passes: dict[str, PassComparison]

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "passes": {k: v.to_dict() for k, v in self.passes.items()}}


@dataclass
class PassMemory:
    """Peak memory of one pass of each model; ratio = optimized / original (<1 uses less)."""

    pass_name: str
    original_bytes: int | None
    optimized_bytes: int | None
    ratio: float | None
    saved_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_name, "original_bytes": self.original_bytes,
                "optimized_bytes": self.optimized_bytes, "ratio": self.ratio, "saved_bytes": self.saved_bytes}


@dataclass
class MemoryReport:
    method: str  # how the peak was measured on this device
    passes: dict[str, PassMemory]

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "passes": {k: v.to_dict() for k, v in self.passes.items()}}


@dataclass
class CompilationReport:
    """torch.compile(optimized, fullgraph=True) on the example inputs."""

    success: bool
    backend: str
    graph_count: int | None
    graph_break_count: int | None
    break_reasons: list[str]
    compile_time_s: float | None  # wall time of the first compiled call: compile + one run
    error: str | None
    matches_eager: bool | None  # compiled results vs the optimized module run eagerly, same rule
    mismatch: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DeterminismReport:
    deterministic: bool
    tensors_checked: int
    differing: list[str]  # "name: max abs diff X"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class ValidationResult:
    """What `validate_optimization` found. `passed` is the correctness verdict."""

    correctness_check: CorrectnessReport
    performance_improvement: PerformanceReport | None
    memory_efficiency: MemoryReport | None
    compilation_success: CompilationReport | None
    determinism: DeterminismReport | None
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
        return "\n".join(_render(self))

    def __str__(self) -> str:
        return self.summary()


# ---- running the models --------------------------------------------------------------------------


@dataclass
class _Run:
    outputs: Any
    grads: dict[str, Tensor | None]
    missing_grad_outputs: list[str]
    differentiated: list[tuple[str, torch.dtype]]  # outputs whose upstream gradient was fed in


def _float_leaves(out: Any) -> list[tuple[str, Tensor]]:
    return [(n, t) for n, t in flatten(out, "output")
            if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex())]


def _run(
    model: Callable[..., Any],
    named_params: Sequence[tuple[str, nn.Parameter]],
    inputs: tuple | dict,
    *,
    with_grads: bool,
    seed: int,
    grad_outputs: Sequence[tuple[str, torch.dtype]] | None,
) -> _Run:
    """One forward (and backward): outputs detached, gradients keyed by what they differentiate.

    Args:
        grad_outputs: (output name, dtype the upstream gradient is rounded to) to differentiate;
            None means every differentiable output (the original's run decides this list).
    """
    args = with_input_grads(inputs) if with_grads else inputs
    with torch.enable_grad() if with_grads else torch.no_grad():
        out = call(model, args)
    grads: dict[str, Tensor | None] = {}
    missing: list[str] = []
    used: list[tuple[str, torch.dtype]] = []
    if with_grads:
        leaves = {n: t for n, t in _float_leaves(out)}
        wanted = grad_outputs if grad_outputs is not None else [
            (n, t.dtype) for n, t in leaves.items() if t.requires_grad]
        outs, dtypes = [], []
        for name, dtype in wanted:
            t = leaves.get(name)
            if t is None or not t.requires_grad:
                missing.append(name)
                continue
            outs.append(t)
            dtypes.append(dtype)
            used.append((name, dtype))
        in_leaves = [(f"grad({n})", t) for n, t in flatten(args, "input")
                     if isinstance(t, Tensor) and t.requires_grad]
        param_leaves = [(f"grad(param {n!r})", p) for n, p in named_params]
        wrt = [t for _, t in in_leaves] + [p for _, p in param_leaves]
        if outs and wrt:
            # one fixed upstream gradient per output, a function of (seed, output order, shape) only
            gen_seed = 10_000 + seed
            upstream = upstream_gradients(outs, gen_seed, round_to=dtypes)
            got = torch.autograd.grad(outs, wrt, upstream, allow_unused=True)
            for (name, _), g in zip(in_leaves + param_leaves, got):
                grads[name] = g.detach() if g is not None else None
    return _Run(map_tensors(lambda t: t.detach(), out), grads, missing, used)


def _redraw(example: tuple | dict, seed: int) -> tuple | dict:
    """Fresh random inputs shaped like `example`: floats keep the example's mean and spread, integers
    stay within its range, bools and non-tensors are reused."""
    gen = torch.Generator().manual_seed(seed)

    def draw(t: Tensor) -> Tensor:
        if t.is_floating_point():
            ref = t.detach().float()
            mean = float(ref.mean()) if ref.numel() else 0.0
            std = float(ref.std()) if ref.numel() > 1 else 0.0
            if not std > 0:
                std = max(abs(mean), 1.0)
            new = torch.randn(t.shape, generator=gen) * std + mean
            return new.to(dtype=t.dtype, device=t.device)
        if t.dtype == torch.bool or t.is_complex() or t.numel() == 0:
            return t.clone()
        lo, hi = int(t.min()), int(t.max())
        return torch.randint(lo, hi + 1, t.shape, generator=gen).to(dtype=t.dtype, device=t.device)

    return map_tensors(draw, example)


def _inputs_for(inputs: InputsArg, seed: int, first_seed: int) -> tuple | dict:
    if callable(inputs) and not isinstance(inputs, (Tensor, nn.Module)):
        return as_inputs(inputs(seed))
    base = as_inputs(inputs)
    return base if seed == first_seed else _redraw(base, seed)


def _to_fp64(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64) if t.is_floating_point() else t


def _fp64_copy(original: nn.Module, inputs: tuple | dict, mode: Reference) -> tuple[nn.Module | None, str]:
    """An fp64 copy of the original for the budget, or None and why not."""
    if mode == "none":
        return None, "none (reference='none'): table only"
    floats = [t for t in list(original.parameters()) + list(original.buffers()) + tensors(inputs)
              if t.is_floating_point()]
    if not floats:
        return None, "none: no floating-point inputs or parameters"
    if mode == "auto" and all(t.dtype == torch.float64 for t in floats):
        return None, "none: the original already runs in fp64 (table only)"
    size = sum(t.numel() for t in list(original.parameters()) + list(original.buffers())) * 8
    dev = infer_device(original, inputs)
    if mode == "auto" and dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        if size > free // 4:  # leave room for activations of three models
            return None, f"none: an fp64 copy ({size / 2**30:.1f} GiB) would not fit comfortably"
    try:
        return copy.deepcopy(original).to(torch.float64), "fp64 copy of the original"
    except Exception as exc:
        return None, f"none: the original cannot be copied to fp64 ({type(exc).__name__}: {exc})"


def _matched_params(original: nn.Module, optimized: nn.Module) -> tuple[list[str], list[str]]:
    """Names of trainable parameters both modules have with the same shape; and notes on the rest."""
    orig = {n: p for n, p in original.named_parameters() if p.requires_grad}
    opt = {n: p for n, p in optimized.named_parameters() if p.requires_grad}
    shared = [n for n in orig if n in opt and orig[n].shape == opt[n].shape]
    notes = []
    only_orig = [n for n in orig if n not in shared]
    only_opt = [n for n in opt if n not in shared]
    if only_orig or only_opt:
        notes.append(
            f"gradients not compared for parameters without a same-named, same-shaped twin: "
            f"original {only_orig[:5]}{'...' if len(only_orig) > 5 else ''}, "
            f"optimized {only_opt[:5]}{'...' if len(only_opt) > 5 else ''}"
        )
    return shared, notes


def _named(module: nn.Module, names: Sequence[str]) -> list[tuple[str, nn.Parameter]]:
    params = dict(module.named_parameters())
    return [(n, params[n]) for n in names]


def _bitwise_equal(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                       b.detach().reshape(-1).contiguous().view(torch.uint8))


# ---- the parts -----------------------------------------------------------------------------------


@dataclass
class _Correctness:
    """The correctness report, and what the later parts reuse: they rerun the first seed's inputs."""

    report: CorrectnessReport
    shared: list[str]  # parameters whose gradients are compared (matched by name and shape)
    inputs: tuple | dict  # the first seed's inputs
    cand: _Run | None  # the optimized module's run on them; None when the first seed failed
    hi: _Run | None  # the fp64 reference's run on them, if there was one
    grad_outs: list[tuple[str, torch.dtype]]  # the outputs differentiated on the last seed the original ran


def _correctness(
    original: nn.Module,
    optimized: nn.Module,
    inputs: InputsArg,
    seeds: Sequence[int],
    check_gradients: bool,
    reference: Reference,
) -> _Correctness:
    checks: dict[int, list[TensorCheck]] = {}
    errors: list[str] = []
    shared, notes = _matched_params(original, optimized) if check_gradients else ([], [])
    first_inputs = _inputs_for(inputs, seeds[0], seeds[0])
    ref64, ref_label = _fp64_copy(original, first_inputs, reference)
    if reference == "fp64" and ref64 is None:
        errors.append(f"reference='fp64' requested but unavailable: {ref_label}")
    grad_label = "disabled" if not check_gradients else (
        f"inputs and {len(shared)} parameters" if shared else "inputs only")
    first_cand: _Run | None = None
    first_hi: _Run | None = None
    grad_outs: list[tuple[str, torch.dtype]] | None = None
    for seed in seeds:
        args = first_inputs if seed == seeds[0] else _inputs_for(inputs, seed, seeds[0])
        try:
            base = _run(original, _named(original, shared), args, with_grads=check_gradients, seed=seed,
                        grad_outputs=None)
        except Exception as exc:
            errors.append(f"seed {seed}: the original failed: {short_error(exc, 2000, lines=6)}")
            break
        grad_outs = base.differentiated
        try:
            cand = _run(optimized, _named(optimized, shared), args, with_grads=check_gradients, seed=seed,
                        grad_outputs=grad_outs)
        except Exception as exc:
            errors.append(f"seed {seed}: the optimized module failed: {short_error(exc, 2000, lines=6)}")
            break
        hi = None
        if ref64 is not None:
            try:
                hi = _run(ref64, _named(ref64, shared), map_tensors(_to_fp64, args),
                          with_grads=check_gradients, seed=seed, grad_outputs=grad_outs)
            except Exception as exc:
                notes.append(f"fp64 reference failed, table only from seed {seed}: {short_error(exc, 2000, lines=2)}")
                ref64, ref_label = None, f"none: the fp64 copy failed ({type(exc).__name__})"
        seed_checks = _compare_runs(cand, base, hi)
        checks[seed] = seed_checks
        if seed == seeds[0]:
            first_cand, first_hi = cand, hi
    passed = not errors and bool(checks) and all(c.passed for cs in checks.values() for c in cs)
    report = CorrectnessReport(passed, list(seeds), checks, ref_label, grad_label, errors, notes)
    return _Correctness(report, shared, first_inputs, first_cand, first_hi, grad_outs or [])


def _compare_runs(cand: _Run, base: _Run, hi: _Run | None) -> list[TensorCheck]:
    out_c = dict(flatten(cand.outputs, "output"))
    out_b = dict(flatten(base.outputs, "output"))
    out_h = dict(flatten(hi.outputs, "output")) if hi is not None else None
    checks = compare_named(out_c, out_b, reference_hi=out_h)
    checks += [TensorCheck(n, False, "structure", note="carries no gradient in the optimized module "
                           "(detached or computed without autograd)") for n in cand.missing_grad_outputs]
    checks += compare_named(cand.grads, base.grads, reference_hi=hi.grads if hi is not None else None)
    return checks


def _performance(
    original: nn.Module, optimized: nn.Module, inputs: tuple | dict, passes: Sequence[str],
    timing_kwargs: dict[str, Any],
) -> tuple[PerformanceReport, MemoryReport]:
    bo: ModuleBenchmark = benchmark_module(original, inputs, passes=passes, **timing_kwargs)
    bn: ModuleBenchmark = benchmark_module(optimized, inputs, passes=passes, **timing_kwargs)
    perf: dict[str, PassComparison] = {}
    mem: dict[str, PassMemory] = {}
    method = "not measured"
    for p in passes:
        po, pn = bo.passes[p], bn.passes[p]
        err = "; ".join(f"{who}: {e}" for who, e in (("original", po.error), ("optimized", pn.error)) if e)
        pc = PassComparison(p, po.timing, pn.timing, error=err or None)
        if po.timing and pn.timing:
            pc.speedup, pc.speedup_low, pc.speedup_high = speedup(po.timing, pn.timing)
        perf[p] = pc
        mo: MemoryMeasurement | None = po.memory
        mn: MemoryMeasurement | None = pn.memory
        ob = mo.peak_bytes if mo else None
        nb = mn.peak_bytes if mn else None
        if mo is not None:
            method = mo.method
        ratio = nb / ob if ob and nb is not None else None
        mem[p] = PassMemory(p, ob, nb, ratio, ob - nb if ob is not None and nb is not None else None)
    return PerformanceReport(bo.device, perf), MemoryReport(method, mem)


def _graph_break_reasons() -> dict[str, int]:
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {}
    # the key holding break reasons moved between releases; read both
    merged: dict[str, int] = {}
    for key in ("graph_break", "unimplemented"):
        for reason, n in counters.get(key, {}).items():
            merged[str(reason)] = merged.get(str(reason), 0) + int(n)
    return merged


# the first seed's run of the optimized module, repeated with the given model (compiled, or itself)
_Rerun = Callable[[Callable[..., Any]], _Run]


def _compilation(
    optimized: nn.Module,
    inputs: tuple | dict,
    backend: str,
    rerun: _Rerun,
    eager: _Run | None,
    hi: _Run | None,
) -> CompilationReport:
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
        bad = failures(_compare_runs(run, eager, hi))
        matches = not bad
        mismatch = bad[0].message() if bad else None
    # fullgraph=True succeeded, so Dynamo produced exactly one graph for the forward
    return CompilationReport(True, backend, 1, 0, [], elapsed, None, matches, mismatch)


def _compile_failure(optimized: nn.Module, inputs: tuple | dict, backend: str, error: str) -> CompilationReport:
    graphs: list[Any] = []

    def count_graphs(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    before = _graph_break_reasons()
    reasons: list[str] = []
    try:
        with torch.no_grad():
            call(torch.compile(optimized, backend=count_graphs), inputs)
        after = _graph_break_reasons()
        new = {r: n - before.get(r, 0) for r, n in after.items() if n > before.get(r, 0)}
        reasons = [r.splitlines()[0][:200] for r in new]
        count: int | None = len(graphs)
        # a break right before `return` leaves no second graph, so count the recorded breaks too
        breaks: int | None = max(len(graphs) - 1, sum(new.values()))
    except Exception as exc:  # not even a graph-broken compile works
        count = breaks = None
        reasons = [f"compile without fullgraph also failed: {short_error(exc, 2000, lines=2)}"]
    return CompilationReport(False, backend, count, breaks, reasons, None, error, None)


def _determinism(first: _Run, second: _Run) -> DeterminismReport:
    a = dict(flatten(first.outputs, "output")) | first.grads
    b = dict(flatten(second.outputs, "output")) | second.grads
    differing, n = [], 0
    for name, x in a.items():
        y = b.get(name)
        if not isinstance(x, Tensor) or not isinstance(y, Tensor):
            continue
        n += 1
        if not _bitwise_equal(x, y):
            diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else float("nan")
            differing.append(f"{name}: max abs diff {diff:.3g}")
    return DeterminismReport(not differing, n, differing)


# ---- the entry point -----------------------------------------------------------------------------


def validate_optimization(
    original: nn.Module,
    optimized: nn.Module,
    inputs: InputsArg,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    check_gradients: bool = True,
    reference: Reference = "auto",
    check_performance: bool = True,
    check_compile: bool = True,
    check_determinism: bool = True,
    compile_backend: str = "inductor",
    train: bool = False,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    cpu_min_run_time: float = 0.2,
) -> ValidationResult:
    """Check that `optimized` computes what `original` does, and measure what it buys.

    Args:
        original: the reference module.
        optimized: the module under test, holding the same weights (parameters matched by name).
        inputs: example inputs: a tuple/list of positional args, a dict of keyword args, one tensor,
            or a callable `seed -> inputs`. The first seed uses them as given; later seeds redraw
            floating-point tensors with the same shape, dtype, mean and spread (integer tensors
            within the same range).
        seeds: random seeds for inputs and upstream gradients; correctness must hold for each.
        check_gradients: also compare gradients of floating-point inputs and shared parameters,
            with a fixed random upstream gradient per output.
        reference: "auto" builds an fp64 copy of the original so a tensor failing the table may pass
            the fp64-derived budget; "fp64" requires it; "none" uses the table alone.
        check_performance: time both models (forward, and forward+backward with gradients) and
            measure their peak memory.
        check_compile: try torch.compile(optimized, fullgraph=True, backend=compile_backend).
        check_determinism: run `optimized` twice and compare bit for bit.
        compile_backend: "inductor" (default), or "aot_eager"/"eager" for a cheaper tracing check.
        train: validate in training mode (dropout active: expect failures); default eval mode.
        warmup_ms, rep_ms: CUDA timing budget per measurement; cpu_min_run_time: CPU's.
    Returns:
        A `ValidationResult`; nothing here raises for a wrong, slow or uncompilable `optimized`.
    """
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    modes = [(m, m.training) for mod in (original, optimized) for m in mod.modules()]
    original.train(train)
    optimized.train(train)
    try:
        corr = _correctness(original, optimized, inputs, seeds, check_gradients, reference)
        with_grads = check_gradients and bool(corr.grad_outs)
        dev = infer_device(original, corr.inputs)

        def rerun(model: Callable[..., Any]) -> _Run:
            # parameters are looked up on `optimized`: a compiled wrapper prefixes their names
            return _run(model, _named(optimized, corr.shared), corr.inputs, with_grads=with_grads, seed=seeds[0],
                        grad_outputs=corr.grad_outs)

        perf = mem = None
        if check_performance:
            passes = ("fwd", "fwd+bwd") if with_grads else ("fwd",)
            perf, mem = _performance(original, optimized, corr.inputs, passes, dict(
                device=dev, warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_min_run_time=cpu_min_run_time))
        comp = None
        if check_compile:
            comp = _compilation(optimized, corr.inputs, compile_backend, rerun, corr.cand, corr.hi)
        det = None
        if check_determinism and corr.cand is not None:
            try:
                det = _determinism(corr.cand, rerun(optimized))
            except Exception as exc:
                det = DeterminismReport(False, 0, [f"second run failed: {short_error(exc, 2000, lines=2)}"])
        return ValidationResult(corr.report, perf, mem, comp, det, device_name(dev))
    finally:
        for m, was_training in modes:
            m.training = was_training


# ---- text rendering ------------------------------------------------------------------------------


def _ms(t: Timing | None) -> str:
    return "-" if t is None else f"{t.median_ms:.4g} ms [{t.q20_ms:.4g}-{t.q80_ms:.4g}]"


def _mib(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**20:.2f} MiB" if abs(b) >= 2**20 else f"{b / 2**10:.1f} KiB"


def _render(r: ValidationResult) -> list[str]:
    c = r.correctness_check
    n_leaves = len(next(iter(c.checks.values()))) if c.checks else 0
    lines = [
        f"correctness_check: {'PASS' if c.passed else 'FAIL'} "
        f"({len(c.checks)}/{len(c.seeds)} seeds, {n_leaves} tensors each; gradients: {c.gradients}; "
        f"fp64 budget reference: {c.reference})"
    ]
    lines += [f"  error: {e}" for e in c.errors]
    rows = c.worst_by_name()
    width = max((len(n) for n, _, _ in rows), default=0)
    for name, chk, ok in rows:
        if chk.method in ("structure", "value"):
            lines.append(f"  {name:<{width}}  {'ok' if ok else 'FAIL'}  {chk.note}")
            continue
        lines.append(
            f"  {name:<{width}}  {'ok  ' if ok else 'FAIL'}  max abs {chk.max_abs_err:.3g}  "
            f"max rel {chk.max_rel_err:.3g}  [{chk.method}]"
        )
    fails = c.failures()
    for seed, chk in fails[:_MAX_LISTED_FAILURES]:
        lines.append(f"  seed {seed}: {chk.message()}")
    if len(fails) > _MAX_LISTED_FAILURES:
        lines.append(f"  ... and {len(fails) - _MAX_LISTED_FAILURES} more failures")
    lines += [f"  note: {n}" for n in c.notes]

    p = r.performance_improvement
    if p is None:
        lines.append("performance_improvement: skipped")
    else:
        method = next((pc.original.method for pc in p.passes.values() if pc.original), "")
        lines.append(f"performance_improvement: on {p.device} ({method}; median [q20-q80])")
        for pc in p.passes.values():
            if pc.error or pc.speedup is None:
                lines.append(f"  {pc.pass_name:<8} error: {pc.error or 'no timing'}")
                continue
            lines.append(
                f"  {pc.pass_name:<8} original {_ms(pc.original)}  optimized {_ms(pc.optimized)}  "
                f"speedup {pc.speedup:.2f}x [{pc.speedup_low:.2f}-{pc.speedup_high:.2f}]"
            )
    m = r.memory_efficiency
    if m is None:
        lines.append("memory_efficiency: skipped")
    else:
        lines.append(f"memory_efficiency: ({m.method})")
        for pm in m.passes.values():
            ratio = f"{pm.ratio:.2f}x" if pm.ratio is not None else "-"
            lines.append(f"  {pm.pass_name:<8} original {_mib(pm.original_bytes)}  optimized "
                         f"{_mib(pm.optimized_bytes)}  ratio {ratio}")
    comp = r.compilation_success
    if comp is None:
        lines.append("compilation_success: skipped")
    elif comp.success:
        match = {True: "compiled results match eager", False: "compiled results DIFFER from eager",
                 None: ""}[comp.matches_eager]
        lines.append(
            f"compilation_success: yes (fullgraph=True, backend {comp.backend}): {comp.graph_count} graph, "
            f"{comp.graph_break_count} graph breaks, first call {comp.compile_time_s:.2f} s; {match}"
        )
        if comp.mismatch:
            lines.append(f"  {comp.mismatch}")
    else:
        lines.append(
            f"compilation_success: no (fullgraph=True, backend {comp.backend}): "
            f"{comp.graph_count if comp.graph_count is not None else '?'} graphs, "
            f"{comp.graph_break_count if comp.graph_break_count is not None else '?'} graph breaks"
        )
        lines += [f"  {line}" for line in (comp.error or "").splitlines()[:4]]
        lines += [f"  break: {reason}" for reason in comp.break_reasons[:5]]
    d = r.determinism
    if d is None:
        lines.append("determinism: skipped")
    elif d.deterministic:
        lines.append(f"determinism: bitwise identical over 2 runs ({d.tensors_checked} tensors)")
    else:
        lines.append(f"determinism: NOT bitwise reproducible ({len(d.differing)} of {d.tensors_checked} differ)")
        lines += [f"  {x}" for x in d.differing[:5]]
    return lines


__all__ = [
    "CompilationReport",
    "CorrectnessReport",
    "DeterminismReport",
    "MemoryReport",
    "PassComparison",
    "PassMemory",
    "PerformanceReport",
    "ValidationResult",
    "validate_optimization",
]
