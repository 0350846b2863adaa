"""`optimization_suggestions`: every fix the other sections found, ranked, and the fixes tried and found slower.

Generic over sections: any finding with a suggestion takes part. The ranking key is the kind of
problem first, then what the fix buys:

1. correctness: the model does not compile or run as asked (an ERROR finding);
2. graph breaks (`graph-break.*`, `readiness.*`): every call runs in pieces;
3. recompilations (`recompile.*`, `generate.*`): a compile per new shape;
4. speed: time saved per step;
5. compile time: seconds saved once per compile;
6. memory: bytes saved;
7. anything else.

Within a kind, the larger gain first: time as a share of the report's measured step (`estimates.step_time`),
memory as a share of the peak (or, without one, of four times the parameters), compile time in seconds;
fixes without a number after those with one, then the worse severity, then the id and place, so the
order does not depend on the order the analyses ran in. A gain is read from the finding's data when
the analysis put numbers there (`gain_ms` or `seconds_saved`: time per step; `gain_bytes` or
`freed_bytes`: memory; `measured`), else from its `estimated_gain` text ("1.2 ms", "35%", "2.0 GiB").

A fix measured slower on this device (`data["fix_slower"]`), and any other finding proposing the same
fix (the same `data["fix"]`), is not suggested: it is listed as tried, with the measurement.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kernel_pytorch.assistant.estimates import step_time
from kernel_pytorch.assistant.findings import SECTION_TITLES, Finding, Severity

_UNITS_MS = {"ms": 1.0, "s": 1e3, "us": 1e-3, "µs": 1e-3}
_UNITS_B = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_TIME_KEYS = (("gain_ms", 1.0), ("ms_saved", 1.0), ("seconds_saved", 1e3), ("gain_s", 1e3))
_MEM_KEYS = ("gain_bytes", "bytes_freed", "freed_bytes", "memory_saved_bytes", "saved_bytes")
_SKIP = ("analysis-error.", "suggestion.", "tried.")
_BREAKS = ("graph-break.", "readiness.")
_RECOMPILES = ("recompile.", "generate.")

# the kinds of problem, in rank order (see the module docstring)
KINDS = ("correctness", "graph break", "recompilation", "speed", "compile time", "memory", "other")


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
        measured = ("measured" in text or "verified" in text) and "not measured" not in text and "estimated" not in text
    return {"ms": ms, "bytes": nbytes, "compile_s": compile_s, "pct": pct, "measured": measured}


def kind_of(f: Finding, g: dict[str, Any]) -> int:
    """The index in `KINDS` of the problem finding `f` (with gain `g`) fixes."""
    if f.severity is Severity.ERROR:
        return 0
    if f.id.startswith(_BREAKS):
        return 1
    if f.id.startswith(_RECOMPILES):
        return 2
    if g["ms"] is not None or f.id.startswith(("kernel.", "verdict.", "fusion.")):
        return 3
    if g["compile_s"] is not None or f.id.startswith("compile-time."):
        return 4
    if g["bytes"] is not None or f.id.startswith("memory."):
        return 5
    return 6


def _scales(ctx: Any, findings: list[Finding]) -> tuple[float | None, float | None]:
    """(step time in ms, peak memory in bytes) to put gains on one scale: the report's measured step
    (forward+backward when it was measured, the step a training loop runs) and the memory peak."""
    step = step_time(ctx, "fwd+bwd") or step_time(ctx, "fwd")
    peak = next((float(f.data[k]) for f in findings for k in ("peak_bytes", "peak_memory_bytes")
                 if isinstance((f.data or {}).get(k), (int, float)) and f.data[k] > 0), None)
    if peak is None:
        params = sum(p.numel() * p.element_size() for p in ctx.module.parameters())
        peak = 4.0 * params if params else None
    return (step.ms if step is not None else None), peak


def _score(g: dict[str, Any], step: float | None, peak: float | None) -> float | None:
    """The gain as a share of the step time or the peak memory, or the percentage given; compile time
    in seconds; None without a number."""
    if g["ms"] is not None:
        return g["ms"] / step if step else None
    if g["compile_s"] is not None:
        return g["compile_s"]
    if g["bytes"] is not None:
        return g["bytes"] / peak if peak else None
    return g["pct"] / 100.0 if g["pct"] is not None else None


def _place(f: Finding) -> str:
    return str(f.location) if f.location is not None else ""


def _measured_slower(f: Finding) -> bool:
    return (f.data or {}).get("fix_slower") is True


def _fix_key(f: Finding) -> Any:
    """The fix `f` proposes (`data["fix"]`; a fix measured slower without one is keyed by its id)."""
    fix = (f.data or {}).get("fix")
    return str(fix or f.id) if _measured_slower(f) else fix


def tried(findings: list[Finding]) -> list[tuple[Finding, Finding]]:
    """(finding, the finding whose measurement found its fix slower) for every fix not to suggest."""
    slower: dict[Any, Finding] = {}
    for f in findings:
        if _measured_slower(f):
            slower.setdefault(_fix_key(f), f)
    return [(f, slower[key]) for f in findings if (key := _fix_key(f)) is not None and key in slower]


def rank(ctx: Any, findings: list[Finding]) -> list[tuple[float | None, Finding, dict[str, Any]]]:
    """(score, finding, gain) of every finding with a fix to suggest, best first (see the module
    docstring); score is the gain as a share of the step time or peak memory, compile seconds saved, or
    the percentage given (None: none). Fixes measured slower are left out (`tried`)."""
    step, peak = _scales(ctx, findings)
    out_of = {id(f) for f, _ in tried(findings)}
    rows = []
    for f in findings:
        if not f.suggestion or f.id.startswith(_SKIP) or id(f) in out_of:
            continue
        g = gain_of(f)
        g["kind"] = kind_of(f, g)
        rows.append((_score(g, step, peak), f, g))

    def key(row: tuple[float | None, Finding, dict[str, Any]]) -> tuple[Any, ...]:
        score, f, g = row
        # two gains within 10% of each other rank alike, so timing noise does not swap them between runs
        level = -math.floor(math.log(score) / math.log(1.1)) if score and score > 0 else math.inf
        return (g["kind"], level, not g["measured"], -f.severity.rank, f.id, _place(f), f.title)

    rows.sort(key=key)
    return rows


def _gain_text(f: Finding, g: dict[str, Any], score: float | None) -> str:
    if score is None and not f.estimated_gain:
        return "[no estimate]"
    kind = "measured" if g["measured"] else "estimated"
    of = "the step time" if g["ms"] is not None else "the peak memory" if g["bytes"] is not None else None
    share = f" (~{100 * score:.1f}% of {of})" if score is not None and of else ""
    return f"[{kind}] {f.estimated_gain or ''}{share}"


def _tried_numbers(by: Finding) -> str:
    d = by.data or {}
    before, after = d.get("ms_as_made"), d.get("ms_fixed")
    if isinstance(before, (int, float)) and isinstance(after, (int, float)):
        return f"{before:.3g} ms as made, {after:.3g} ms fixed"
    return "slower with the fix"


def analyze_suggestions(ctx: Any) -> list[Finding]:
    """The ranked suggestions over the findings the other analyses put in `ctx.findings`, then the
    fixes tried and found slower (`tried.<source id>`)."""
    findings = [f for section, fs in ctx.findings.items() if section != "optimization_suggestions" for f in fs]
    section_of = {id(f): s for s, fs in ctx.findings.items() for f in fs}

    def details(f: Finding) -> str:
        return f"details: {SECTION_TITLES.get(section_of.get(id(f), ''), 'the report')}, `{f.id}`"

    out = []
    for i, (score, f, g) in enumerate(rank(ctx, findings), 1):
        out.append(Finding(
            id=f"suggestion.{f.id}",
            severity=Severity.INFO,  # the source finding carries the severity; counted once
            title=f"#{i}: {f.title}",
            evidence=details(f),
            location=f.location,
            suggestion=f.suggestion,
            estimated_gain=_gain_text(f, g, score),
            data={"rank": i, "source_id": f.id, "section": section_of.get(id(f)), "kind": KINDS[g["kind"]],
                  "score": score, "gain_ms": g["ms"], "gain_bytes": g["bytes"], "compile_s_saved": g["compile_s"],
                  "measured": g["measured"]},
        ))
    for f, by in tried(findings):
        d = by.data or {}
        out.append(Finding(
            id=f"tried.{f.id}",
            severity=Severity.INFO,
            title=f"Tried, slower here ({_tried_numbers(by)}): {f.title}",
            evidence="measured on this device"
            + (f" at {by.location}" if by.location is not None else "")
            + f" (`{by.id}`); {details(f)}",
            location=f.location,
            data={"tried": True, "source_id": f.id, "section": section_of.get(id(f)), "measured_by": by.id,
                  "ms_as_made": d.get("ms_as_made"), "ms_fixed": d.get("ms_fixed")},
        ))
    return out


__all__ = ["KINDS", "analyze_suggestions", "gain_of", "kind_of", "rank", "tried"]
