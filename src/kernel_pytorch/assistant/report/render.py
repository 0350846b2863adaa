"""Rendering of a `Report`: a rich terminal view, JSON and Markdown. Nothing here analyses anything.

The terminal view is short by default: the facts and the headline, the top fixes, the fixes tried and
found slower, then one line per finding; `verbose=True` (CLI `--verbose`) prints every finding in full,
as the JSON, Markdown and HTML renderings always do.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from kernel_pytorch.assistant.findings import SECTION_TITLES, Finding, Location, Report, Severity

TOP_FIXES = 5  # suggestions the short terminal view prints
_MARK = {Severity.ERROR: "✖", Severity.WARNING: "▲", Severity.INFO: "●"}
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _where(loc: Location | None) -> str:
    """file:line, relative to the working directory when the file lies under it."""
    if loc is None:
        return ""
    path = loc.file
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive on Windows
        pass
    return f"{path}:{loc.line}"


def headline(report: Report) -> dict[str, Any]:
    """The few numbers a reader wants first, pulled from the findings' data."""
    out: dict[str, Any] = {}
    for f in report.compilation_readiness:
        if f.id == "readiness.graphs":
            out["graphs"] = f.data.get("graph_count")
            out["graph_breaks"] = f.data.get("break_count")
        if f.id == "readiness.fullgraph":
            out["fullgraph"] = f.data.get("fullgraph")
    for f in report.recompilations:
        if f.id == "recompile.summary":
            out["recompiles_before"] = f.data.get("recompiles_before")
            out["recompiles_after"] = f.data.get("recompiles_after")
    for f in report.kernel_efficiency:
        if f.id == "verdict.compile":
            out["compile_verdict"] = f.data.get("verdict")
            passes = [p for p in f.data.get("passes", ()) if p["pass"] == f.data.get("pass")]
            out["compile_speedup"] = passes[0]["speedup"] if passes else None
    for f in report.compile_time:
        if f.id == "compile-time.phases":
            out["compile_s"] = f.data.get("total_s")
            out["compile_cache_hit"] = f.data.get("cache_hit")
    return out


def _headline_text(report: Report) -> str:
    h = headline(report)
    parts = []
    if "graphs" in h:
        parts.append(f"graphs {h['graphs']}, breaks {h['graph_breaks']}")
    if "fullgraph" in h:
        parts.append("fullgraph ok" if h["fullgraph"] else "fullgraph fails")
    if h.get("recompiles_before") is not None:
        after = h.get("recompiles_after")
        parts.append(f"recompiles {h['recompiles_before']}" + (f" -> {after} with fix" if after is not None else ""))
    if h.get("compile_s") is not None:
        parts.append(f"compile {h['compile_s']:.1f} s" + (" (cached)" if h.get("compile_cache_hit") else " (cold)"))
    if h.get("compile_verdict") is not None:
        parts.append("verdict: " + verdict_text(h["compile_verdict"], h.get("compile_speedup")))
    counts = report.counts()
    parts.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info")
    return " · ".join(parts)


def verdict_text(verdict: str, speedup: float | None) -> str:
    """The compile verdict in words that agree with its ratio: "compile, 1.80x faster", "eager, compiled
    1.25x slower", "no measurable difference (median 1.43x, within the timing noise)"."""
    if not speedup:
        return {"no difference": "no measurable difference"}.get(verdict, verdict)
    if verdict == "compile":
        return f"compile, {speedup:.2f}x faster"
    if verdict == "eager":
        return f"eager, compiled {1 / speedup:.2f}x slower"
    return f"no measurable difference (median {speedup:.2f}x, within the timing noise)"


def _meta_text(report: Report) -> str:
    m = report.meta
    bits = [f"{k} {m[k]}" for k in ("device", "dtype", "torch", "backend") if m.get(k) is not None]
    if m.get("mode"):
        bits.append(f"mode {m['mode']}")
    inputs = m.get("inputs") or {}
    if inputs:
        bits.append("inputs " + ", ".join(f"{k}: {v}" for k, v in inputs.items()))
    seconds = (m.get("seconds") or {}).get("total")
    if seconds is not None:
        bits.append(f"analysed in {seconds:.1f} s")
    return " · ".join(bits)


def _places(f: Finding) -> list[tuple[list[Location], Location | None]]:
    """The finding's places in runs that share one `via` (the call that led there): (places, via)."""
    runs: list[tuple[list[Location], Location | None]] = []
    for loc in f.locations:
        if runs and runs[-1][1] == loc.via:
            runs[-1][0].append(loc)
        else:
            runs.append(([loc], loc.via))
    return runs


def _finding_renderable(f: Finding) -> Group:
    lines: list[Text] = []
    title = Text(f"{_MARK[f.severity]} ", style=_STYLE[f.severity])
    title.append(f.title, style="bold")
    lines.append(title)
    for places, via in _places(f):
        for label, place in [("at", p) for p in places] + ([("via", via)] if via is not None else []):
            where = Text(f"    {label} ", style="dim")
            where.append(_where(place), style="magenta")
            if place.code:
                where.append(f"  {place.code}", style="dim italic")
            lines.append(where)
    if f.evidence:
        lines.append(Text(f"    {f.evidence}", style="dim"))
    if f.suggestion:
        fix = Text("    fix: ", style="green")
        fix.append(f.suggestion)
        lines.append(fix)
    if f.estimated_gain:
        gain = Text("    gain: ", style="green")
        gain.append(f.estimated_gain)
        lines.append(gain)
    return Group(*lines)


def _header(report: Report) -> Panel:
    return Panel(
        Text(_meta_text(report)) + Text("\n") + Text(_headline_text(report), style="bold"),
        title=f"[bold]Compile report: {report.model}[/bold]",
        expand=True,
    )


def _line(f: Finding) -> Text:
    """One finding on one line: its mark, its title and its first place (the file's name and line: a long
    path first would leave no room for the title in a terminal's width)."""
    line = Text(f"{_MARK[f.severity]} ", style=_STYLE[f.severity])
    line.append(f.title)
    if f.location is not None:
        line.append(f"  {os.path.basename(f.location.file)}:{f.location.line}", style="magenta")
    return line


def _fix(f: Finding) -> Group:
    """A suggestion: its rank and title, the fix, the gain."""
    title = Text(f.title, style="bold")
    if f.location is not None:
        title.append(f"  {_where(f.location)}", style="magenta")
    lines = [title, Text("    fix: ", style="green") + Text(f.suggestion)]
    if f.estimated_gain:
        lines.append(Text("    gain: ", style="green") + Text(f.estimated_gain))
    return Group(*lines)


def render_terminal(report: Report, console: Console | None = None, *, verbose: bool = False) -> None:
    """Print the report to `console` (default: a new rich Console on stdout): short (the headline, the
    top fixes, one line per finding), or every finding in full with `verbose`."""
    console = console or Console()
    console.print(_header(report))
    empty, not_run = [], []
    fixes = [f for f in report.optimization_suggestions if f.id.startswith("suggestion.")]
    tried = [f for f in report.optimization_suggestions if f.id.startswith("tried.")]
    if not verbose and (fixes or tried):
        console.print(Rule(f"[bold]Top fixes[/bold] ({min(len(fixes), TOP_FIXES)} of {len(fixes)})", align="left"))
        for f in fixes[:TOP_FIXES]:
            console.print(_fix(f))
        for f in tried:
            console.print(_line(f), no_wrap=True, overflow="ellipsis")
    for name, findings in report.sections():
        if not findings:
            (empty if _ran(report, name) else not_run).append(SECTION_TITLES[name])
            continue
        if not verbose and name == "optimization_suggestions":
            continue
        console.print(Rule(f"[bold]{SECTION_TITLES[name]}[/bold]", align="left"))
        for f in findings:
            if verbose:
                console.print(_finding_renderable(f))
            else:
                console.print(_line(f), no_wrap=True, overflow="ellipsis")
    if empty:
        console.print(Text(f"No findings: {', '.join(empty)}", style="dim"))
    if not_run:
        console.print(Text(f"{', '.join(not_run)}: not analysed (not among the sections run)", style="dim"))
    if not verbose:
        console.print(Text("Every finding in full: --verbose, --json, --markdown or --html.", style="dim"))


def _ran(report: Report, section: str) -> bool:
    """Whether an analysis of `section` ran (`meta["sections_run"]`; a report without it: all did)."""
    run = report.meta.get("sections_run")
    return run is None or section in run


def to_json(report: Report) -> str:
    """The report as indented JSON (Report.to_dict plus the headline numbers)."""
    import json

    data = report.to_dict()
    data["headline"] = headline(report)
    return json.dumps(data, indent=2)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _md_place(loc: Location) -> str:
    return f"`{_where(loc)}`" + (f" `{loc.code}`" if loc.code else "")


def _joined(f: Finding, show: Callable[[Location], str]) -> str:
    """The finding's places on one line, each shown by `show`: "a, b, via c; d"."""
    return "; ".join(
        ", ".join(map(show, places)) + (f", via {show(via)}" if via is not None else "") for places, via in _places(f)
    )


def to_markdown(report: Report) -> str:
    """The report as Markdown: a facts table, the headline, then one subsection per finding."""
    m = report.meta
    out = [f"# Compile report: {report.model}", ""]
    out += ["| device | dtype | torch | backend | mode | analysis time |", "| --- | --- | --- | --- | --- | --- |"]
    seconds = (m.get("seconds") or {}).get("total")
    out.append(
        f"| {m.get('device', '')} | {m.get('dtype', '')} | {m.get('torch', '')} | {m.get('backend', '')} "
        f"| {m.get('mode') or 'default'} | {f'{seconds:.1f} s' if seconds is not None else ''} |"
    )
    out += ["", f"**{_md_escape(_headline_text(report))}**", ""]
    for name, findings in report.sections():
        out += [f"## {SECTION_TITLES[name]}", ""]
        if not findings:
            out += ["No findings." if _ran(report, name) else "Not analysed (not among the sections run).", ""]
            continue
        for f in findings:
            out += [f"### {f.severity.value.upper()}: {_md_escape(f.title)}", ""]
            places = _joined(f, _md_place)
            if places:
                out.append(f"- **Where:** {places}")
            if f.evidence:
                out.append(f"- **Evidence:** {f.evidence}")
            if f.suggestion:
                out.append(f"- **Fix:** {f.suggestion}")
            if f.estimated_gain:
                out.append(f"- **Gain:** {f.estimated_gain}")
            out.append(f"- **Id:** `{f.id}`")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
