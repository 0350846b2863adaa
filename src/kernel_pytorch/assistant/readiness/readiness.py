"""Compilation readiness: does the model reach torch.compile as one graph, and if not, why not.

Every graph break Dynamo records becomes one finding (duplicates merged) at the line it happened,
with the operation, torch's own explanation and a concrete fix for its kind (`graph_breaks`); a
break inside a library also names the line of the user's code or of the model's forward that led
there. A frame Dynamo gives up on says which frame, why, and what to do. Then the graph count, ops per
graph and whether `fullgraph=True` succeeds. A model that fails to run or to trace is a finding
carrying the error, never an exception out of the analyser.
"""

from __future__ import annotations

from typing import Any

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.findings import Finding, Location, Severity
from kernel_pytorch.assistant.locate import describe, error_location, forward_owner, is_library_file
from kernel_pytorch.assistant.readiness.allow_rnn import RnnCheck, check_allow_rnn
from kernel_pytorch.assistant.readiness.graph_breaks import (
    RNN,
    Break,
    BreakKind,
    classify_break,
    dedupe_breaks,
    library_fix,
    plain,
    torch_explanation,
)
from kernel_pytorch.assistant.records import FailedFrame

__all__ = ["BreakKind", "analyze_readiness", "classify_break", "dedupe_breaks", "nothing_compiled", "torch_explanation"]


def nothing_compiled(ctx: AnalysisContext) -> bool:
    """True when the model runs and traces but Dynamo gave up on every frame it met: no graph was
    compiled, so there is nothing to recompile and no compile time to reduce."""
    if not ctx.eager.ok:
        return False
    trace = ctx.trace
    return trace.error is None and not trace.graphs and bool(trace.failed_frames)


def analyze_readiness(ctx: AnalysisContext) -> list[Finding]:
    """Graph breaks, frame fallbacks, graph count, ops per graph and fullgraph=True for the example call."""
    eager = ctx.eager
    if not eager.ok:
        assert eager.error is not None
        return [_eager_failed(ctx, eager.error)]
    trace = ctx.trace
    findings: list[Finding] = []
    if trace.error is not None:
        findings.append(
            Finding(
                id="readiness.trace-failed",
                severity=Severity.ERROR,
                title="torch.compile fails on this model (Dynamo could not trace it)",
                evidence=plain(short_error(trace.error)),
                location=error_location(trace.error, ctx.module),
                suggestion="The model runs eagerly but not under Dynamo. Rewrite the failing line with "
                "torch operations, or exclude the function around it with `@torch.compiler.disable`; "
                "`TORCHDYNAMO_VERBOSE=1` prints Dynamo's internal stack.",
                data={"error_type": type(trace.error).__name__},
            )
        )
    findings += [_fallback_finding(ctx, frame) for frame in trace.failed_frames]
    breaks = dedupe_breaks(trace.breaks, ctx.module)
    findings += [_break_finding(ctx, b) for b in breaks]

    n_graphs = len(trace.graphs)
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
                    suggestion="Fix the graph breaks (each a finding of Compilation readiness); "
                    "then `torch.compile(model, fullgraph=True)` keeps "
                    "them from coming back.",
                    data=data,
                )
            )
        elif trace.failed_frames:
            title = (
                "Nothing was compiled: Dynamo gave up on every frame, the model runs eagerly"
                if not n_graphs
                else f"No graph breaks, but {len(trace.failed_frames)} frame(s) fell back to eager: "
                f"{n_graphs} graph(s), {sum(ops)} ops compiled"
            )
            findings.append(
                Finding(
                    id="readiness.graphs",
                    severity=Severity.WARNING,
                    title=title,
                    evidence=f"{len(trace.failed_frames)} frame(s) fell back (each a finding of this section); "
                    f"ops per graph: {ops}; "
                    f"traced in {trace.seconds:.1f} s",
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


def _eager_failed(ctx: AnalysisContext, error: BaseException) -> Finding:
    loc = error_location(error, ctx.module)
    evidence = plain(short_error(error))
    if loc is not None and is_library_file(loc.file):
        # no line of the user's own: say which module's forward raised, and from where it was called
        owner = forward_owner(ctx.module, loc)
        where = f"{owner}.{loc.function}" if owner and loc.function else loc.function or "library code"
        caller = f"called from {describe(loc.via)}" if loc.via else "called on the example inputs"
        evidence += f" (raised in {where} ({describe(loc)}), {caller})"
    return Finding(
        id="readiness.eager-failed",
        severity=Severity.ERROR,
        title="The model raises when called eagerly on the example inputs",
        evidence=evidence,
        location=loc,
        suggestion="Fix the model or the example inputs first: every compile analysis needs a "
        "model that runs without torch.compile.",
    )


def _frame_name(ctx: AnalysisContext, loc: Location | None) -> str:
    """`LSTMTagger.forward` for a module's forward, else `fn` (file.py:line)."""
    if loc is None:
        return "a frame"
    function = loc.function or "<code>"
    owner = forward_owner(ctx.module, loc) if function == "forward" else None
    return f"`{owner}.forward`" if owner else f"`{function}` ({describe(loc)})"


def _rnn_data(check: RnnCheck) -> dict[str, Any]:
    data: dict[str, Any] = {"kind": "rnn", "verified": check.verified, "graphs_after": check.graphs}
    if not check.verified:
        data["unverified_reason"] = check.problem
    return data


def _rnn_fix(check: RnnCheck) -> tuple[str, str, str | None]:
    """(sentence for the evidence, the fix, the gain) of the allow_rnn check."""
    fix = RNN.fix
    if check.verified:
        said = (
            f"With `torch._dynamo.config.allow_rnn = True` it compiles as {check.graphs} graph(s), "
            f"{check.ops} ops, with fullgraph=True, and the outputs match eager's (verified)."
        )
        gain = "the recurrent part runs compiled instead of eagerly (verified: one trace with allow_rnn)"
        return said, fix, gain
    said = f"With `torch._dynamo.config.allow_rnn = True` it did not verify: {check.problem}."
    return said, f"{fix} (Not verified here: see the evidence.)", None


def _fallback_finding(ctx: AnalysisContext, frame: FailedFrame) -> Finding:
    explanation, hints = torch_explanation(frame.reason)
    loc = frame.location
    kind = classify_break(frame.reason, loc.code if loc else None)
    name = _frame_name(ctx, loc)
    evidence = f"{frame.fail_type}: {explanation}"
    data: dict[str, Any] = {"fail_type": frame.fail_type, "kind": kind.kind}
    gain = None
    if kind.kind == "rnn":
        title = (
            f"Dynamo gave up on {name}: it calls an LSTM/GRU/RNN module, which Dynamo traces only with "
            "allow_rnn; the frame runs eagerly"
        )
        said, suggestion, gain = _rnn_fix(ctx.part(check_allow_rnn))
        evidence += f" {said}"
        data.update(_rnn_data(ctx.part(check_allow_rnn)))
    else:
        title = f"Dynamo gave up on {name}: it runs eagerly, nothing of it is compiled"
        if kind.kind != "other" or hints:  # a known kind's fix, or torch's hint as the fix of an unknown one
            evidence += f" Torch's hint: {hints[0]}" if hints and kind.kind != "other" else ""
            suggestion = kind.fix
        else:
            suggestion = (
                "Make the line traceable (an exception raised only under tracing, or an unsupported "
                "construct, stops the whole frame), or move it into a helper decorated with "
                "`@torch.compiler.disable` so the rest of the frame compiles."
            )
    return Finding(
        id="readiness.frame-fallback",
        severity=Severity.ERROR,
        title=title,
        evidence=evidence,
        location=loc,
        suggestion=suggestion,
        estimated_gain=gain,
        data=data,
    )


def _break_finding(ctx: AnalysisContext, b: Break) -> Finding:
    hint = f" Torch's hint: {b.hints[0]}" if b.hints else ""
    seen = f" Reached from {b.count} call sites." if b.count > 1 else ""
    stops = ""
    if b.callers:
        shown = ", ".join(f"`{c.function}` ({describe(c)})" for c in b.callers)
        stops = f" It also stops the caller {shown}: Dynamo cannot resume in the middle of an inlined call."
    suggestion = library_fix(b.kind, b.reason, b.location) or b.kind.fix
    gain = "removes this break: one fewer graph, no Python round trip and no lost fusion across this line"
    data: dict[str, Any] = {
        "kind": b.kind.kind,
        "operation": b.kind.operation,
        "call_sites": b.count,
        "torch_hints": list(b.hints),
    }
    if b.callers:
        data["callers"] = [c.to_dict() for c in b.callers]
    evidence = f"{b.explanation}.{hint}{seen}{stops}".replace("..", ".")
    if b.kind.kind == "rnn":
        check = ctx.part(check_allow_rnn)
        said, suggestion, rnn_gain = _rnn_fix(check)
        evidence += f" {said}"
        gain = rnn_gain or gain
        data.update(_rnn_data(check))
    return Finding(
        id=f"graph-break.{b.kind.kind}",
        severity=Severity.INFO if b.kind.kind == "compiler-disabled" else Severity.WARNING,
        title=f"Graph break: {b.kind.operation}",
        evidence=evidence,
        location=b.location,
        suggestion=suggestion,
        estimated_gain=gain,
        data=data,
    )


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
    if ctx.trace.failed_frames:
        # the frame Dynamo gave up on is what fullgraph=True raises on: its own finding, not traced again
        return Finding(
            id="readiness.fullgraph",
            severity=Severity.WARNING,
            title="torch.compile(fullgraph=True) fails at the frame Dynamo gives up on",
            evidence="fullgraph=True turns a frame that falls back to eager into an error",
            suggestion="Fix the frame that falls back (its finding in Compilation readiness), then compile with "
            "fullgraph=True.",
            data={"fullgraph": False},
        )
    result = ctx.fullgraph
    if result.ok:
        return Finding(
            id="readiness.fullgraph",
            severity=Severity.INFO,
            title="torch.compile(fullgraph=True) succeeds",
            evidence=f"traced as one graph in {result.seconds:.1f} s. Compiling with fullgraph=True keeps "
            "it so: a change that adds a graph break then fails loudly instead of silently slowing down.",
            data={"fullgraph": True},
        )
    assert result.error is not None
    text = str(result.error)
    evidence = (
        f"{type(result.error).__name__}: {torch_explanation(text)[0]}"
        if "Explanation:" in text
        else plain(short_error(result.error))
    )
    location = error_location(result.error, ctx.module)
    kind = classify_break(text, location.code if location else None)
    return Finding(
        id="readiness.fullgraph",
        severity=Severity.WARNING,
        title="torch.compile(fullgraph=True) fails although no graph break was recorded",
        evidence=evidence,
        location=location,
        suggestion=kind.fix,
        data={"fullgraph": False, "kind": kind.kind},
    )
