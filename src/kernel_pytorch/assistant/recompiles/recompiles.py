"""Recompilations: call the compiled model with the shapes and scalars it will meet in use, catch every
recompilation with the guard that failed, name the cause, and check the fix by running again with it.

The sweep changes one thing at a time (batch sizes, then sequence lengths, then each Python scalar),
so every recompilation has one cause. The fix for shape causes is `torch._dynamo.mark_dynamic` on the
named dims and every input dim that changes with them (or `dynamic=True` when that is not enough); for
Python scalars, passing a 0-dim tensor. The verification sweep reports the recompile count before and
after.

The sweeps run in `sweep`, the causes are named in `causes`, the fixes chosen and tried in
`fixes`, one finding per cause written in `cause_findings`; this module puts them together
with the summary and the recompile-limit finding.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel_pytorch._env import recompile_limit, recompile_limit_name
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.findings import Finding, Severity, skipped
from kernel_pytorch.assistant.locate import definition_location
from kernel_pytorch.assistant.recompiles.cause_findings import CauseContext, cause_finding, group_causes
from kernel_pytorch.assistant.recompiles.causes import Cause, classify_recompile
from kernel_pytorch.assistant.recompiles.fixes import Attempt, best_attempt, describe_fix, explain_error, try_fixes
from kernel_pytorch.assistant.recompiles.sweep import shape_sweep
from kernel_pytorch.assistant.records import CompileRecord, Fix, SweepResult

# said once per report, in the summary, when a size of 1 is among the sizes swept
SPECIALISED_NOTE = "Sizes 0 and 1 are always specialised, so a first call with size 1 still costs one recompile."


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


def root_frame(result: SweepResult) -> int | None:
    """Dynamo's index of the component's entry frame in a sweep: the frame of its first compile."""
    return result.compiles[0].frame if result.compiles else None


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
                evidence="every other call was rejected (the finding on the sweep calls left out says why)"
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
                suggestion="`torch.compile(model, dynamic=False)` for these shapes; the error is a torch.compile "
                "bug or a guard the model relies on: report it to torch with the error above.",
                data={"failed": [label for label, _ in compiled_errors]},
            )
        )

    recompiles = baseline.recompiles
    root = root_frame(baseline)
    causes = [classify_recompile(r, ctx, root) for r in recompiles]
    limit_hit = [r for r in baseline.compiles if r.hit_limit]
    n_before = len(recompiles)

    attempts = try_fixes(ctx, causes, baseline)
    best = best_attempt(attempts, n_before)
    findings.append(_summary(ctx, sweep_text, baseline, n_before, best, attempts, baseline_causes=causes))

    after = [classify_recompile(r, ctx, root_frame(best.result)) for r in best.result.recompiles] if best else []
    shared = CauseContext(attempts, best, after, root, _full_compile_seconds(ctx) if causes else None)
    for key, members in group_causes(ctx, causes).items():
        findings.append(cause_finding(ctx, key, members, shared))
    if limit_hit:
        findings.append(_limit_finding(ctx, limit_hit, best))
    return findings


def _limit_finding(ctx: AnalysisContext, limit_hit: Sequence[CompileRecord], best: Attempt | None) -> Finding:
    """The recompile limit was reached. When no verified fix keeps the calls under it, check that a
    raised limit does: one compile per distinct call of the sweep."""
    limit = recompile_limit()
    name = recompile_limit_name()
    sweep = shape_sweep(ctx)
    data: dict[str, object] = {"limit": limit, "calls": [r.variant for r in limit_hit]}
    fixed = best is not None and not any(c.hit_limit for c in best.result.compiles)
    if fixed:
        assert best is not None
        verdict = f"with `{describe_fix(best.fix, ctx)}` no call reaches it (verified)"
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
    best: Attempt | None,
    attempts: Sequence[Attempt],
    baseline_causes: Sequence[Cause],
) -> Finding:
    sweep = shape_sweep(ctx)
    variants = sweep.variants
    data = {
        "calls": len(variants),
        "recompiles_before": n_before,
        "recompiles_after": best.recompiles if best else None,
        "fix": describe_fix(best.fix, ctx) if best else None,
        "attempts": {a.label: _attempt_data(a, ctx) for a in attempts},
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
    tried = "; ".join(_attempt_text(a, ctx) for a in attempts)
    note = f" {SPECIALISED_NOTE}" if any(1 in sizes for sizes in sweep.sizes.values()) else ""
    return Finding(
        id="recompile.summary",
        severity=Severity.WARNING,
        title=f"{n_before} recompilation(s) across {len(variants)} calls"
        + (f"; {after} after the fix (verified)" if after is not None else "; no automatic fix verified"),
        evidence=f"swept {sweep_text} with dynamic={ctx.options.dynamic}. Recompiles per fix tried: "
        + (tried or "none applicable")
        + "."
        + note,
        suggestion=_summary_fix(ctx, best, attempts),
        estimated_gain=(f"{n_before} -> {after} recompiles, measured by re-running the sweep")
        if after is not None
        else None,
        data=data,
    )


def _attempt_data(a: Attempt, ctx: AnalysisContext) -> dict[str, object]:
    out: dict[str, object] = {"fix": describe_fix(a.fix, ctx), "recompiles": a.recompiles}
    if a.new_errors:
        out["errors"] = [f"{label}: {err}" for label, err in a.new_errors]
    return out


def _attempt_text(a: Attempt, ctx: AnalysisContext) -> str:
    if a.valid:
        return f"{a.label} ({describe_fix(a.fix, ctx)}): {a.recompiles}"
    label, err = a.new_errors[0]
    return f"{a.label} ({describe_fix(a.fix, ctx)}): the call {label} raised: {explain_error(err, ctx)}"


def _summary_fix(ctx: AnalysisContext, best: Attempt | None, attempts: Sequence[Attempt]) -> str:
    """The fix line of the summary: the verified fix, else the setting that prints every recompile (the
    causes below say why each stays)."""
    if best is not None:
        return describe_fix(best.fix, ctx)
    return '`TORCH_LOGS="recompiles"` prints every recompilation with its guard; no fix tried removes them'


def _skipped(why: str) -> Finding:
    return skipped("recompile", "Recompilation sweep skipped", why)
