"""`optimization_suggestions`: every fix the other sections found, ranked by what it buys.

Generic over sections: any finding with a suggestion takes part. Its gain is read from its data when
the analysis put numbers there (`gain_ms` or `seconds_saved`: time per step; `gain_bytes`,
`bytes_freed` or `memory_saved_bytes`: memory; `measured`: whether the number was measured), else from
its `estimated_gain` text ("1.2 ms", "35%", "2.0 GiB"). Time and memory gains are put on one scale as a
fraction of the measured step time and of the peak memory (or, without one, of four times the
parameters). Compile-time savings (a text gain that speaks of compile time, paid once, not per step)
come next, largest first, then gains given only as a percentage, then fixes without a number, worst
severity first; measured before estimated within a tier.
"""

from __future__ import annotations

import re
from typing import Any

from kernel_pytorch.assistant.findings import Finding, Severity

_UNITS_MS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}
_UNITS_B = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_TIME_KEYS = (("gain_ms", 1.0), ("ms_saved", 1.0), ("seconds_saved", 1e3), ("gain_s", 1e3))
_MEM_KEYS = ("gain_bytes", "bytes_freed", "memory_saved_bytes", "saved_bytes")
_SKIP = ("analysis-error.", "suggestion.")


def gain_of(f: Finding) -> dict[str, Any]:
    """{"ms": time saved per step or None, "bytes": memory saved or None, "compile_s": compile time
    saved or None, "pct": a percentage the text gives or None, "measured": bool} for finding `f`."""
    d = f.data or {}
    ms = next((float(d[k]) * s for k, s in _TIME_KEYS if isinstance(d.get(k), (int, float))), None)
    nbytes = next((float(d[k]) for k in _MEM_KEYS if isinstance(d.get(k), (int, float))), None)
    text = f.estimated_gain or ""
    pct = compile_s = None
    if ms is None and nbytes is None and text:
        m = re.search(r"(\d+(?:\.\d+)?)\s*(ms|µs|us|s)\b", text)
        if m:
            ms = float(m.group(1)) * _UNITS_MS[m.group(2)]
        m = re.search(r"(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|GB|MB|KB|B)\b", text)
        if m and ms is None:
            nbytes = float(m.group(1)) * _UNITS_B[m.group(2)]
        m = re.search(r"(\d+(?:\.\d+)?)\s*%", text)
        pct = float(m.group(1)) if m else None
        if ms is not None and "compile" in text:  # compile time: paid once, not per step
            compile_s, ms = ms / 1e3, None
    measured = d.get("measured")
    if not isinstance(measured, bool):
        measured = "measured" in text and "not measured" not in text and "estimated" not in text
    return {"ms": ms, "bytes": nbytes, "compile_s": compile_s, "pct": pct, "measured": measured}


def _scales(ctx: Any, findings: list[Finding]) -> tuple[float | None, float | None]:
    """(step time in ms, peak memory in bytes) to put gains on one scale."""
    step = None
    rt = getattr(ctx, "__dict__", {}).get("runtime")  # only if the profiling already ran
    if rt is not None:
        timing = rt.timings.get("eager fwd+bwd") or rt.timings.get("eager fwd")
        step = timing.median_ms if timing is not None else None
    peak = next((float(f.data[k]) for f in findings for k in ("peak_bytes", "peak_memory_bytes")
                 if isinstance((f.data or {}).get(k), (int, float)) and f.data[k] > 0), None)
    if peak is None:
        params = sum(p.numel() * p.element_size() for p in ctx.module.parameters())
        peak = 4.0 * params if params else None
    return step, peak


def _tier(score: float | None, g: dict[str, Any]) -> tuple[int, float]:
    if score is not None and (g["ms"] is not None or g["bytes"] is not None):
        return 0, -score
    if g["compile_s"] is not None:
        return 1, -g["compile_s"]
    if score is not None:
        return 2, -score
    return 3, 0.0


def rank(ctx: Any, findings: list[Finding]) -> list[tuple[float | None, Finding, dict[str, Any]]]:
    """(score, finding, gain) of every finding with a fix, best first (see the module docstring); score
    is the gain as a fraction of the step time or peak memory, or the percentage given (None: none)."""
    step, peak = _scales(ctx, findings)
    biggest_ms = max((g["ms"] for f in findings if (g := gain_of(f))["ms"]), default=None)
    rows = []
    for f in findings:
        if not f.suggestion or f.id.startswith(_SKIP):
            continue
        g = gain_of(f)
        score = None
        if g["ms"] is not None:
            score = g["ms"] / (step or biggest_ms or 1.0)
        elif g["bytes"] is not None and peak:
            score = g["bytes"] / peak
        elif g["pct"] is not None:
            score = g["pct"] / 100.0
        rows.append((score, f, g))
    rows.sort(key=lambda r: (*_tier(r[0], r[2]), not r[2]["measured"], -r[1].severity.rank))
    return rows


def _gain_text(f: Finding, g: dict[str, Any], score: float | None) -> str:
    if score is None and not f.estimated_gain:
        return "[no estimate] see the finding"
    kind = "measured" if g["measured"] else "estimated"
    of = "the step time" if g["ms"] is not None else "the peak memory" if g["bytes"] is not None else None
    share = f" (~{100 * score:.1f}% of {of})" if score is not None and of else ""
    return f"[{kind}] {f.estimated_gain or ''}{share}"


def analyze_suggestions(ctx: Any) -> list[Finding]:
    """The ranked suggestions over the findings the other analyses put in `ctx.findings`."""
    findings = [f for section, fs in ctx.findings.items() if section != "optimization_suggestions" for f in fs]
    section_of = {id(f): s for s, fs in ctx.findings.items() for f in fs}
    out = []
    for i, (score, f, g) in enumerate(rank(ctx, findings), 1):
        out.append(Finding(
            id=f"suggestion.{f.id}",
            severity=Severity.INFO,  # the source finding carries the severity; counted once
            title=f"#{i}: {f.title}",
            evidence=f"from {section_of.get(id(f), '?')}: {f.evidence}"[:600],
            location=f.location,
            more_locations=f.more_locations,
            suggestion=f.suggestion,
            estimated_gain=_gain_text(f, g, score),
            data={"rank": i, "source_id": f.id, "section": section_of.get(id(f)), "score": score,
                  "gain_ms": g["ms"], "gain_bytes": g["bytes"], "compile_s_saved": g["compile_s"],
                  "measured": g["measured"]},
        ))
    return out


__all__ = ["analyze_suggestions", "gain_of", "rank"]
