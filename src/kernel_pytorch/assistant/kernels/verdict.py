"""The compile verdict: compile the model or not, from the measured eager and compiled step times
(forward, and forward+backward when the model trains), the measured compile time, and the number of
steps after which compiling pays off. Never assumed: a pass not measured gets no verdict.

A difference counts only when the q20-q80 bands of the two timings do not overlap (`speedup`'s low and
high bounds both on one side of 1.0). Bands that overlap give "no measurable difference" only when the
speedup's whole band lies within 1 / `NO_DIFFERENCE_BAND` .. `NO_DIFFERENCE_BAND`, so that the timing
rules out a larger difference; wider, they give "could not measure reliably" with the range: such a
timing could not have told a real difference either (measured on the GPU over the verdict corpus,
benchmarks/results/verdict_agreement_h100.md: overlapping bands up to 0.91x-1.74x had been called
"no difference" where the careful timing found 1.21x). A CPU timing whose
rounds mostly waited for a CPU (other processes on its cores; `benchmark.paired.paired_cpu`) is "could not measure
reliably" too, however narrow its bands: it timed the scheduler.
"""

from __future__ import annotations

import math
from typing import Any

from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.assistant.kernels.profile import RuntimeProfile
from kernel_pytorch.benchmark.timer import Timing, speedup

# "no difference" needs the speedup's band within 1/this .. this: the timing excludes a larger gain or loss
NO_DIFFERENCE_BAND = 1.25


def relative_spread(t: Timing) -> float:
    """The q20-q80 band's width over the median."""
    return t.spread_ms / t.median_ms if t.median_ms > 0 else math.inf


def pass_verdict(rt: RuntimeProfile, pass_name: str) -> dict[str, Any] | None:
    """The measured comparison of one pass ("fwd" or "fwd+bwd"), None when either side is missing.

    Returns: eager_ms, compiled_ms (medians), speedup with its low/high bounds, compile_s, verdict
    ("compile", "eager", "no difference" or "unreliable"), unreliable_why (what made it unreliable,
    else None) and breakeven_steps (steps until the compile time is paid back; None unless compiling
    wins).
    """
    eager, compiled = rt.timings.get(f"eager {pass_name}"), rt.timings.get(f"compiled {pass_name}")
    if eager is None or compiled is None:
        return None
    ratio, low, high = speedup(eager, compiled)
    verdict = "compile" if low > 1.0 else "eager" if high < 1.0 else "no difference"
    why = None
    paired = rt.paired.get(pass_name)
    if paired is not None and not paired.reliable:
        why = f"the machine was busy: only {paired.describe()}"
    elif verdict == "no difference" and not 1 / NO_DIFFERENCE_BAND <= low <= high <= NO_DIFFERENCE_BAND:
        spread = max(relative_spread(eager), relative_spread(compiled))
        why = (f"the q20-q80 bands are too wide to decide (up to {100 * spread:.0f}% of the median; "
               f"speedup between {low:.2f}x and {high:.2f}x)")
    if why is not None:
        verdict = "unreliable"
    compile_s = rt.compile_s.get(pass_name)
    saved_ms = eager.median_ms - compiled.median_ms
    breakeven = math.ceil(compile_s * 1e3 / saved_ms) if verdict == "compile" and compile_s is not None else None
    return {"pass": pass_name, "eager_ms": eager.median_ms, "compiled_ms": compiled.median_ms,
            "eager_band_ms": [eager.q20_ms, eager.q80_ms], "compiled_band_ms": [compiled.q20_ms, compiled.q80_ms],
            "speedup": ratio, "speedup_low": low, "speedup_high": high, "compile_s": compile_s,
            "compile_source": rt.compile_source.get(pass_name), "verdict": verdict,
            "saved_ms_per_step": saved_ms, "breakeven_steps": breakeven, "unreliable_why": why,
            "rounds": None if paired is None else [paired.kept, paired.rounds], "measured": True}  # fmt: skip


def _line(v: dict[str, Any]) -> str:
    compile_s = f", compile {v['compile_s']:.1f} s" if v["compile_s"] is not None else ""
    (e20, e80), (c20, c80) = v["eager_band_ms"], v["compiled_band_ms"]
    return (f"{v['pass']}: eager {v['eager_ms']:.3f} ms (q20-q80 {e20:.3f}-{e80:.3f}), "
            f"compiled {v['compiled_ms']:.3f} ms (q20-q80 {c20:.3f}-{c80:.3f}), {v['speedup']:.2f}x{compile_s}")


def verdict_findings(ctx: Any, rt: RuntimeProfile) -> list[Finding]:
    """One `verdict.compile` finding: the verdict of the pass that matters (fwd+bwd when the model
    trains, else fwd), with every measured pass in its evidence and data."""
    verdicts = [v for p in ("fwd", "fwd+bwd") if (v := pass_verdict(rt, p)) is not None]
    if not verdicts:
        return []
    main = verdicts[-1]  # fwd+bwd when measured: the step a training loop runs
    evidence = "; ".join(_line(v) for v in verdicts) + f" (measured on {rt.device})"
    saved = main["saved_ms_per_step"]
    if main["verdict"] == "compile":
        steps = main["breakeven_steps"]
        title = (f"Compile it: {main['speedup']:.2f}x faster {main['pass']} step"
                 + (f", pays off after {steps} steps" if steps is not None else ""))
        severity, fix = Severity.INFO, "`model = torch.compile(model)` (or `kernel_pytorch.optimize(model)`)"
        gain = f"{saved:.3f} ms per {main['pass']} step (measured)"
    elif main["verdict"] == "eager":
        title = f"Do not compile it: the compiled {main['pass']} step is {1 / main['speedup']:.2f}x slower"
        severity = Severity.WARNING
        fix = ("keep the model eager (or compile only the blocks that win: regional compilation); the kernel "
               "summary shows where the compiled step loses")
        gain = f"{-saved:.3f} ms per {main['pass']} step kept by not compiling (measured)"
    elif main["verdict"] == "unreliable":
        (e20, e80), (c20, c80) = main["eager_band_ms"], main["compiled_band_ms"]
        title = (f"Could not measure the {main['pass']} step reliably: eager {e20:.3g}-{e80:.3g} ms, "
                 f"compiled {c20:.3g}-{c80:.3g} ms (q20-q80)")
        evidence = f"{main['unreliable_why']}. {evidence}"
        severity, gain = Severity.INFO, None
        fix = ("time it again on an idle machine (no other process on its cores), or with fewer threads "
               "(`torch.set_num_threads`) than free cores")
    else:
        title = f"Compiling makes no measurable difference to the {main['pass']} step"
        severity, fix, gain = Severity.INFO, "", None
    return [Finding(
        id="verdict.compile",
        severity=severity,
        title=title,
        evidence=evidence,
        suggestion=fix,
        estimated_gain=gain,
        data={"verdict": main["verdict"], "pass": main["pass"], "passes": verdicts,
              "gain_ms": abs(saved) if main["verdict"] in ("compile", "eager") else None, "measured": True},
    )]


__all__ = ["NO_DIFFERENCE_BAND", "pass_verdict", "relative_spread", "verdict_findings"]
