"""`CompilerOptimizationAssistant`: run every analysis on a component and collect a `Report`.

from kernel_pytorch.assistant import AnalysisOptions, CompilerOptimizationAssistant
options = AnalysisOptions(measure_compile_time=False)
report = CompilerOptimizationAssistant(options, device="cpu").analyze_component(model, (x,))
for finding in report.compilation_readiness:
    print(finding.location, finding.title, finding.suggestion)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from kernel_pytorch._tree import as_inputs, move, split_inputs, tensors
from kernel_pytorch.assistant.compile_time.compile_time import analyze_compile_time
from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.dynamo import backend_name
from kernel_pytorch.assistant.findings import SECTIONS, Finding, Report, Severity, skipped, sort_findings
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.assistant.inputs import prepare
from kernel_pytorch.assistant.isolation import Snapshot
from kernel_pytorch.assistant.kernels.efficiency import analyze_kernels
from kernel_pytorch.assistant.memory.memory import analyze_memory
from kernel_pytorch.assistant.readiness.readiness import analyze_readiness, nothing_compiled
from kernel_pytorch.assistant.recompiles.recompiles import analyze_recompilations
from kernel_pytorch.assistant.recompiles.sweep import shape_sweep
from kernel_pytorch.assistant.report.suggestions import analyze_suggestions

Analysis = Callable[[AnalysisContext], list[Finding]]


@dataclass(frozen=True)
class _Step:
    section: str
    name: str
    run: Analysis
    needs_graphs: bool = False  # skipped, and said why, when Dynamo compiled nothing


# Report order is fixed by the Report; this is the run order. Compile time runs before the sweep so
# recompilation findings can quote what one full compile costs, and before the kernel profile, which
# measures the compiled forward inside that compile. The kernel profile runs before the memory analysis,
# which prices recompute in the step time it measured. The suggestions rank every other section's
# findings, so they run last.
STEPS: tuple[_Step, ...] = (
    _Step("compilation_readiness", "compilation readiness", analyze_readiness),
    _Step("compile_time", "compile time", analyze_compile_time),
    _Step("recompilations", "recompilations", analyze_recompilations, needs_graphs=True),
    _Step("fusion_opportunities", "fusion opportunities", analyze_fusion),
    _Step("kernel_efficiency", "kernel efficiency", analyze_kernels),
    _Step("memory_bottlenecks", "memory bottlenecks", analyze_memory),
    _Step("optimization_suggestions", "optimization suggestions", analyze_suggestions),
)


def check_sections(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """The section names as given, checked against `SECTIONS` (None: every section).

    Raises:
        ValueError: an unknown name; the message lists the valid ones.
    """
    if names is None:
        return None
    bad = [n for n in names if n not in SECTIONS]
    if bad:
        raise ValueError(f"unknown section(s) {', '.join(map(repr, bad))}; valid sections: {', '.join(SECTIONS)}")
    return tuple(names)


class CompilerOptimizationAssistant:
    """Analyse a model (or any nn.Module component) for torch.compile: graph breaks, recompilations,
    compile time, fusion opportunities, memory of a training step, kernel efficiency and the compile
    verdict, and the fixes of all of them ranked.

    `CompilerOptimizationAssistant(AnalysisOptions(measure_compile_time=False)).analyze_component(model, (x,))`

    Args:
        options: what to analyse and how (`AnalysisOptions`: backend, mode, dynamic, shapes, input dims,
            compile-time and kernel-profile switches, ...); None: the defaults.
        device: move the module and the inputs' tensors here first (None: leave them where they are).
        dtype: cast floating parameters and floating input tensors to this dtype first (None: keep).
        sections: run only these sections' analyses (names from `SECTIONS`; None: all).
        progress: called with a short description before each expensive step.
    Raises:
        TypeError: options that are no `AnalysisOptions`, or one of its fields given as a keyword (the
            message shows the options form).
    """

    def __init__(
        self,
        options: AnalysisOptions | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        sections: Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None,
        **moved: Any,
    ) -> None:
        if moved:
            raise TypeError(_moved_message(moved))
        if options is not None and not isinstance(options, AnalysisOptions):
            raise TypeError(f"options must be an AnalysisOptions, got {type(options).__name__}")
        self.sections = check_sections(sections)
        self.device = device
        self.dtype = dtype
        self.progress = progress
        options = options or AnalysisOptions()
        # (the compile-time analysis measures the compiled forward only for the kernel section)
        if options.kernel_profile and self.sections is not None and "kernel_efficiency" not in self.sections:
            options = replace(options, kernel_profile=False)
        self.options = options

    def context(
        self,
        module: nn.Module,
        example_inputs: Any,
        *,
        name: str | None = None,
        extra_inputs: Sequence[Any] = (),
    ) -> AnalysisContext:
        """The analysis context for `module` (on the assistant's device and dtype), for running single
        analyses: `analyze_readiness(assistant.context(model, (x,)))`."""
        args, kwargs = split_inputs(example_inputs)
        module, args, kwargs = prepare(module, args, kwargs, self.device, self.dtype)
        extra = [move(as_inputs(inputs), self.device, self.dtype) for inputs in extra_inputs]
        return AnalysisContext(
            module,
            args,
            kwargs,
            options=self.options,
            name=name,
            progress=self.progress,
            extra_inputs=extra,
        )

    def analyze_component(
        self,
        module: nn.Module,
        example_inputs: Any,
        *,
        name: str | None = None,
        extra_inputs: Sequence[Any] = (),
    ) -> Report:
        """Run every analysis on `module` called with `example_inputs`.

        Args:
            module: the model or component; it is called as `module(*args)` or `module(**kwargs)`.
            example_inputs: a tuple of positional arguments, a dict of keyword arguments, or a tensor.
            name: how the report names the component (default: its class name).
            extra_inputs: more calls for the recompilation sweep, each like `example_inputs`.
        Returns:
            A Report; an analysis that raises becomes an ERROR finding in its section.
        """
        ctx = self.context(module, example_inputs, name=name, extra_inputs=extra_inputs)
        sections: dict[str, list[Finding]] = {}
        ctx.findings = sections  # the suggestions rank what the analyses before them found
        seconds: dict[str, float] = {}
        # the process and the model as the caller left them, put back after every analysis: each one
        # starts from the caller's state (BatchNorm statistics, config, threads, RNG) and leaves no trace
        saved = Snapshot.take(ctx.module)
        start = time.perf_counter()
        for step in STEPS:
            if self.sections is not None and step.section not in self.sections:
                continue
            t0 = time.perf_counter()
            try:
                found = [_nothing_compiled(step)] if step.needs_graphs and nothing_compiled(ctx) else step.run(ctx)
            except Exception as exc:  # an analyser bug must not hide the other sections
                found = [_analysis_failed(step, exc)]
            finally:
                saved.restore()
            sections.setdefault(step.section, []).extend(found)
            seconds[step.section] = round(time.perf_counter() - t0, 3)
        meta = {
            "device": str(ctx.device),
            "dtype": _dtype_text(ctx),
            "torch": torch.__version__,
            "backend": backend_name(self.options.backend),
            "mode": self.options.mode,
            "dynamic": self.options.dynamic,
            "trace_backend": backend_name(self.options.trace_backend),
            "inputs": _describe_inputs(ctx),
            "sweep": {k: list(v) for k, v in shape_sweep(ctx).sizes.items()},
            "seconds": {**seconds, "total": round(time.perf_counter() - start, 3)},
            "sections_run": [name for name in SECTIONS if name in sections],
        }
        return Report(
            model=ctx.name,
            meta=meta,
            **{section: sort_findings(found) for section, found in sections.items()},
        )

    def analyze_generate(
        self, module: nn.Module, example_inputs: Any, *, max_new_tokens: int = 8, name: str | None = None
    ) -> Report:
        """Recompilations of a Hugging Face model's `generate()` for `max_new_tokens` new tokens, per
        decode step, with the fix (a static KV cache, else dynamic=True) verified by generating again.

        Args:
            module: a model with `generate()` (a transformers `GenerationMixin`).
            example_inputs: the prompt, as for `analyze_component` (`labels` is dropped).
        Returns:
            A Report with one `generate.*` finding in its recompilations section.
        Raises:
            TypeError: the module has no `generate()`.
        """
        from kernel_pytorch.assistant.recompiles.generate import generate_report, has_generate, no_generate_message

        if not has_generate(module):
            raise TypeError(no_generate_message(module))
        ctx = self.context(module, example_inputs, name=name)
        saved = Snapshot.take(ctx.module)
        try:
            return generate_report(ctx, max_new_tokens)
        finally:
            saved.restore()


def _moved_message(moved: dict[str, Any]) -> str:
    """What to write instead of keywords that are `AnalysisOptions` fields (or no argument at all)."""
    names = {f.name for f in fields(AnalysisOptions)}
    unknown = [k for k in moved if k not in names]
    if unknown:
        return f"CompilerOptimizationAssistant() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}"
    given = ", ".join(f"{k}={v!r}" for k, v in moved.items())
    return (f"{', '.join(moved)} {'is an AnalysisOptions field' if len(moved) == 1 else 'are AnalysisOptions fields'}: "
            f"CompilerOptimizationAssistant(AnalysisOptions({given}))")


def _analysis_failed(step: _Step, exc: Exception) -> Finding:
    return Finding(
        id=f"analysis-error.{step.section}",
        severity=Severity.ERROR,
        title=f"The {step.name} analysis itself failed",
        evidence=f"{type(exc).__name__}: {exc}",
        suggestion="This is a fault of the analyser, not of the model; the other sections are unaffected.",
    )


def _nothing_compiled(step: _Step) -> Finding:
    prefix = {"recompilations": "recompile"}.get(step.section, step.section)
    return skipped(prefix, f"{step.name.capitalize()} not analysed: nothing was compiled",
                   "Dynamo gave up on every frame, so the model runs eagerly (see compilation readiness); "
                   "there is nothing to recompile until a frame compiles")


def _param_dtype(module: nn.Module) -> torch.dtype | None:
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def _dtype_text(ctx: AnalysisContext) -> str:
    """The parameters' floating dtype; for a model without any, the inputs' ("no parameters" if none)."""
    dtype = _param_dtype(ctx.module)
    if dtype is None:
        dtype = next((t.dtype for t in tensors((ctx.args, ctx.kwargs)) if t.is_floating_point()), None)
    return str(dtype).replace("torch.", "") if dtype is not None else "no parameters"


def _describe_inputs(ctx: AnalysisContext) -> dict[str, str]:
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
        return type(v).__name__ + (f" = {v}" if isinstance(v, (int, float, bool, str)) else "")

    out = {ctx.input_names.get(i, f"args[{i}]"): one(a) for i, a in enumerate(ctx.args)}
    out.update({k: one(v) for k, v in ctx.kwargs.items()})
    return out
