"""The analyser's data model: a `Finding` per observation, a `Report` of findings grouped in sections.

Analyses return `list[Finding]`; rendering (terminal, JSON, Markdown) lives in `render.py`, so every
finding can be checked as plain data in tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    """How much a finding matters. ERROR: the model does not compile or run as asked; WARNING: it works
    but loses performance or compile time; INFO: a measurement or a confirmation."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """0 for INFO up to 2 for ERROR, for sorting the worst first."""
        return ("info", "warning", "error").index(self.value)


@dataclass(frozen=True)
class Location:
    """A place in the source: file, 1-based line, enclosing function and the line's text.

    `via` is set when the place is inside a library (transformers, torch, timm): the nearest frame of
    the user's code, or of the model class's forward, whose call led there.
    """

    file: str
    line: int
    function: str | None = None
    code: str | None = None
    via: Location | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "function": self.function, "code": self.code}
        if self.via is not None:  # only where there is one: a location in the user's code has none
            out["via"] = self.via.to_dict()
        return out


@dataclass(frozen=True)
class Finding:
    """One observation of the analyser.

    Attributes:
        id: stable machine name, "<section>.<kind>", e.g. "graph-break.item" or "recompile.dynamic-dim".
        severity: see `Severity`.
        title: one line saying what was found.
        evidence: what was measured or what torch said (its own explanation of a graph break, the
            failed guard of a recompilation, seconds per compile phase).
        location: where in the user's code, when the finding has a place (the first, when it has several).
        suggestion: the concrete fix, code included where there is one; "" when nothing is to be done.
        estimated_gain: what the fix buys, and whether that was verified or estimated; None if unknown.
        data: the structured numbers behind the finding (counts, seconds) for JSON and tests.
        more_locations: the other places of the same cause (the two residual adds of a decoder layer);
            `locations` gives them all.
    """

    id: str
    severity: Severity
    title: str
    evidence: str
    location: Location | None = None
    suggestion: str = ""
    estimated_gain: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    more_locations: tuple[Location, ...] = ()

    @property
    def locations(self) -> tuple[Location, ...]:
        """Every place of the finding, `location` first; () when it has none."""
        return ((self.location,) if self.location is not None else ()) + self.more_locations

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "title": self.title,
            "evidence": self.evidence,
            "location": self.location.to_dict() if self.location else None,
            "locations": [loc.to_dict() for loc in self.locations],
            "suggestion": self.suggestion,
            "estimated_gain": self.estimated_gain,
            "data": _jsonable(self.data),
        }


# Section names in report order. The last four are filled by the fusion/memory/kernel analyses.
SECTIONS: tuple[str, ...] = (
    "compilation_readiness",
    "recompilations",
    "compile_time",
    "fusion_opportunities",
    "memory_bottlenecks",
    "kernel_efficiency",
    "optimization_suggestions",
)

SECTION_TITLES: Mapping[str, str] = {
    "compilation_readiness": "Compilation readiness",
    "recompilations": "Recompilations",
    "compile_time": "Compile time",
    "fusion_opportunities": "Fusion opportunities",
    "memory_bottlenecks": "Memory bottlenecks",
    "kernel_efficiency": "Kernel efficiency",
    "optimization_suggestions": "Optimization suggestions",
}


@dataclass(frozen=True)
class Report:
    """The analyser's result: findings per section plus facts about the run.

    Attributes:
        model: a name for the analysed component (class name or built-in preset).
        meta: device, dtype, torch version, options used and seconds spent per analysis.
        compilation_readiness ... optimization_suggestions: the findings of each section, worst first.
    """

    model: str
    meta: Mapping[str, Any] = field(default_factory=dict)
    compilation_readiness: tuple[Finding, ...] = ()
    recompilations: tuple[Finding, ...] = ()
    compile_time: tuple[Finding, ...] = ()
    fusion_opportunities: tuple[Finding, ...] = ()
    memory_bottlenecks: tuple[Finding, ...] = ()
    kernel_efficiency: tuple[Finding, ...] = ()
    optimization_suggestions: tuple[Finding, ...] = ()

    def section(self, name: str) -> tuple[Finding, ...]:
        """The findings of section `name` (one of `SECTIONS`)."""
        if name not in SECTIONS:
            raise KeyError(f"unknown section {name!r}; sections are {', '.join(SECTIONS)}")
        return getattr(self, name)

    def sections(self) -> Iterator[tuple[str, tuple[Finding, ...]]]:
        """(name, findings) for every section, in report order, empty ones included."""
        for name in SECTIONS:
            yield name, getattr(self, name)

    def findings(self) -> list[Finding]:
        """Every finding of every section, in report order."""
        return [f for _, fs in self.sections() for f in fs]

    def by_id(self, prefix: str) -> list[Finding]:
        """The findings whose id starts with `prefix`, e.g. "graph-break." for every graph break."""
        return [f for f in self.findings() if f.id.startswith(prefix)]

    def counts(self) -> dict[str, int]:
        """Number of findings per severity value."""
        out = {s.value: 0 for s in Severity}
        for f in self.findings():
            out[f.severity.value] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "meta": _jsonable(self.meta),
            "counts": self.counts(),
            "sections": {name: [f.to_dict() for f in fs] for name, fs in self.sections()},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def skipped(prefix: str, title: str, why: str, data: Mapping[str, Any] | None = None) -> Finding:
    """The INFO finding "<prefix>.skipped": an analysis that did not run, and why."""
    return Finding(id=f"{prefix}.skipped", severity=Severity.INFO, title=title, evidence=why, data=data or {})


def sort_findings(findings: list[Finding]) -> tuple[Finding, ...]:
    """Worst first; equal severities keep the order the analysis produced them in."""
    return tuple(sorted(findings, key=lambda f: -f.severity.rank))


def _jsonable(value: Any) -> Any:
    """Plain JSON types: mappings and sequences recursively, enums by value, anything else as str."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v) for v in items]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
