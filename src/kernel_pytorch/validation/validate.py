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

The parts live next door: `options.py` (what to check: `ValidationOptions`), `report.py` (the result types), `inputs.py`
(each seed's inputs), `runs.py` (running the models), `reference64.py` (the fp64 copy), `checks.py` (the
four checks), `render.py` (the text summary).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.benchmark.ceilings import device_name
from kernel_pytorch.benchmark.module import infer_device
from kernel_pytorch.validation.checks import compilation, correctness, determinism, performance
from kernel_pytorch.validation.options import ValidationOptions
from kernel_pytorch.validation.parts import DeterminismReport
from kernel_pytorch.validation.report import ValidationResult
from kernel_pytorch.validation.runs import InputsArg, Run, named, run_model


def validate_optimization(
    original: nn.Module,
    optimized: nn.Module,
    inputs: InputsArg,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    options: ValidationOptions | None = None,
    **fields: Any,
) -> ValidationResult:
    """Check that `optimized` computes what `original` does, and measure what it buys.

    Args:
        original: the reference module.
        optimized: the module under test, holding the same weights (parameters matched by name).
        inputs: example inputs: a tuple/list of positional args, a dict of keyword args, one tensor,
            or a callable `seed -> inputs`. The first seed uses them as given; later seeds draw
            valid inputs of the model (`validation/inputs.py`: floats with the same mean and spread,
            ids within range, ignored labels and masks kept), or the given ones where the original
            cannot run the drawn ones.
        seeds: random seeds for inputs and upstream gradients; correctness must hold for each.
        options: what to check beside correctness (`ValidationOptions`: gradients, the fp64 reference,
            timing and memory, compilation, determinism, training mode, timing budgets); default all.
        **fields: `ValidationOptions` fields (`check_performance=False`, `reference="none"` ...),
            overriding `options`'.
    Returns:
        A `ValidationResult`; nothing here raises for a wrong, slow or uncompilable `optimized`.
    Raises:
        TypeError: a keyword that is not a `ValidationOptions` field (named in the message).
    """
    opts = (options or ValidationOptions()).replace(**fields)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    modes = [(m, m.training) for mod in (original, optimized) for m in mod.modules()]
    original.train(opts.train)
    optimized.train(opts.train)
    try:
        corr = correctness(original, optimized, inputs, seeds, opts.check_gradients, opts.reference)
        with_grads = opts.check_gradients and bool(corr.grad_outs)
        dev = infer_device(original, corr.inputs)

        def rerun(model: Callable[..., Any]) -> Run:
            # parameters are looked up on `optimized`: a compiled wrapper prefixes their names
            return run_model(model, named(optimized, corr.shared), corr.inputs, with_grads=with_grads,
                             seed=seeds[0], grad_outputs=corr.grad_outs)

        perf = mem = None
        if opts.check_performance:
            passes = ("fwd", "fwd+bwd") if with_grads else ("fwd",)
            perf, mem = performance(original, optimized, corr.inputs, passes, dict(
                device=dev, warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms, cpu_min_run_time=opts.cpu_min_run_time))
        comp = None
        if opts.check_compile:
            comp = compilation(optimized, corr.inputs, opts.compile_backend, rerun, corr.cand, corr.hi)
        det = None
        if opts.check_determinism and corr.cand is not None:
            try:
                det = determinism(corr.cand, rerun(optimized))
            except Exception as exc:
                det = DeterminismReport(False, 0, [f"second run failed: {short_error(exc, 2000, lines=2)}"])
        return ValidationResult(corr.report, perf, mem, comp, det, device_name(dev))
    finally:
        for m, was_training in modes:
            m.training = was_training


__all__ = ["ValidationOptions", "ValidationResult", "validate_optimization"]
