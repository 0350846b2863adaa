"""One finding per recompile cause: its title, the guard as evidence, the fix (verified by a re-run,
or the reason no fix was verified), and the numbers behind it.

Causes are grouped before they become findings: the recompiles of one dim kind (batch, seq) are one
finding naming every input that shares the dim, whichever of them the failed guards happened to name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import backend_name, readable
from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.assistant.inputs import InputKey
from kernel_pytorch.assistant.locate import definition_location, is_library_file
from kernel_pytorch.assistant.recompiles.causes import Cause
from kernel_pytorch.assistant.recompiles.fixes import (
    Attempt,
    covers,
    describe_fix,
    dim_kind,
    input_key,
    is_duck_sizing,
    marks_for,
    why_unverified,
)

GroupKey = tuple[str, ...]


def group_key(ctx: AnalysisContext, cause: Cause) -> GroupKey:
    """Causes with the same key are one finding: a dim kind of the component's inputs, else the kind,
    the name and the dim as the guard says them (and the frame, for a guard of another frame)."""
    if cause.kind == "dynamic-dim" and input_key(ctx, cause) is not None:
        kind = dim_kind(ctx, cause)
        if kind is not None:
            return ("dynamic-dim", "kind", kind)
    frame = "" if cause.root else str(cause.frame)
    return (cause.kind, str(cause.name), str(cause.dim), frame)


def group_causes(ctx: AnalysisContext, causes: Sequence[Cause]) -> dict[GroupKey, list[Cause]]:
    groups: dict[GroupKey, list[Cause]] = {}
    for c in causes:
        groups.setdefault(group_key(ctx, c), []).append(c)
    return groups


_TITLES: dict[str, str] = {
    "stride": "Recompiles when the strides of {x} change",
    "dtype": "Recompiles when the dtype of {x} changes",
    "device": "Recompiles when {x} moves to another device",
    "requires-grad": "Recompiles when requires_grad of {x} changes",
    "grad-mode": "Recompiles when the grad mode changes between calls",
    "type-change": "Recompiles when {x} changes type (a Parameter or tensor subclass vs a plain tensor, a "
    "float vs an int or a tensor)",
    "rank": "Recompiles when the number of dims of {x} changes",
    "container-length": "Recompiles when the length of {x} changes",
    "shape-guard": "Recompiles on a size the code specialises on",
    "object-identity": "Recompiles when a non-tensor argument or attribute changes",
    "other": "Recompiles on a guard the analyser does not classify",
}

_ADVICE: dict[str, str] = {
    "stride": "Pass contiguous inputs (`x = x.contiguous()`) so every call has the same layout; a transposed "
    "or sliced view has other strides.",
    "dtype": "Cast inputs at the model boundary (`x = x.to(torch.bfloat16)`), or expect one compile per dtype.",
    "device": "Keep the inputs on one device (`x = x.to(device)` before the call).",
    "requires-grad": "Call consistently: `x.detach()` for inference, or the same requires_grad every time.",
    "grad-mode": "Run inference under `torch.inference_mode()` (or `torch.no_grad()`) every time.",
    "type-change": "Pass one type every call: `p.detach()` (a plain tensor) for a Parameter, `float(v)` for a "
    "number that is sometimes an int.",
    "rank": "Reshape to a fixed rank at the boundary (`x = x.reshape(-1, x.shape[-1])`).",
    "container-length": "Stack the items into one tensor (`torch.stack(xs)`) and mark the stacked dim "
    "dynamic, or `torch.compile(model, dynamic=True)`.",
    "shape-guard": "`torch.compile(model, dynamic=True)`, and remove the size-dependent branch "
    "(`if x.shape[0] > n:`) or the size turned into a Python int.",
    "object-identity": "Keep the value fixed while compiled (`model.eval()` once, one config object), or "
    "pass it as a tensor argument.",
    "other": '`TORCH_LOGS="recompiles"` prints every recompilation with the guard that failed.',
}


def _names(ctx: AnalysisContext, marks: Sequence[tuple[InputKey, int]]) -> str:
    """`a`, `b` (dim 0) or `a` (dim 0), `b` (dim 1) when the dims differ."""
    names = [f"`{ctx.input_name(k)}`" for k, _ in marks]
    dims = {d for _, d in marks}
    if len(dims) == 1:
        return ", ".join(names)
    return ", ".join(f"{n} (dim {d})" for n, (_, d) in zip(names, marks, strict=True))


@dataclass(frozen=True)
class CauseContext:
    """What every cause finding of one analysis shares: the fixes tried and the best, the recompiles
    left after the best, Dynamo's entry frame, and the cost of one full compile."""

    attempts: Sequence[Attempt]
    best: Attempt | None
    after: Sequence[Cause]
    root_frame: int | None
    compile_s: float | None


def cause_finding(ctx: AnalysisContext, key: GroupKey, members: Sequence[Cause], shared: CauseContext) -> Finding:
    """The finding for the causes of one group (see `group_key`)."""
    first = members[0]
    kind = first.kind
    ikey = input_key(ctx, first)
    shown = ctx.input_name(ikey) if ikey is not None else first.name
    location = next((c.location for c in members if c.location), None) or definition_location(ctx.module)
    if location is not None and location.via is None and is_library_file(location.file):
        # a guard names one frame, not a stack: the way in from the user's side is the model's forward
        entry = definition_location(ctx.module)
        if entry is not None and (entry.file, entry.line) != (location.file, location.line):
            location = replace(location, via=entry)
    n = len(members)
    best = shared.best
    verified = best is not None and covers(best.fix, ctx, first)
    remaining = sum(1 for c in shared.after if group_key(ctx, c) == key)
    data: dict[str, object] = {
        "kind": kind,
        "input": shown,
        "dim": first.dim,
        "recompiles_before": n,
        "guard": first.guard,
    }
    if not first.root:
        data["frame"] = first.frame
    marks = marks_for(ctx, first) if kind == "dynamic-dim" else ()
    if marks:
        data["inputs"] = [ctx.input_name(k) for k, _ in marks]
    if verified:
        assert best is not None
        data["recompiles_after"] = remaining
        fix_text = describe_fix(best.fix, ctx)
        after_text = f"after `{fix_text}`: {remaining} (re-run with the fix applied)"
        cost = (
            f"; each full compile with {backend_name(ctx.options.backend)} took {shared.compile_s:.1f} s here"
            if shared.compile_s
            else ""
        )
        gain: str | None = f"{n} -> {remaining} recompiles (verified){cost}"
    else:
        reason = why_unverified(ctx, first, shared.attempts, shared.root_frame)
        data["unverified_reason"] = reason
        after_text = f"no fix verified: {reason}"
        gain = None
    title, suggestion = _title_and_fix(ctx, first, members, shown, marks, verified, best)
    if not verified and kind in ("dynamic-dim", "python-scalar", "container-length", "shape-guard"):
        # the evidence says why; a fix that did not verify is not repeated as the fix
        suggestion = (
            'No verified fix (the evidence says why): `TORCH_LOGS="recompiles,dynamic"` prints each '
            "recompile and the line that fixes the size."
        )
    return Finding(
        id=f"recompile.{kind}",
        severity=Severity.WARNING,
        title=title,
        evidence=f"{n} recompile(s); failed guard: {readable(first.guard)}; {after_text}",
        location=location,
        suggestion=suggestion,
        estimated_gain=gain,
        data=data,
    )


def _frame_note(cause: Cause, members: Sequence[Cause]) -> str:
    """How a title says the guard is of another frame than the component's own."""
    if any(c.after_graph_break for c in members):
        return " (a value live across a graph break)"
    if not cause.root:
        return f" (a local of `{cause.frame}`, a frame Dynamo compiles on its own)"
    return ""


def _title_and_fix(
    ctx: AnalysisContext,
    cause: Cause,
    members: Sequence[Cause],
    shown: str | None,
    marks: Sequence[tuple[InputKey, int]],
    verified: bool,
    best: Attempt | None,
) -> tuple[str, str]:
    kind = cause.kind
    ikey = input_key(ctx, cause)
    if kind == "dynamic-dim" and ikey is None:
        title = f"Recompiles when dim {cause.dim} of `{shown}`{_frame_note(cause, members)} changes"
        return title, (
            "`torch.compile(model, dynamic=True)` makes every size symbolic, including values handed across "
            "graph breaks and between frames, which mark_dynamic on the inputs does not reach; fixing the graph "
            "break removes the extra frame altogether."
        )
    if kind == "dynamic-dim":
        dkind = dim_kind(ctx, cause)
        dims = {d for _, d in marks}
        what = f"{dkind} (dim {cause.dim})" if dkind and len(dims) <= 1 else (dkind or f"dim {cause.dim}")
        title = f"Recompiles when {what} of {_names(ctx, marks)} changes"
        mark = "; ".join(f"torch._dynamo.mark_dynamic({ctx.input_name(k)}, {d})" for k, d in marks)
        together = (
            " (all of them: the code ties their sizes, and a dim marked alone is specialised to the others')"
            if len(marks) > 1
            else ""
        )
        dynamic_first = best is not None and best.fix.dynamic is True and not best.fix.mark_dynamic
        if dynamic_first:
            how = (
                f"`torch.compile(model, dynamic=True)` (what the verification found best here; `{mark}` "
                "before the first call marks only these dims)"
            )
        else:
            every = "`torch.compile(model, dynamic=True)` for every dim"
            how = f"`{mark}` before the first compiled call{together}; {every}"
        return title, f"{how}. Either compiles one graph for every size."
    if kind == "python-scalar":
        title = f"Recompiles when the Python scalar `{shown}`{_frame_note(cause, members)} changes value"
        if ikey is None:
            return title, "`torch.compile(model, dynamic=True)` turns Python numbers into symbols instead of constants."
        call = (
            f"model(..., {shown}=torch.tensor({shown}))"
            if isinstance(ikey, str)
            else f"model(x, torch.tensor({shown}))"
        )
        return title, (
            f"Pass `{shown}` as a tensor: `{call}` (a 0-dim tensor "
            "is an input to the graph, not a constant baked into it); or `dynamic=True`."
        )
    if kind == "shape-guard" and is_duck_sizing(cause.guard):
        return "Recompiles when sizes that were equal in the first call differ (duck sizing)", (
            "Give the first call distinct sizes for dims that vary independently, or "
            "`torch.fx.experimental._config.use_duck_shape = False` before compiling: dynamic=True then gives "
            "each size its own symbol."
        )
    x = f"`{shown}`" if shown else "an input"
    return _TITLES.get(kind, _TITLES["other"]).format(x=x), _ADVICE.get(kind, _ADVICE["other"])
