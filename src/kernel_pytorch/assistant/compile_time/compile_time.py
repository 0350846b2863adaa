"""Compile time: where a cold `torch.compile` spends its seconds, and how to spend fewer.

The numbers are torch's own: the per-frame CompilationMetrics Dynamo records (cumulative microseconds
for Dynamo, AOTAutograd, Inductor, its code generation and the Triton/C++ kernel compile), the
`dynamo_timed` regions, and the cache counters. Nested totals are turned into exclusive phases:

    Dynamo tracing   = frame total      - backend compile
    cache key setup  = hashing of torch/Triton sources (once per process), inside the backend compile
    AOTAutograd      = backend compile  - Inductor - cache key setup
    Inductor lowering = Inductor        - code generation - autotuning
    code generation  = code generation  - kernel compilation
    waiting for kernel compiles (Triton on GPU, C++ on CPU; they start during code generation and
    run in parallel workers), autotuning

so the phases add up to the frame total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.config

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.compile_time.regional import RepeatedBlocks, find_repeated_blocks, regional_finding
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import backend_name
from kernel_pytorch.assistant.findings import Finding, Severity, skipped
from kernel_pytorch.assistant.locate import error_location
from kernel_pytorch.assistant.records import CompileProfile

__all__ = ["Phase", "RepeatedBlocks", "analyze_compile_time", "find_repeated_blocks", "mode_advice", "phases"]


@dataclass(frozen=True)
class Phase:
    """One exclusive compile phase: key, label for humans, seconds."""

    key: str
    label: str
    seconds: float


def _sum(records: Sequence[Mapping[str, Any]], us_field: str, s_field: str | None = None) -> float:
    """Seconds of `us_field` (microseconds) summed over frames, falling back to the older seconds field."""
    total = 0.0
    for r in records:
        us = r.get(us_field)
        if us is not None:
            total += us / 1e6
        elif s_field is not None and r.get(s_field) is not None:
            total += float(r[s_field])
    return total


def phases(profile: CompileProfile, device_type: str = "cpu") -> tuple[list[Phase], float]:
    """Exclusive compile phases and the total they add up to (seconds), from torch's metrics."""
    # only frame compiles count, each one's nested times clamped to the time that holds them: a record
    # without a frame time, or a nested time above its frame's, is not this frame's (an order-dependent
    # test run saw 4.7 s of backend time in a 0.16 s frame), and the phases must add up to the total
    recs = [r for r in profile.records
            if _sum([r], "dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s") > 0]
    total = backend = inductor = codegen = 0.0
    for r in recs:
        t = _sum([r], "dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s")
        b = min(_sum([r], "aot_autograd_cumulative_compile_time_us", "backend_compile_time_s"), t)
        i = min(_sum([r], "inductor_cumulative_compile_time_us", "inductor_compile_time_s"), b)
        c = min(_sum([r], "inductor_code_gen_cumulative_compile_time_us", "code_gen_time_s"), i)
        total, backend, inductor, codegen = total + t, backend + b, inductor + i, codegen + c
    kernels = min(_sum(recs, "triton_compile_time_us"), codegen)
    autotune = _sum(recs, "compile_time_autotune_time_us")
    # hashing torch's and Triton's sources for the cache keys: inside the backend call, outside Inductor
    keys = sum(v for k, v in profile.timed.items() if k.endswith(("torch_key", "triton_key")))
    keys = min(keys, max(backend - inductor, 0.0))

    def clamp(x: float) -> float:
        return max(x, 0.0)

    lowering = inductor - codegen
    autotune_in_lowering = min(autotune, clamp(lowering))
    # autotuning not inside lowering happened while generating code (Triton's own autotuner)
    autotune_in_codegen = autotune - autotune_in_lowering
    name = backend_name(profile.backend)
    is_aot = name in ("inductor", "aot_eager", "aot_eager_decomp_partition", "aot_inductor") or inductor > 0
    # torch measures the wait for the asynchronous kernel compiles; the compiles themselves start during
    # code generation and overlap it
    kernel_label = "waiting for " + ("Triton" if device_type == "cuda" else "C++/Triton") + " kernel compiles"
    out = [
        Phase("dynamo", "Dynamo tracing (bytecode -> FX graph, guards)", clamp(total - backend)),
        Phase("cache_keys", "cache key setup (once per process)", keys),
        Phase(
            "aot_autograd",
            "AOTAutograd (functionalisation, decompositions)" if is_aot else "backend compile",
            clamp(backend - inductor - keys),
        ),
        Phase("inductor_lowering", "Inductor lowering and scheduling", clamp(lowering - autotune_in_lowering)),
        Phase("autotune", "autotuning", autotune),
        Phase(
            "inductor_codegen",
            "Inductor code generation",
            clamp(codegen - kernels - autotune_in_codegen),
        ),
        Phase("kernel_compile", kernel_label, kernels),
    ]
    return out, total


_ADVICE: dict[str, str] = {
    "dynamo": "Dynamo traces Python bytecode once per frame and per recompilation: fewer graph breaks mean "
    "fewer frames, and `torch._dynamo.mark_dynamic` on the sizes that vary avoids tracing again per shape.",
    "cache_keys": "Hashing torch's and Triton's sources for the cache keys is paid once per process; a "
    "long-lived process (a server, a training job) pays it once.",
    "aot_autograd": "AOTAutograd traces through torch's dispatcher. Run inference under torch.no_grad() or "
    "torch.inference_mode() (no joint forward-backward graph), and keep the AOTAutograd cache on "
    "(`torch._functorch.config.enable_autograd_cache = True`).",
    "inductor_lowering": "Inductor's lowering and scheduling scale with graph size; mode='max-autotune' adds "
    "benchmarking here, so use the default mode while iterating.",
    "autotune": "Autotuning benchmarks kernel choices (mode='max-autotune'). Use the default mode while "
    "iterating, or 'max-autotune-no-cudagraphs'; keep TORCHINDUCTOR_CACHE_DIR on persistent disk so "
    "the tuned choices are reused.",
    "inductor_codegen": "Generating and loading kernel source scales with the number of distinct kernels; the "
    "FX graph cache (`torch._inductor.config.fx_graph_cache = True`, the default) skips this on warm starts.",
    "kernel_compile": "Compiling the generated kernels dominates. Warm starts skip it through the FX graph "
    "and Triton caches (keep TORCHINDUCTOR_CACHE_DIR on persistent disk; ship them with "
    "torch.compiler.save_cache_artifacts / load_cache_artifacts); "
    "torch._inductor.config.compile_threads sets the parallelism.",
}

# what regional compilation (its own finding, `compile-time.regional`, when the model has repeated
# blocks) saves per phase; "{blocks}" names the blocks as that finding's title does
_REGIONAL: dict[str, str] = {
    "dynamo": "Regional compilation of the {blocks} traces one block instead of every copy.",
    "aot_autograd": "Regional compilation of the {blocks} traces one block instead of every copy.",
    "inductor_lowering": "Regional compilation of the {blocks} lowers one block instead of each copy.",
    "inductor_codegen": "Regional compilation of the {blocks} emits one block's kernels once.",
}


def analyze_compile_time(ctx: AnalysisContext) -> list[Finding]:
    """Seconds per compile phase for one cold compile with the real backend, cache hits, advice."""
    if not ctx.options.measure_compile_time:
        return [_skipped("compile-time measurement was turned off")]
    if not ctx.eager.ok:
        return [_skipped("the model does not run eagerly on its example inputs")]
    profile = ctx.profile
    backend = backend_name(profile.backend)
    if profile.error is not None:
        return [
            Finding(
                id="compile-time.failed",
                severity=Severity.ERROR,
                title=f"torch.compile(backend={backend!r}) fails on this model",
                evidence=short_error(profile.error),
                location=error_location(profile.error, ctx.module),
                suggestion="If tracing works (see compilation readiness) the backend is failing: compare "
                "backend='aot_eager' (no Inductor) to locate it; Inductor on CPU needs a working C++ "
                "compiler, on GPU a working Triton.",
                data={"error_type": type(profile.error).__name__},
            )
        ]
    if profile.records and all(r.get("fail_type") for r in profile.records):
        return [_nothing_compiled(profile)]
    ps, total = phases(profile, ctx.device.type)
    blocks = find_repeated_blocks(ctx.module)
    findings: list[Finding] = []
    frames = len(profile.records)
    run_s = max(profile.first_call_s - total, 0.0)
    breakdown = ", ".join(
        f"{p.label} {p.seconds:.2f} s ({100 * p.seconds / total:.0f}%)" for p in ps if p.seconds > 0 and total
    )
    steady = f"; steady-state call {1e3 * profile.steady_call_s:.1f} ms" if profile.steady_call_s else ""
    workers = profile.timed.get("compile_file")
    parallel = f" Kernel compiles used {workers:.1f} s of worker time in parallel." if workers else ""
    cache_hit = any(profile.counters.get(g, {}).get(k) for g, k in _HITS)
    warm = " Warm caches: the backend phases were mostly cache loads." if cache_hit else ""
    findings.append(
        Finding(
            id="compile-time.phases",
            severity=Severity.INFO,
            title=f"Compile with {backend}: {total:.1f} s over {frames} frame(s)"
            + (" (cache hits: a first-ever compile takes longer)" if cache_hit else ""),
            evidence=f"{breakdown or 'no compile recorded'}. First call {profile.first_call_s:.1f} s "
            f"(compile + {run_s:.2f} s running){steady}.{parallel}{warm}",
            data={
                "backend": backend,
                "mode": profile.mode,
                "total_s": round(total, 4),
                "first_call_s": round(profile.first_call_s, 4),
                "steady_call_s": round(profile.steady_call_s, 6) if profile.steady_call_s else None,
                "frames": frames,
                "cache_hit": cache_hit,
                "kernel_compile_worker_s": round(workers, 4) if workers else None,
                "phases": {p.key: round(p.seconds, 4) for p in ps},
                "phase_labels": {p.key: p.label for p in ps},
            },
        )
    )
    if total > 0:
        slowest = max(ps, key=lambda p: p.seconds)
        share = slowest.seconds / total
        regional = (
            " " + _REGIONAL[slowest.key].format(blocks=f"{blocks.count} identical `{blocks.block_type}` blocks")
            if blocks and slowest.key in _REGIONAL
            else ""
        )
        findings.append(
            Finding(
                id="compile-time.slowest-phase",
                severity=Severity.WARNING if slowest.seconds > 30 else Severity.INFO,
                title=f"Slowest phase: {slowest.label}, {slowest.seconds:.1f} s ({100 * share:.0f}%)",
                evidence=f"of {total:.1f} s total compile time with backend={backend}"
                + (f", mode={profile.mode}" if profile.mode else ""),
                suggestion=_ADVICE[slowest.key] + regional,
                data={"phase": slowest.key, "seconds": round(slowest.seconds, 4), "share": round(share, 4)},
            )
        )
    findings.append(_cache_finding(profile))
    autotune = next(p.seconds for p in ps if p.key == "autotune")
    mode = mode_advice(profile.mode, ctx.device.type, autotune, total)
    if mode is not None:
        findings.append(mode)
    if blocks is not None:
        findings.append(regional_finding(blocks, sum(p.seconds for p in ps if p.key != "cache_keys"), total))
    return findings


def _nothing_compiled(profile: CompileProfile) -> Finding:
    """Dynamo gave up on every frame: the seconds it spent, and no advice (there is no compile to cut)."""
    backend = backend_name(profile.backend)
    spent = _sum(profile.records, "dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s")
    steady = f"; steady-state call {1e3 * profile.steady_call_s:.1f} ms" if profile.steady_call_s else ""
    return Finding(
        id="compile-time.nothing-compiled",
        severity=Severity.INFO,
        title=f"Nothing compiled with {backend}: every frame fell back to eager",
        evidence=f"Dynamo spent {spent:.2f} s on {len(profile.records)} frame(s) before giving up (see "
        f"compilation readiness). First call {profile.first_call_s:.2f} s{steady}, all of it eager.",
        data={
            "backend": backend,
            "frames": len(profile.records),
            "dynamo_s": round(spent, 4),
            "first_call_s": round(profile.first_call_s, 4),
            "steady_call_s": round(profile.steady_call_s, 6) if profile.steady_call_s else None,
        },
    )


_HITS = (("inductor", "fxgraph_cache_hit"), ("aot_autograd", "autograd_cache_hit"))


def _cache_finding(profile: CompileProfile) -> Finding:
    inductor = profile.counters.get("inductor", {})
    aot = profile.counters.get("aot_autograd", {})
    fx = {k: inductor.get(f"fxgraph_cache_{k}", 0) for k in ("hit", "miss", "bypass")}
    ag = {k: aot.get(f"autograd_cache_{k}", 0) for k in ("hit", "miss", "bypass")}
    enabled = bool(getattr(torch._inductor.config, "fx_graph_cache", True))
    evidence = (
        f"FX graph cache: {fx['hit']} hit(s), {fx['miss']} miss(es), {fx['bypass']} bypass(es); "
        f"AOTAutograd cache: {ag['hit']} hit(s), {ag['miss']} miss(es), {ag['bypass']} bypass(es)"
    )
    data = {"fx_graph_cache": fx, "aot_autograd_cache": ag, "fx_graph_cache_enabled": enabled}
    if not enabled:
        return Finding(
            id="compile-time.cache",
            severity=Severity.WARNING,
            title="The Inductor FX graph cache is off: every process recompiles from scratch",
            evidence=evidence,
            suggestion="Turn it on: `torch._inductor.config.fx_graph_cache = True` (or unset "
            "TORCHINDUCTOR_FX_GRAPH_CACHE=0).",
            data=data,
        )
    if sum(fx.values()) + sum(ag.values()) == 0:
        return Finding(
            id="compile-time.cache",
            severity=Severity.INFO,
            title="No compile cache was consulted (the backend does not use Inductor's caches)",
            evidence=evidence,
            data=data,
        )
    if fx["hit"] or ag["hit"]:
        title = "Warm start: the compile reused cached graphs"
        suggestion = "A cold machine pays more; ship the caches with torch.compiler.save_cache_artifacts()."
    else:
        title = "Cold start: every graph missed the compile caches"
        suggestion = (
            "The next process on this machine reuses them (keep TORCHINDUCTOR_CACHE_DIR on persistent "
            "disk); to warm other machines, save them with torch.compiler.save_cache_artifacts() and load "
            "them with torch.compiler.load_cache_artifacts()."
        )
    return Finding(
        id="compile-time.cache",
        severity=Severity.INFO,
        title=title,
        evidence=evidence,
        suggestion=suggestion,
        data=data,
    )


def mode_advice(mode: str | None, device_type: str, autotune_s: float, total_s: float) -> Finding | None:
    """What the torch.compile mode costs and buys on this device; None when there is nothing to say."""
    if mode is not None and "max-autotune" in mode:
        share = f" ({100 * autotune_s / total_s:.0f}% of the compile)" if total_s else ""
        return Finding(
            id="compile-time.mode",
            severity=Severity.INFO,
            title=f"mode={mode!r} spent {autotune_s:.1f} s autotuning{share}",
            evidence="max-autotune benchmarks GEMM/convolution choices and kernel configs while compiling",
            suggestion="Iterate with the default mode and build the deployed model with max-autotune; keep "
            "TORCHINDUCTOR_CACHE_DIR on persistent disk so the tuned choices are reused.",
            data={"mode": mode, "autotune_s": round(autotune_s, 4)},
        )
    if mode == "reduce-overhead" and device_type != "cuda":
        return Finding(
            id="compile-time.mode",
            severity=Severity.WARNING,
            title=f"mode='reduce-overhead' does nothing on {device_type}: it captures CUDA graphs",
            evidence=f"the model runs on {device_type}",
            suggestion="Use the default mode off the GPU.",
            data={"mode": mode},
        )
    if mode is None and device_type == "cuda":
        return Finding(
            id="compile-time.mode",
            severity=Severity.INFO,
            title="Default mode: no autotuning, no CUDA graphs",
            evidence="compiled with torch.compile's default mode",
            suggestion="For the deployed model try mode='max-autotune' (longer compile, often faster GEMMs "
            "and kernels) and, for small launch-bound batches, mode='reduce-overhead' (CUDA graphs); "
            "re-run this analysis with --mode to see the compile-time cost.",
            data={"mode": None},
        )
    return None


def _skipped(why: str) -> Finding:
    return skipped("compile-time", "Compile time not measured", why)
