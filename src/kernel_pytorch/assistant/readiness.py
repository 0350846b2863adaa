"""Compilation readiness: does the model reach torch.compile as one graph, and if not, why not.

Every graph break Dynamo records becomes one finding (duplicates merged) at the user's file:line,
with the operation, torch's own explanation and a concrete fix for its kind. Then the graph count,
ops per graph and whether `fullgraph=True` succeeds. A model that fails to run or to trace is a
finding carrying the error, never an exception out of the analyser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.findings import Finding, Location, Severity
from kernel_pytorch.assistant.locate import error_location, user_location
from kernel_pytorch.assistant.records import BreakRecord


@dataclass(frozen=True)
class BreakKind:
    """What a graph break is: a short kind name, the operation in words, and the fix for it."""

    kind: str
    operation: str
    fix: str


_FIXES: dict[str, str] = {
    "item": (
        "Keep the value a tensor: use the 0-dim tensor in tensor arithmetic (`x * s` rather than "
        "`x * s.item()`, `torch.clamp` rather than `min()` on a Python number). If the Python number is "
        "really needed, let Dynamo capture it: `torch._dynamo.config.capture_scalar_outputs = True` "
        "before compiling."
    ),
    "tolist": (
        "Keep the values a tensor (index it or use tensor ops instead of a Python list). For integer "
        "tensors `torch._dynamo.config.capture_scalar_outputs = True` lets Dynamo trace `.tolist()`."
    ),
    "data-dependent-branch": (
        "Python `if`/`while` on a tensor's value needs that value on the host. Compute both sides and "
        "select: `y = torch.where(cond, a, b)`; when the branches do different work use "
        "`torch.cond(cond, true_fn, false_fn, (x,))`; or decide outside the model and pass a flag."
    ),
    "print": (
        "Remove the print from forward, or guard it: `if not torch.compiler.is_compiling(): print(...)` "
        "(Dynamo drops the block), or move it into a helper decorated with `@torch.compiler.disable`."
    ),
    "logging": (
        "Remove the logging/warnings call from forward, or guard it with "
        "`if not torch.compiler.is_compiling():`, or move it into a helper decorated with "
        "`@torch.compiler.disable`."
    ),
    "numpy": (
        "Replace the NumPy call with its torch equivalent (torch.interp-style code with "
        "torch.searchsorted, torch.where, torch.sort, torch.histc, ...) so the data stays a tensor on "
        "the device and inside the graph."
    ),
    "dynamic-shape-op": (
        "The output's size depends on the data (nonzero, unique, boolean-mask indexing). Use a "
        "fixed-size formulation (`torch.where(mask, x, 0)` instead of `x[mask]`), or let Dynamo trace "
        "it: `torch._dynamo.config.capture_dynamic_output_shape_ops = True`."
    ),
    "unsupported-builtin": (
        "Dynamo cannot trace this call. Move it out of forward (compute it once in __init__, or pass "
        "its result as an input), replace it with a torch operation, or wrap it in a helper decorated "
        "with `@torch.compiler.disable` so only that helper runs eagerly."
    ),
    "user-break": "Remove the explicit `torch._dynamo.graph_break()` call.",
    "compiler-disabled": (
        "The code calls a function excluded with `torch.compiler.disable`; remove the decorator if the "
        "function is traceable, else keep it out of the hot path."
    ),
    "other": "Rewrite the line with torch operations Dynamo can trace; torch's hint is in the evidence.",
}

_OPERATIONS: dict[str, str] = {
    "item": "Tensor.item() / Python number from a tensor",
    "tolist": "Tensor.tolist()",
    "data-dependent-branch": "`if`/`while` on a tensor value",
    "print": "print()",
    "logging": "logging / warnings call",
    "numpy": "NumPy call",
    "dynamic-shape-op": "operator with a data-dependent output shape",
    "user-break": "torch._dynamo.graph_break()",
    "compiler-disabled": "call of a torch.compiler.disable'd function",
    "other": "untraceable operation",
}


_WHY: dict[str, str] = {
    "data-dependent-branch": "Python control flow on a tensor's value: Dynamo cannot know which branch to "
    "trace without the value, so it stops the graph, runs the test eagerly and resumes",
    "item": "A Python number read from a tensor needs the value on the host, so the graph stops there",
    "print": "print() has side effects Dynamo does not trace",
}


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0].strip() if reason.strip() else ""


def torch_explanation(reason: str) -> tuple[str, list[str]]:
    """(torch's one-line type plus its Explanation, its Hints) from a graph-break reason text."""
    head = _first_line(reason)
    explanation = re.search(r"Explanation:\s*(.+)", reason)
    hints = [h.strip() for h in re.findall(r"Hint:\s*(.+)", reason)]
    text = head if not explanation else f"{head}: {explanation.group(1).strip()}"
    return text, hints


def classify_break(reason: str, code: str | None) -> BreakKind:
    """The kind of a graph break from torch's reason text and the source line it points at."""
    low = reason.lower()
    line = (code or "").strip()
    builtin = re.search(r"builtin operator `([^`]+)`", reason) or re.search(
        r"trace the (?:python )?builtin `([^`]+?)\.?`", reason, re.I
    )
    name = builtin.group(1) if builtin else None

    def kind(k: str, operation: str | None = None) -> BreakKind:
        return BreakKind(k, operation or _OPERATIONS[k], _FIXES[k])

    if "graph_break()" in low:
        return kind("user-break")
    if "compiler.disable" in low or "disabled function" in low:
        return kind("compiler-disabled")
    if name == "print" or (not name and re.match(r"print\s*\(", line)):
        return kind("print")
    head = _first_line(reason).lower()
    if (
        "logging" in head
        or "logger" in head
        or (name or "").endswith("warnings.warn")
        or re.search(r"\b(log|logger|logging|warnings)\.\w+\(", line)
    ):
        return kind("logging")
    if "tolist" in low:
        return kind("tolist")
    if ".item()" in low or "tensor.item" in low or "_local_scalar_dense" in low or "capture_scalar_outputs" in low:
        return kind("item")
    if (
        "generic_jump" in low
        or "data-dependent branching" in low
        or "data dependent control flow" in low
        or "data-dependent control flow" in low
        or (re.match(r"(if|elif|while)\b", line) and "tensor" in low)
    ):
        return kind("data-dependent-branch")
    if "numpy" in low or "ndarray" in low:
        func = re.search(r"\b(np|numpy)\.([\w.]+)", line)
        return kind("numpy", f"NumPy call `{func.group(0)}`" if func else None)
    if "dynamic shape operator" in low or "capture_dynamic_output_shape_ops" in low:
        op = re.search(r"Operator `([^`]+)`", reason)
        return kind("dynamic-shape-op", f"`{op.group(1)}` (output shape depends on data)" if op else None)
    if name or "marked as skipped" in low or "builtin" in low:
        return kind("unsupported-builtin", f"`{name}`" if name else "unsupported builtin")
    return kind("other", _first_line(reason) or None)


@dataclass(frozen=True)
class _Break:
    kind: BreakKind
    location: Location | None
    explanation: str
    hints: tuple[str, ...]
    count: int


def dedupe_breaks(records: Sequence[BreakRecord]) -> list[_Break]:
    """One entry per (kind, file, line), in first-seen order, counting the distinct call paths to it.

    Dynamo may record one break several times (it restarts the frame's analysis after a break); the
    same stack counts once, the same line reached from two call sites counts twice.
    """
    merged: dict[tuple[str, str, int], _Break] = {}
    stacks: dict[tuple[str, str, int], set[tuple[tuple[str, int | None], ...]]] = {}
    for rec in records:
        loc = user_location(list(rec.frames))
        kind = classify_break(rec.reason, loc.code if loc else None)
        key = (kind.kind, loc.file if loc else "", loc.line if loc else -1)
        stack = tuple((fr.filename, fr.lineno) for fr in rec.frames)
        stacks.setdefault(key, set()).add(stack)
        if key not in merged:
            explanation, hints = torch_explanation(rec.reason)
            if "Explanation:" not in rec.reason and kind.kind in _WHY:
                # older torch messages name only the bytecode ("generic_jump ..."); say what it means
                explanation = f"{_WHY[kind.kind]} (torch: {explanation})"
            merged[key] = _Break(kind, loc, explanation, tuple(hints), 0)
    return [_Break(b.kind, b.location, b.explanation, b.hints, _call_sites(stacks[key])) for key, b in merged.items()]


def _call_sites(stacks: set[tuple[tuple[str, int | None], ...]]) -> int:
    """Distinct stacks, not counting one that is the tail of a longer one (Dynamo re-reports a break
    from the resumed inner frame with only that frame on its stack)."""
    return sum(1 for s in stacks if not any(len(o) > len(s) and o[len(o) - len(s) :] == s for o in stacks))


def analyze_readiness(ctx: AnalysisContext) -> list[Finding]:
    """Graph breaks, graph count, ops per graph and fullgraph=True for the example call."""
    eager = ctx.eager
    if not eager.ok:
        assert eager.error is not None
        return [
            Finding(
                id="readiness.eager-failed",
                severity=Severity.ERROR,
                title="The model raises when called eagerly on the example inputs",
                evidence=short_error(eager.error),
                location=error_location(eager.error),
                suggestion="Fix the model or the example inputs first: every compile analysis needs a "
                "model that runs without torch.compile.",
            )
        ]
    trace = ctx.trace
    findings: list[Finding] = []
    if trace.error is not None:
        findings.append(
            Finding(
                id="readiness.trace-failed",
                severity=Severity.ERROR,
                title="torch.compile fails on this model (Dynamo could not trace it)",
                evidence=short_error(trace.error),
                location=error_location(trace.error),
                suggestion="The model runs eagerly but not under Dynamo. Rewrite the failing line with "
                "torch operations, or exclude the function around it with `@torch.compiler.disable`; "
                "`TORCHDYNAMO_VERBOSE=1` prints Dynamo's internal stack.",
                data={"error_type": type(trace.error).__name__},
            )
        )

    for frame in trace.failed_frames:
        explanation, hints = torch_explanation(frame.reason)
        where = f"`{frame.location.function}`" if frame.location and frame.location.function else "a frame"
        findings.append(
            Finding(
                id="readiness.frame-fallback",
                severity=Severity.ERROR,
                title=f"Dynamo gave up on {where}: it runs eagerly, nothing of it is compiled",
                evidence=f"{frame.fail_type}: {explanation}" + (f" Torch's hint: {hints[0]}" if hints else ""),
                location=frame.location,
                suggestion="Make the line traceable (an exception raised only under tracing, or an "
                "unsupported construct, stops the whole frame), or move it into a helper decorated with "
                "`@torch.compiler.disable` so the rest of the frame compiles.",
                data={"fail_type": frame.fail_type},
            )
        )

    breaks = dedupe_breaks(trace.breaks)
    n_graphs = len(trace.graphs)
    for b in breaks:
        hint = f" Torch's hint: {b.hints[0]}" if b.hints else ""
        seen = f" Reached from {b.count} call sites." if b.count > 1 else ""
        findings.append(
            Finding(
                id=f"graph-break.{b.kind.kind}",
                severity=Severity.INFO if b.kind.kind == "compiler-disabled" else Severity.WARNING,
                title=f"Graph break: {b.kind.operation}",
                evidence=f"{b.explanation}.{hint}{seen}".replace("..", "."),
                location=b.location,
                suggestion=b.kind.fix,
                estimated_gain="removes this break: one fewer graph, no Python round trip and no lost "
                "fusion across this line",
                data={
                    "kind": b.kind.kind,
                    "operation": b.kind.operation,
                    "call_sites": b.count,
                    "torch_hints": list(b.hints),
                },
            )
        )

    ops = [len(g.ops) for g in trace.graphs]
    if trace.error is None:
        data = {"graph_count": n_graphs, "ops_per_graph": ops, "break_count": len(breaks)}
        if breaks:
            findings.append(
                Finding(
                    id="readiness.graphs",
                    severity=Severity.WARNING,
                    title=f"{len(breaks)} distinct graph break(s) split the model into {n_graphs} graph(s)",
                    evidence=f"ops per graph: {ops}; Dynamo traced {trace.frames_total} frame(s) in "
                    f"{trace.seconds:.1f} s",
                    suggestion="Fix the breaks above; then `torch.compile(model, fullgraph=True)` keeps "
                    "them from coming back.",
                    data=data,
                )
            )
        elif trace.failed_frames:
            findings.append(
                Finding(
                    id="readiness.graphs",
                    severity=Severity.WARNING,
                    title=f"No graph breaks, but {len(trace.failed_frames)} frame(s) fell back to eager: "
                    f"{n_graphs} graph(s), {sum(ops)} ops compiled",
                    evidence=f"ops per graph: {ops}; traced in {trace.seconds:.1f} s",
                    data=data,
                )
            )
        else:
            findings.append(
                Finding(
                    id="readiness.graphs",
                    severity=Severity.INFO,
                    title=f"No graph breaks: {n_graphs} graph(s), {sum(ops)} ops",
                    evidence=f"ops per graph: {ops}; traced in {trace.seconds:.1f} s",
                    data=data,
                )
            )
        findings.append(_fullgraph_finding(ctx, has_breaks=bool(breaks)))
    return findings


def _fullgraph_finding(ctx: AnalysisContext, has_breaks: bool) -> Finding:
    if has_breaks:
        # A break means fullgraph=True raises at the first one; no need to trace again to know that.
        return Finding(
            id="readiness.fullgraph",
            severity=Severity.WARNING,
            title="torch.compile(fullgraph=True) fails at the first graph break",
            evidence="fullgraph=True turns every graph break into an error",
            suggestion="Fix the graph breaks listed here, then compile with fullgraph=True.",
            data={"fullgraph": False},
        )
    result = ctx.fullgraph
    if result.ok:
        return Finding(
            id="readiness.fullgraph",
            severity=Severity.INFO,
            title="torch.compile(fullgraph=True) succeeds",
            evidence=f"traced as one graph in {result.seconds:.1f} s",
            suggestion="Compile with fullgraph=True so a future change that adds a graph break fails "
            "loudly instead of silently slowing down.",
            data={"fullgraph": True},
        )
    assert result.error is not None
    text = str(result.error)
    evidence = (
        f"{type(result.error).__name__}: {torch_explanation(text)[0]}"
        if "Explanation:" in text
        else short_error(result.error)
    )
    return Finding(
        id="readiness.fullgraph",
        severity=Severity.WARNING,
        title="torch.compile(fullgraph=True) fails although no graph break was recorded",
        evidence=evidence,
        location=error_location(result.error),
        suggestion="Read torch's error: a frame Dynamo skips, or a construct only fullgraph rejects.",
        data={"fullgraph": False},
    )
