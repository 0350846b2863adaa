"""Recompilations: call the compiled model with the shapes and scalars it will meet in use, catch every
recompilation with the guard that failed, name the cause, and check the fix by running again with it.

The sweep changes one thing at a time (batch sizes, then sequence lengths, then each Python scalar),
so every recompilation has one cause. The fix for shape causes is `torch._dynamo.mark_dynamic` on the
named dims (or `dynamic=True` when that is not enough); for Python scalars, passing a 0-dim tensor.
The verification sweep reports the recompile count before and after.

The sweeps run in `sweep`, the causes are named in `recompile_causes`; this module turns them into
fixes to try and findings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernel_pytorch._env import recompile_limit, recompile_limit_name
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import backend_name
from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.assistant.inputs import InputKey
from kernel_pytorch.assistant.locate import definition_location
from kernel_pytorch.assistant.recompile_causes import SHAPE_LIKE, Cause, classify_recompile
from kernel_pytorch.assistant.records import CompileRecord, Fix, SweepResult
from kernel_pytorch.assistant.sweep import shape_sweep


@dataclass(frozen=True)
class _Attempt:
    label: str
    fix: Fix
    result: SweepResult


def _plan(causes: Sequence[Cause], ctx: AnalysisContext) -> Fix:
    """The targeted fix: mark the dims that recompiled dynamic, pass the scalars that did as tensors."""
    marks: list[tuple[InputKey, int]] = []
    scalars: list[InputKey] = []
    for c in causes:
        key = ctx.resolve_input(c.name) if c.name else None
        if key is None:
            continue
        if c.kind == "dynamic-dim" and c.dim is not None and (key, c.dim) not in marks:
            marks.append((key, c.dim))
        elif c.kind == "python-scalar" and key not in scalars:
            scalars.append(key)
    return Fix(mark_dynamic=tuple(marks), tensorize=tuple(scalars))


def _describe_fix(fix: Fix, ctx: AnalysisContext) -> str:
    parts = [f"torch._dynamo.mark_dynamic({ctx.input_names.get(k, k)}, {d})" for k, d in fix.mark_dynamic]
    parts += [f"pass {ctx.input_names.get(k, k)} as torch.tensor(value)" for k in fix.tensorize]
    if fix.dynamic is not None:
        parts.append(f"torch.compile(..., dynamic={fix.dynamic})")
    if fix.recompile_limit is not None:
        parts.append(f"torch._dynamo.config.{recompile_limit_name()} = {fix.recompile_limit}")
    return "; ".join(parts) or "nothing"


def _new_errors(attempt: SweepResult, baseline: SweepResult) -> list[tuple[str, str]]:
    old = {label for label, _ in baseline.errors}
    return [(label, err) for label, err in attempt.errors if label not in old]


def _sweep_summary(ctx: AnalysisContext) -> str:
    """The calls besides the example: the extra inputs by label, then the values each swept thing took."""
    variants = shape_sweep(ctx).variants
    given = [v.label for v in variants if v.kind == "given"]
    by_varied: dict[str, list[str]] = {}
    for v in variants:
        if v.varied is not None:
            by_varied.setdefault(v.varied, []).append(str(v.value))
    parts = [", ".join(given)] if given else []
    parts += [f"{k} in {{{', '.join(vs)}}}" for k, vs in by_varied.items()]
    return "; ".join(parts) or "the example only"


def _group_key(c: Cause) -> tuple[str, str | None, int | None]:
    return (c.kind, c.name, c.dim)


def _dim_label(ctx: AnalysisContext, key: InputKey, dim: int | None) -> str:
    """How a finding names a dim of an input: its kind when known ("seq (dim 1)"), else "dim 1"."""
    kind = ctx.input_dims.get(key, {}).get(dim)
    return f"{kind} (dim {dim})" if kind else f"dim {dim}"


_ADVICE: dict[str, str] = {
    "stride": "An input arrives with different strides (a transposed or sliced view). Pass contiguous "
    "inputs (`x.contiguous()`) so every call has the same layout.",
    "dtype": "The input dtype changes between calls; each dtype is its own graph. Cast inputs at the "
    "model boundary (`x.to(torch.bfloat16)`) or expect one compile per dtype.",
    "device": "The input moves between devices; each device is its own graph. Keep inputs on one device.",
    "requires-grad": "Inputs alternate between requiring grad and not. Call consistently: "
    "`x.detach()` for inference, or the same requires_grad every time.",
    "grad-mode": "Calls alternate between grad modes. Run inference under `torch.inference_mode()` "
    "(or `torch.no_grad()`) every time.",
    "type-change": "The same argument is sometimes an nn.Parameter (or a tensor subclass) and sometimes "
    "a plain tensor; each type is its own graph. Pass `p.detach()` or always the same type.",
    "rank": "The number of dims of an input changes; each rank is its own graph. Reshape to a fixed rank "
    "at the boundary.",
    "container-length": "A list or tuple argument changes length; each length is its own graph. Stack "
    "the items into one tensor and mark the stacked dim dynamic.",
    "shape-guard": "The model's code specialises on a size (a branch on `x.shape[...]`, a size turned "
    "into a Python int). Compile with `dynamic=True` and remove the size-dependent branch.",
    "object-identity": "A non-tensor argument or module attribute changes between calls (a config "
    "object, a flag, `self.training`). Keep it fixed while compiled, or pass it as a tensor.",
    "other": "See the failed guard; `TORCH_LOGS=recompiles` prints every one.",
}


def analyze_recompilations(ctx: AnalysisContext) -> list[Finding]:
    """Sweep shapes and scalars, classify each recompilation, verify the fix, count before and after."""
    if not ctx.eager.ok:
        return [_skipped("the model does not run eagerly on its example inputs")]
    if ctx.trace.error is not None:
        return [_skipped("torch.compile cannot trace the model (see compilation readiness)")]
    sweep = shape_sweep(ctx)
    variants, rejected = sweep.variants, sweep.rejected
    findings: list[Finding] = []
    if rejected:
        listing = "; ".join(f"{label}: {err}" for label, err in rejected)
        findings.append(
            Finding(
                id="recompile.rejected-sizes",
                severity=Severity.INFO,
                title=f"{len(rejected)} sweep call(s) left out: the eager model rejects them",
                evidence=listing,
                suggestion="Give sizes the model accepts with shapes={...} (CLI: --shapes).",
                data={"rejected": [label for label, _ in rejected]},
            )
        )
    if len(variants) < 2:
        findings.append(
            Finding(
                id="recompile.no-sweep",
                severity=Severity.INFO,
                title="No recompilation sweep: no call besides the example",
                evidence="every other call was rejected (above)"
                if rejected
                else f"dims found: {ctx.input_dims or 'none'}; sizes: {sweep.sizes or 'none'}; "
                "no Python scalar arguments to vary",
                suggestion="Pass input_dims={0: {0: 'batch'}} and shapes={'batch': (2, 4, 8)} "
                '(CLI: --shapes "batch=2,4,8") to sweep a dim.',
            )
        )
        return findings

    baseline = sweep.run()
    sweep_text = _sweep_summary(ctx)
    compiled_errors = baseline.errors
    if compiled_errors:
        findings.append(
            Finding(
                id="recompile.call-failed",
                severity=Severity.ERROR,
                title=f"The compiled model fails on {len(compiled_errors)} call(s) the eager model accepts",
                evidence="; ".join(f"{label}: {err}" for label, err in compiled_errors),
                location=definition_location(ctx.module),
                suggestion="A torch.compile bug or a guard the model relies on; compile with "
                "dynamic=False for these shapes or report it with the error above.",
                data={"failed": [label for label, _ in compiled_errors]},
            )
        )

    recompiles = baseline.recompiles
    causes = [classify_recompile(r, ctx) for r in recompiles]
    limit_hit = [r for r in baseline.compiles if r.hit_limit]
    n_before = len(recompiles)

    attempts: list[_Attempt] = []
    plan = _plan(causes, ctx)
    if not plan.is_empty():
        attempts.append(_Attempt("targeted", plan, sweep.run(plan)))
    # mark_dynamic reaches only the model's own inputs; a size passed across a graph break or a guard
    # the code itself adds needs dynamic=True
    unreachable = any(c.kind in SHAPE_LIKE and (c.name is None or ctx.resolve_input(c.name) is None) for c in causes)
    needs_dynamic = any(c.kind in SHAPE_LIKE for c in causes) and (
        unreachable
        or not attempts
        or len(attempts[0].result.recompiles) > 1
        or _new_errors(attempts[0].result, baseline)
    )
    if needs_dynamic and ctx.options.dynamic is not True:
        fix = Fix(dynamic=True)
        attempts.append(_Attempt("dynamic=True", fix, sweep.run(fix)))
    valid = [a for a in attempts if not _new_errors(a.result, baseline)]
    best = min(valid, key=lambda a: len(a.result.recompiles), default=None)
    if best is not None and len(best.result.recompiles) >= n_before:
        best = None  # tried, verified, and no better: say so rather than recommend it

    findings.append(_summary(ctx, sweep_text, baseline, n_before, best, attempts, baseline_causes=causes))

    groups: dict[tuple[str, str | None, int | None], list[Cause]] = {}
    for c in causes:
        groups.setdefault(_group_key(c), []).append(c)
    after_causes = [classify_recompile(r, ctx) for r in best.result.recompiles] if best else []
    compile_s = _full_compile_seconds(ctx) if causes else None
    for (kind, name, dim), members in groups.items():
        key = ctx.resolve_input(name) if name else None
        remaining = sum(1 for c in after_causes if _group_key(c) == (kind, name, dim))
        findings.append(_cause_finding(ctx, kind, name, dim, key, members, remaining, best, compile_s))
    if limit_hit:
        findings.append(_limit_finding(ctx, limit_hit, best))
    return findings


def _limit_finding(ctx: AnalysisContext, limit_hit: Sequence[CompileRecord], best: _Attempt | None) -> Finding:
    """The recompile limit was reached. When no verified fix keeps the calls under it, check that a
    raised limit does: one compile per distinct call of the sweep."""
    limit = recompile_limit()
    name = recompile_limit_name()
    sweep = shape_sweep(ctx)
    data: dict[str, object] = {"limit": limit, "calls": [r.variant for r in limit_hit]}
    fixed = best is not None and not any(c.hit_limit for c in best.result.compiles)
    if fixed:
        assert best is not None
        verdict = f"with `{_describe_fix(best.fix, ctx)}` no call reaches it (verified)"
        suggestion = f"Apply the fix above; raising `torch._dynamo.config.{name}` only hides the cost."
    else:
        raised = max(2 * limit, len(sweep.variants) + 1)
        result = sweep.run(Fix(recompile_limit=raised))
        still = [c for c in result.compiles if c.hit_limit]
        data.update({"raised_limit": raised, "limit_hit_after": len(still)})
        verdict = (
            f"with the limit at {raised}: {len(still)} call(s) still hit it"
            if still
            else f"with the limit at {raised} every call compiles (verified), at {len(result.recompiles)} recompiles"
        )
        suggestion = (
            "Remove the causes above first. If the variety is real and bounded, raise the limit: "
            f"`torch._dynamo.config.{name} = {raised}`."
        )
    return Finding(
        id="recompile.limit",
        severity=Severity.ERROR,
        title=f"Recompile limit ({limit}) reached: later calls run eagerly, uncompiled",
        evidence=f"{len(limit_hit)} call(s) hit `torch._dynamo.config.{name}`, first at {limit_hit[0].variant}; "
        f"{verdict}",
        location=definition_location(ctx.module),
        suggestion=suggestion,
        data=data,
    )


def _full_compile_seconds(ctx: AnalysisContext) -> float | None:
    """Seconds one full compile with the real backend took, if compile time was measured."""
    if not ctx.options.measure_compile_time:
        return None
    profile = ctx.profile
    if profile.error is not None or not profile.records:
        return None
    total = sum(
        (r.get("dynamo_cumulative_compile_time_us") or 0) / 1e6 or (r.get("entire_frame_compile_time_s") or 0)
        for r in profile.records
    )
    return total or None


def _summary(
    ctx: AnalysisContext,
    sweep_text: str,
    baseline: SweepResult,
    n_before: int,
    best: _Attempt | None,
    attempts: Sequence[_Attempt],
    baseline_causes: Sequence[Cause],
) -> Finding:
    variants = shape_sweep(ctx).variants
    data = {
        "calls": len(variants),
        "recompiles_before": n_before,
        "recompiles_after": len(best.result.recompiles) if best else None,
        "fix": _describe_fix(best.fix, ctx) if best else None,
        "attempts": {
            a.label: {"fix": _describe_fix(a.fix, ctx), "recompiles": len(a.result.recompiles)} for a in attempts
        },
        "causes": sorted({c.kind for c in baseline_causes}),
        "sweep_seconds": round(baseline.seconds, 3),
    }
    if n_before == 0:
        return Finding(
            id="recompile.summary",
            severity=Severity.INFO,
            title=f"No recompilation across {len(variants)} calls",
            evidence=f"swept {sweep_text} with dynamic={ctx.options.dynamic}",
            data=data,
        )
    after = data["recompiles_after"]
    tried = "; ".join(f"{a.label} ({_describe_fix(a.fix, ctx)}): {len(a.result.recompiles)}" for a in attempts)
    return Finding(
        id="recompile.summary",
        severity=Severity.WARNING,
        title=f"{n_before} recompilation(s) across {len(variants)} calls"
        + (f"; {after} after the fix (verified)" if after is not None else "; no automatic fix verified"),
        evidence=f"swept {sweep_text} with dynamic={ctx.options.dynamic}. Recompiles per fix tried: "
        + (tried or "none applicable"),
        suggestion=_describe_fix(best.fix, ctx) if best else "see the causes below",
        estimated_gain=(f"{n_before} -> {after} recompiles, measured by re-running the sweep")
        if after is not None
        else None,
        data=data,
    )


def _cause_finding(
    ctx: AnalysisContext,
    kind: str,
    name: str | None,
    dim: int | None,
    key: InputKey | None,
    members: Sequence[Cause],
    remaining: int,
    best: _Attempt | None,
    compile_s: float | None,
) -> Finding:
    shown = ctx.input_names.get(key, name) if key is not None else name
    location = next((c.location for c in members if c.location), None) or definition_location(ctx.module)
    n = len(members)
    guard = members[0].guard
    # the verified fix covers this cause when it marked this dim, tensorised this scalar, or is dynamic=True
    verified = best is not None and (
        (kind == "dynamic-dim" and (key, dim) in best.fix.mark_dynamic)
        or (kind == "python-scalar" and key in best.fix.tensorize)
        or (best.fix.dynamic is True and kind in SHAPE_LIKE)
    )
    after_text = (
        f"after `{_describe_fix(best.fix, ctx)}`: {remaining} (re-run with the fix applied)"
        if verified and best
        else "the fixes tried did not remove it (see the summary)"
        if kind in SHAPE_LIKE
        else "no automatic fix applies; not re-run"
    )
    backend = backend_name(ctx.options.backend)
    cost = f"; each full compile with {backend} took {compile_s:.1f} s here" if compile_s else ""
    gain = f"{n} -> {remaining} recompiles (verified){cost}" if verified else None
    data = {"kind": kind, "input": shown, "dim": dim, "recompiles_before": n, "guard": guard}
    if verified:
        data["recompiles_after"] = remaining

    if kind == "dynamic-dim" and key is None:
        where = " (a value live across a graph break)" if any(c.after_graph_break for c in members) else ""
        title = f"Recompiles when dim {dim} of `{shown}`{where} changes"
        suggestion = (
            "`torch.compile(model, dynamic=True)` makes every size symbolic, including "
            "values handed across graph breaks, which mark_dynamic on the inputs does not reach; "
            "fixing the graph break removes the extra frame altogether."
        )
    elif kind == "dynamic-dim":
        what = _dim_label(ctx, key, dim)
        dynamic_first = best is not None and best.fix.dynamic is True and not best.fix.mark_dynamic
        mark = f"torch._dynamo.mark_dynamic({shown}, {dim})"
        how = (
            f"`torch.compile(model, dynamic=True)` (what the verification found best here; `{mark}` "
            "before the first call marks only this dim)"
            if dynamic_first
            else f"`{mark}` before the first compiled call (or `torch.compile(model, dynamic=True)` for every dim)"
        )
        title = f"Recompiles when {what} of `{shown}` changes"
        suggestion = (
            f"{how} compiles one graph for every size. Sizes 0 and 1 are always specialised, "
            "so a first call with size 1 still costs one recompile."
        )
    elif kind == "python-scalar":
        title = f"Recompiles when the Python scalar `{shown}` changes value"
        suggestion = (
            f"Pass `{shown}` as a tensor: `model(x, torch.tensor({shown}))` (a 0-dim tensor "
            "is an input to the graph, not a constant baked into it); or `dynamic=True`."
        )
    else:
        title = f"Recompiles on a {kind.replace('-', ' ')} change" + (f" of `{shown}`" if shown else "")
        suggestion = _ADVICE.get(kind, _ADVICE["other"])
    return Finding(
        id=f"recompile.{kind}",
        severity=Severity.WARNING,
        title=title,
        evidence=f"{n} recompile(s); failed guard: {guard}; {after_text}",
        location=location,
        suggestion=suggestion,
        estimated_gain=gain,
        data=data,
    )


def _skipped(why: str) -> Finding:
    return Finding(
        id="recompile.skipped",
        severity=Severity.INFO,
        title="Recompilation sweep skipped",
        evidence=why,
    )
