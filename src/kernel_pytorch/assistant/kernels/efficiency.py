"""The kernel-efficiency section: what the eager and the compiled model run per step, measured.

From the profiled runs of `AnalysisContext.runtime` (see `assistant.kernels.profile`): kernel count per step and
the top kernels' time share, each attributable kernel's achieved GB/s or TFLOP/s against the device's
measured ceilings (CUDA; on the CPU the ceilings are not measured and only the achieved rates are
given), a launch-bound GPU (idle between short kernels), fallback kernels inside compiled graphs, fp32
matmuls on a GPU that could use TF32 or bf16, SDPA calls that lost their fast path (`sdpa`), and
the compile verdict (`verdict`).
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_pytorch.assistant.findings import Finding, Severity, skipped
from kernel_pytorch.assistant.kernels.profile import RuntimeProfile
from kernel_pytorch.assistant.kernels.profiler import ProfiledRun
from kernel_pytorch.assistant.kernels.sdpa import sdpa_findings
from kernel_pytorch.assistant.kernels.stats import MATMUL_OPS, KernelStat
from kernel_pytorch.assistant.kernels.verdict import verdict_findings
from kernel_pytorch.benchmark.ceilings import Ceilings, roofline

TOP = 8  # kernels listed per run
LAUNCH_IDLE = 0.3  # GPU idle fraction above which a run counts as launch-bound ...
LAUNCH_KERNEL_US = 20.0  # ... when its median kernel is shorter than this
LOW_ROOF_PCT = 30.0  # a top kernel below this % of its roof is flagged
CPU_NOTE = ("on the CPU: the times are the aten ops' CPU times; kernel launches, GPU idle time and "
            "device ceilings need a CUDA device (the ceilings are not measured on the CPU)")


def kernel_row(k: KernelStat, step_ms: float, ceilings: Ceilings | None) -> dict[str, Any]:
    """One kernel as the report shows it: time share of the step, achieved rates, % of the roofs."""
    point = roofline(k.ms_per_call, nbytes=k.nbytes, flops=k.flops, ceilings=ceilings) if k.ms_per_call > 0 else None
    return {
        "name": k.name, "op": k.op, "where": k.where, "calls": round(k.calls, 2), "ms": round(k.ms, 4),
        "share": round(k.ms / step_ms, 4) if step_ms > 0 else None,
        "shapes": [list(s) for s in k.shapes], "dtypes": list(k.dtypes),
        "flops": k.flops, "bytes": k.nbytes,
        "gbps": point.gbps if point else None, "tflops": point.tflops if point else None,
        "pct_of_copy": point.pct_of_copy if point else None, "pct_of_matmul": point.pct_of_matmul if point else None,
        "intensity": point.intensity if point else None, "bound": point.bound if point else "unknown",
    }  # fmt: skip


def _rate_text(row: dict[str, Any]) -> str:
    bits = []
    if row["tflops"] is not None and row["flops"] and row["bound"] != "memory":
        bits.append(f"{row['tflops']:.3g} TFLOP/s" + (f" ({row['pct_of_matmul']:.0f}% of matmul roof)"
                                                      if row["pct_of_matmul"] is not None else ""))
    elif row["gbps"] is not None:
        bits.append(f"{row['gbps']:.3g} GB/s" + (f" ({row['pct_of_copy']:.0f}% of copy roof)"
                                                 if row["pct_of_copy"] is not None else ""))
    return ", ".join(bits)


def _short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _summary(key: str, run: ProfiledRun, rt: RuntimeProfile) -> Finding:
    step = rt.timings[key].median_ms if key in rt.timings else run.wall_ms
    rows = [kernel_row(k, run.kernel_ms, rt.ceilings) for k in run.kernels]
    top = rows[:TOP]
    share = sum(r["ms"] for r in top[:5]) / run.kernel_ms if run.kernel_ms > 0 else 0.0
    listed = "; ".join(
        f"{_short(r['name'])} [{r['where']}] {100 * (r['share'] or 0):.0f}%"
        + (f" at {_rate_text(r)}" if _rate_text(r) else "")
        for r in top[:5]
    )
    kind = "kernels" if run.device_type == "cuda" else "ops doing work"
    # the ops' times are read under the profiler, whose overhead slows them: they are compared with the
    # step as profiled, and the step timed without the profiler is given beside it
    evidence = (f"{run.kernel_count:.0f} {kind} per step, {run.kernel_ms:.3f} ms in them of a {run.wall_ms:.3f} ms "
                f"step under the profiler ({step:.3f} ms median timed without it); the top 5 take "
                f"{100 * share:.0f}% of the ops' time: {listed}")
    if run.device_type != "cuda":
        evidence += f". ({CPU_NOTE})"
    return Finding(
        id="kernel.summary",
        severity=Severity.INFO,
        title=f"{key}: {run.kernel_count:.0f} {kind} per step, top 5 take {100 * share:.0f}% of their time",
        evidence=evidence,
        data={"run": key, "device_type": run.device_type, "steps_profiled": run.steps, "step_ms": step,
              "profiled_step_ms": run.wall_ms,
              "kernel_count": run.kernel_count, "kernel_ms": run.kernel_ms, "top5_share": share,
              "kernels": rows[: 3 * TOP], "measured": True,
              "ceilings": None if rt.ceilings is None else {
                  "copy_gbps": rt.ceilings.copy_gbps, "matmul_tflops": rt.ceilings.matmul_tflops,
                  "matmul_dtype": rt.ceilings.matmul_dtype, "device": rt.ceilings.device,
                  "provenance": rt.ceilings.provenance}},
    )


def _low_roof(key: str, run: ProfiledRun, rt: RuntimeProfile) -> Finding | None:
    """Top kernels (>= 10% of the kernel time) far below their roof (CUDA, ceilings measured)."""
    if rt.ceilings is None or run.device_type != "cuda" or run.kernel_ms <= 0:
        return None
    low = []
    for k in run.kernels[:TOP]:
        row = kernel_row(k, run.kernel_ms, rt.ceilings)
        pct = row["pct_of_matmul"] if row["bound"] == "compute" else row["pct_of_copy"]
        if (row["share"] or 0) >= 0.1 and pct is not None and pct < LOW_ROOF_PCT:
            low.append((row, pct))
    if not low:
        return None
    text = "; ".join(f"{_short(r['name'])} {100 * r['share']:.0f}% of the time at {_rate_text(r)}" for r, _ in low)
    gain = sum(r["ms"] * (1 - pct / LOW_ROOF_PCT) for r, pct in low)
    return Finding(
        id="kernel.below-roof",
        severity=Severity.WARNING,
        title=f"{key}: {len(low)} of the top kernels run below {LOW_ROOF_PCT:.0f}% of their measured roof",
        evidence=f"{text}. Roofs measured on this device: copy {rt.ceilings.copy_gbps:.0f} GB/s, "
        f"{rt.ceilings.matmul_dtype} matmul {rt.ceilings.matmul_tflops:.0f} TFLOP/s ({rt.ceilings.provenance})",
        suggestion="small or odd shapes leave the GPU idle: batch more work per call, pad matmul dims to "
        "multiples of 64, or fuse the memory-bound ops (torch.compile; see the fusion section)",
        estimated_gain=f"up to {gain:.3f} ms per step if they reached {LOW_ROOF_PCT:.0f}% of the roof (estimated)",
        data={"run": key, "kernels": [r for r, _ in low], "gain_ms": gain, "measured": False},
    )


def _launch_bound(key: str, run: ProfiledRun) -> Finding | None:
    gpu = run.gpu
    if gpu is None or gpu.idle_fraction < LAUNCH_IDLE or gpu.median_kernel_us > LAUNCH_KERNEL_US:
        return None
    idle_ms = gpu.span_ms - gpu.busy_ms
    compiled = key.startswith("compiled")
    fix = ('compile with `torch.compile(model, mode="reduce-overhead")` (CUDA graphs: one launch per graph)'
           if compiled else 'compile it (`torch.compile(model, mode="reduce-overhead")`: fewer kernels, '
           "launched from a CUDA graph), or capture the step with torch.cuda.graphs")
    return Finding(
        id="kernel.launch-bound",
        severity=Severity.WARNING,
        title=f"{key}: launch-bound, the GPU is idle {100 * gpu.idle_fraction:.0f}% of the step between short kernels",
        evidence=f"{run.kernel_count:.0f} kernels per step, median {gpu.median_kernel_us:.1f} µs; the GPU is busy "
        f"{gpu.busy_ms:.3f} ms of a {gpu.span_ms:.3f} ms span: the host cannot launch kernels as fast as they run",
        suggestion=fix,
        estimated_gain=f"up to {idle_ms:.3f} ms per step, the idle time (estimated)",
        data={"run": key, "idle_fraction": gpu.idle_fraction, "busy_ms": gpu.busy_ms, "span_ms": gpu.span_ms,
              "median_kernel_us": gpu.median_kernel_us, "gain_ms": idle_ms, "measured": False},
    )


def _fallbacks(key: str, run: ProfiledRun) -> Finding | None:
    falls = [k for k in run.kernels if k.where == "fallback"]
    if not falls:
        return None
    ms = sum(k.ms for k in falls)
    ops = list(dict.fromkeys(k.op or k.name for k in falls))
    return Finding(
        id="kernel.fallback",
        severity=Severity.WARNING if run.kernel_ms > 0 and ms / run.kernel_ms >= 0.05 else Severity.INFO,
        title=f"{key}: {len(ops)} op(s) fall back to aten kernels inside the compiled graph",
        evidence=f"{', '.join(ops[:8])}{' ...' if len(ops) > 8 else ''}: {ms:.3f} ms per step "
        f"({100 * ms / max(run.kernel_ms, 1e-9):.0f}% of the kernel time). Inductor generated no code for them, "
        "so nothing fuses across them",
        suggestion="replace the op with ones Inductor lowers (or a kernel_pytorch component), or keep it out of "
        "the hot path; `TORCH_LOGS=output_code` shows the fallback calls in the generated code",
        estimated_gain=None,
        data={"run": key, "ops": ops, "ms": ms, "kernels": [k.name for k in falls[:TOP]], "measured": True},
    )


def _fp32_matmuls(key: str, run: ProfiledRun, rt: RuntimeProfile) -> Finding | None:
    """fp32 matmuls on a GPU running at full fp32 precision (TF32 off)."""
    if run.device_type != "cuda" or torch.get_float32_matmul_precision() != "highest":
        return None
    mms = [k for k in run.kernels if k.base_op in MATMUL_OPS and k.dtypes and k.dtypes[-1] == "float"]
    if not mms:
        return None
    ms = sum(k.ms for k in mms)
    flops = sum((k.flops or 0) * k.calls for k in mms)
    est = None
    if rt.ceilings is not None and flops:
        est = max(ms - flops / (0.5 * rt.ceilings.matmul_tflops * 1e12) * 1e3, 0.0)
    return Finding(
        id="kernel.fp32-matmul",
        severity=Severity.WARNING,
        title=f"{key}: {sum(k.calls for k in mms):.0f} fp32 matmuls per step run without TF32 or bf16",
        evidence=f"{ms:.3f} ms per step in fp32 matmuls ({100 * ms / max(run.kernel_ms, 1e-9):.0f}% of the kernel "
        "time); torch.get_float32_matmul_precision() is 'highest'",
        suggestion='`torch.set_float32_matmul_precision("high")` (TF32, ~1e-3 relative error), or run the model in '
        "bf16 (`model.to(torch.bfloat16)` or `torch.autocast('cuda', torch.bfloat16)`)",
        estimated_gain=(f"about {est:.3f} ms per step at half the measured {rt.ceilings.matmul_dtype} matmul roof "
                        "(estimated)") if est is not None and rt.ceilings else None,
        data={"run": key, "ms": ms, "gain_ms": est, "measured": False},
    )


def analyze_kernels(ctx: Any) -> list[Finding]:
    """The kernel-efficiency findings (see the module docstring); the profiling runs come from
    `ctx.runtime`, the SDPA calls from one eager forward."""
    if not ctx.options.kernel_profile:
        return [skipped("kernel", "Kernel profiling is off",
                        "options.kernel_profile is False (--no-profile): nothing was timed or profiled")]
    rt: RuntimeProfile = ctx.runtime
    out: list[Finding] = []
    for key, run in rt.runs.items():
        out.append(_summary(key, run, rt))
        for check in (_launch_bound(key, run), _fallbacks(key, run), _fp32_matmuls(key, run, rt),
                      _low_roof(key, run, rt)):
            if check is not None:
                out.append(check)
    ctx.progress("checking attention calls for lost fast paths")
    out += sdpa_findings(ctx)
    out += verdict_findings(ctx, rt)
    for key, why in {**rt.errors, **rt.skipped}.items():
        out.append(Finding(id="kernel.not-measured", severity=Severity.INFO, title=f"{key}: not measured",
                           evidence=why, data={"run": key}))
    if rt.trace_path:
        out.append(Finding(id="kernel.trace", severity=Severity.INFO, title=f"Chrome trace written to {rt.trace_path}",
                           evidence=f"the profiled runs ({', '.join(rt.runs)}) side by side; open it in "
                           "https://ui.perfetto.dev or chrome://tracing", data={"path": rt.trace_path}))
    return out


__all__ = ["analyze_kernels", "kernel_row"]
