"""Recompilations of `generate()`: drive a Hugging Face model's generation loop with its forward compiled,
count the compiles of every decode step, name why each recompiled, and verify the fix by generating
again with it (a static KV cache; dynamic=True where the model has none).

A decoder's forward meets two shapes per generation (the prompt, then one token per step) and a KV
cache that grows by one token per step; with the default dynamic cache each growth is a new size, so
Dynamo recompiles until automatic dynamic shapes catch up. `cache_implementation="static"` allocates
the cache at its final length: the decode steps then share one graph.

The forward is compiled with the trace backend (guards and recompiles are Dynamo's decisions, made
before any backend runs) and swapped in on the instance for the duration of the run, so
`generate()` itself runs as the user would call it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import backend_name, compilation_metrics, fresh_dynamo, metrics_room
from kernel_pytorch.assistant.findings import Finding, Report, Severity
from kernel_pytorch.assistant.inputs import leaves
from kernel_pytorch.assistant.locate import definition_location
from kernel_pytorch.assistant.recompiles.causes import failed_guard
from kernel_pytorch.assistant.records import CompileRecord

# forward inputs of a training call that generate() does not take
_NOT_FOR_GENERATE = frozenset({"labels", "decoder_labels", "return_loss"})
_STATIC = {"cache_implementation": "static"}


def has_generate(model: nn.Module) -> bool:
    """Whether `model` has a Hugging Face `generate()` (a `GenerationMixin` with a generation config)."""
    return callable(getattr(model, "generate", None)) and getattr(model, "generation_config", None) is not None


def no_generate_message(model: nn.Module) -> str:
    return f"{type(model).__name__} has no generate(): generation analysis needs a Hugging Face generation model"


@dataclass(frozen=True)
class GenerateRun:
    """One `generate()` with the forward compiled.

    Attributes:
        label: "default" or the fix's name ("static cache", "dynamic=True").
        options: the generate() keyword arguments of the fix ({} for the default).
        steps: the compiles of each forward call, prefill first (step 0), then one per new token.
        tokens: the generated ids (None when it raised).
        error: the short error when generate() raised.
    """

    label: str
    options: Mapping[str, Any]
    steps: tuple[tuple[CompileRecord, ...], ...]
    tokens: torch.Tensor | None
    error: str | None
    seconds: float
    dynamic: bool | None = None

    @property
    def per_step(self) -> list[int]:
        """Recompiles per forward call (0 = prefill)."""
        return [sum(1 for r in step if r.is_recompile) for step in self.steps]

    @property
    def recompiles(self) -> int:
        return sum(self.per_step)

    @property
    def decode_recompiles(self) -> int:
        """Recompiles after the first decode step: what a longer generation keeps paying."""
        return sum(self.per_step[2:])


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers warns about generation settings the analysis chooses on purpose (greedy decoding of a
    random model, a pad token set for it); keep that off stderr."""
    log = logging.getLogger("transformers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def run_generate(
    ctx: AnalysisContext, max_new_tokens: int, label: str = "default", dynamic: bool | None = None, **options: Any
) -> GenerateRun:
    """`generate()` on the example prompt with the forward compiled (trace backend, `dynamic`), greedy,
    exactly `max_new_tokens` new tokens, recording the compiles of each forward call."""
    model = ctx.module
    kwargs = {k: v for k, v in ctx.kwargs.items() if k not in _NOT_FOR_GENERATE}
    config = model.generation_config
    saved_pad = config.pad_token_id
    if saved_pad is None:  # tiny random configs have none; generate() needs one to pad finished rows
        eos = config.eos_token_id
        config.pad_token_id = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    compiled = torch.compile(model.forward, backend=ctx.options.trace_backend, dynamic=dynamic)
    steps: list[tuple[CompileRecord, ...]] = []

    def forward(*args: Any, **kw: Any) -> Any:
        before = len(compilation_metrics())
        try:
            return compiled(*args, **kw)
        finally:
            steps.append(tuple(CompileRecord.of(r, f"step {len(steps)}") for r in compilation_metrics()[before:]))

    shadowed = model.__dict__.get("forward")
    model.forward = forward  # generate() calls self(...), which calls self.forward
    tokens, error = None, None
    start = time.perf_counter()
    try:
        with fresh_dynamo(), metrics_room(8 * max_new_tokens + 64), _quiet_transformers():
            tokens = model.generate(
                *ctx.args,
                **kwargs,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,  # no early end on an EOS: every run has the same steps
                do_sample=False,
                disable_compile=True,  # HF would compile the forward itself with a static cache on GPU
                **options,
            )
    except Exception as exc:
        error = short_error(exc, 400)
    finally:
        if shadowed is None:
            del model.forward
        else:
            model.forward = shadowed
        config.pad_token_id = saved_pad
    return GenerateRun(label, dict(options), tuple(steps), tokens, error, time.perf_counter() - start, dynamic)


_SIZE = re.compile(r"tensor '(.+?)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")


def describe_reason(guard: str) -> str:
    """What a failed guard of a decode step means, in the terms of a generation loop."""
    m = _SIZE.search(guard)
    if m:
        name, dim, old, new = m.group(1), m.group(2), m.group(3), m.group(4)
        short = re.sub(r"^(?:L\['kwargs'\]|kwargs)\['(\w+)'\]", r"\1", name)
        if "past_key_values" in name or "cache" in name.lower():
            return f"the KV cache grows by one token per step (`{short}` dim {dim}: {old} -> {new})"
        if new == "1" and old != "1":
            return f"`{short}` goes from the prompt's {old} tokens to 1 (prefill, then decode; dim {dim})"
        return f"`{short}` dim {dim}: {old} -> {new}"
    if re.match(r"len\((?:L\['kwargs'\]|kwargs)\) == \d+", guard):
        return "prefill and decode pass different keyword arguments, so each has its own graph"
    return f"guard `{guard}`"


def _reasons(run: GenerateRun) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for i, step in enumerate(run.steps):
        for r in step:
            if r.is_recompile and r.recompile_reason:
                out.setdefault(i, []).append(describe_reason(failed_guard(r.recompile_reason)))
    return out


def _static_cache_supported(model: nn.Module) -> bool:
    """transformers 5 says whether a model compiles with a static cache by `_can_compile_fullgraph`,
    4.x by `_supports_static_cache`."""
    return bool(getattr(model, "_can_compile_fullgraph", False) or getattr(model, "_supports_static_cache", False))


def _fixed(run: GenerateRun, before: GenerateRun) -> bool:
    """Verified: it generated, the decode steps compile once, and there are fewer recompiles."""
    return run.error is None and run.decode_recompiles == 0 and run.recompiles < before.recompiles


def analyze_generate(ctx: AnalysisContext, max_new_tokens: int) -> list[Finding]:
    """Recompiles per decode step of `generate()`, with the fix verified by generating again.

    Raises:
        TypeError: the module has no `generate()`.
    """
    model = ctx.module
    if not has_generate(model):
        raise TypeError(no_generate_message(model))
    ctx.progress(f"generate(): {max_new_tokens} new tokens, forward compiled")
    base = run_generate(ctx, max_new_tokens, dynamic=ctx.options.dynamic)
    location = definition_location(model)
    if base.error is not None:
        return [
            Finding(
                id="generate.failed",
                severity=Severity.ERROR,
                title="generate() fails with its forward compiled",
                evidence=base.error,
                location=location,
                suggestion="Run `model.generate(...)` without torch.compile to see whether it fails eagerly too; "
                "if not, report the error above to torch with the model.",
                data={"max_new_tokens": max_new_tokens},
            )
        ]
    attempts: list[GenerateRun] = []
    if base.recompiles:
        attempts = _try_fixes(ctx, max_new_tokens, base)
    return [_finding(ctx, max_new_tokens, base, attempts, location)]


def _try_fixes(ctx: AnalysisContext, n: int, base: GenerateRun) -> list[GenerateRun]:
    attempts: list[GenerateRun] = []
    if _static_cache_supported(ctx.module):
        ctx.progress("generate(): again with a static KV cache")
        attempts.append(run_generate(ctx, n, "static cache", ctx.options.dynamic, **_STATIC))
    if not any(_fixed(a, base) for a in attempts) and ctx.options.dynamic is not True:
        ctx.progress("generate(): again with dynamic=True")
        attempts.append(run_generate(ctx, n, "dynamic=True", True))
    return attempts


_FIX_CODE = {
    "static cache": 'model.generate(..., cache_implementation="static")',
    "dynamic=True": "torch.compile(model, dynamic=True)",
}


def _finding(
    ctx: AnalysisContext, n: int, base: GenerateRun, attempts: Sequence[GenerateRun], location: Any
) -> Finding:
    steps = base.per_step
    data: dict[str, Any] = {
        "max_new_tokens": n,
        "recompiles_per_step": steps,
        "reasons": {str(k): v for k, v in _reasons(base).items()},
        "recompiles_before": base.recompiles,
        "recompiles_after": None,
        "attempts": {a.label: _attempt_data(a, base) for a in attempts},
        "seconds": round(base.seconds, 3),
    }
    if base.recompiles == 0:
        data["recompiles_after"] = 0
        return Finding(
            id="generate.recompiles",
            severity=Severity.INFO,
            title=f"generate(): no recompilation over {n} new tokens",
            evidence=f"compiles per forward call (prefill first): {[len(s) for s in base.steps]}",
            location=location,
            data=data,
        )
    reasons = "; ".join(f"step {k}: {', '.join(v)}" for k, v in _reasons(base).items())
    tried = "; ".join(_attempt_text(a) for a in attempts) or "none applicable"
    best = next((a for a in attempts if _fixed(a, base)), None)
    evidence = f"recompiles per forward call (prefill first): {steps}; {reasons}. Re-run with each fix: {tried}"
    if best is None:
        data["unverified_reason"] = "no fix tried keeps the decode steps on one graph"
        return Finding(
            id="generate.recompiles",
            severity=Severity.WARNING,
            title=f"generate(): {base.recompiles} recompilation(s) over {n} new tokens; no fix verified",
            evidence=evidence,
            location=location,
            suggestion='No verified fix: `TORCH_LOGS="recompiles"` prints every recompilation of the decode loop.',
            data=data,
        )
    data["recompiles_after"] = best.recompiles
    data["fix"] = _FIX_CODE[best.label]
    first = ". Prefill and decode stay two graphs: one recompile at the first decode step" if best.recompiles else ""
    suggestion = (
        '`model.generate(..., cache_implementation="static")` (or once: '
        '`model.generation_config.cache_implementation = "static"`): the KV cache is allocated at its final '
        "length, so every decode step has the same shapes"
        if best.label == "static cache"
        else "`torch.compile(model, dynamic=True)`: the growing cache length is a symbol from the first decode step"
    )
    return Finding(
        id="generate.recompiles",
        severity=Severity.WARNING,
        title=f"generate(): {base.recompiles} recompilation(s) over {n} new tokens; with the {best.label} the "
        "decode steps share one graph (verified)",
        evidence=evidence,
        location=location,
        suggestion=suggestion + first + ".",
        estimated_gain=f"{base.recompiles} -> {best.recompiles} recompiles over {n} new tokens, none per further "
        "decode step (measured by generating again)",
        data=data,
    )


def _attempt_data(run: GenerateRun, base: GenerateRun) -> dict[str, Any]:
    out: dict[str, Any] = {
        "fix": _FIX_CODE.get(run.label, run.label),
        "recompiles_per_step": run.per_step,
        "recompiles": run.recompiles,
        "seconds": round(run.seconds, 3),
    }
    if run.error is not None:
        out["error"] = run.error
    elif run.tokens is not None and base.tokens is not None:
        out["same_tokens"] = bool(run.tokens.shape == base.tokens.shape and torch.equal(run.tokens, base.tokens))
    return out


def _attempt_text(run: GenerateRun) -> str:
    if run.error is not None:
        return f"{run.label}: raised {run.error.splitlines()[0]}"
    reasons = "; ".join(f"step {k}: {', '.join(v)}" for k, v in _reasons(run).items())
    return f"{run.label}: {run.per_step}" + (f" ({reasons})" if reasons else "")


def generate_report(ctx: AnalysisContext, max_new_tokens: int) -> Report:
    """A Report whose recompilations section holds the `generate()` finding (the other sections are not
    analysed: `meta["sections_run"]` says so).

    Raises:
        TypeError: the module has no `generate()`.
    """
    start = time.perf_counter()
    findings = analyze_generate(ctx, max_new_tokens)
    meta = {
        "device": str(ctx.device),
        "dtype": _dtype(ctx),
        "torch": torch.__version__,
        "backend": backend_name(ctx.options.trace_backend),
        "dynamic": ctx.options.dynamic,
        "trace_backend": backend_name(ctx.options.trace_backend),
        "inputs": {ctx.input_name(k): _shape(v) for k, v in leaves(ctx.args, ctx.kwargs)},
        "generate": {"max_new_tokens": max_new_tokens},
        "sections_run": ["recompilations"],
        "seconds": {"recompilations": round(time.perf_counter() - start, 3)},
    }
    return Report(model=ctx.name, meta=meta, recompilations=tuple(findings))


def _dtype(ctx: AnalysisContext) -> str:
    for p in ctx.module.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "no parameters"


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    return type(value).__name__
