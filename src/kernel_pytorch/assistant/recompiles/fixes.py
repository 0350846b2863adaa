"""Fixes for recompilations: which inputs to mark dynamic (every input that shares the changing dim,
not only the one the failed guard names), which to try when that is not enough, and, for a cause no
fix removed, what the remaining guard says and what would remove it.

Dynamo reports one failed guard per recompile: the first tensor it checks. Inputs that the code ties
together (logits and targets, Q/K/V, input_ids and attention_mask) change together, and marking only
the named one makes Dynamo specialise the marked dim to the others' static size
(ConstraintViolationError); so the targeted fix marks every input dim of the same kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kernel_pytorch._env import recompile_limit_name
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.inputs import InputKey
from kernel_pytorch.assistant.recompiles.causes import SHAPE_LIKE, Cause, classify_recompile, failed_guard
from kernel_pytorch.assistant.recompiles.sweep import shape_sweep
from kernel_pytorch.assistant.records import Fix, SweepResult


@dataclass(frozen=True)
class Attempt:
    """One fix tried: its label ("targeted", "dynamic=True"), the fix, the sweep run with it, and the
    calls that raised with the fix but not without it (the attempt is then not valid)."""

    label: str
    fix: Fix
    result: SweepResult
    new_errors: tuple[tuple[str, str], ...] = ()

    @property
    def valid(self) -> bool:
        return not self.new_errors

    @property
    def recompiles(self) -> int:
        return len(self.result.recompiles)


def input_key(ctx: AnalysisContext, cause: Cause) -> InputKey | None:
    """The component input a cause's guard names: None for a guard of another frame (its names are that
    frame's locals, whatever they are called) or a name that is no input."""
    return ctx.resolve_input(cause.name) if cause.root and cause.name else None


def dim_kind(ctx: AnalysisContext, cause: Cause) -> str | None:
    """The kind ("batch", "seq", ...) of the dim a dynamic-dim cause names: from the input's dims,
    else the kind the sweep call that recompiled varied."""
    key = input_key(ctx, cause)
    kind = ctx.input_dims.get(key, {}).get(cause.dim) if key is not None else None
    if kind is None and cause.variant is not None:
        variant = next((v for v in shape_sweep(ctx).variants if v.label == cause.variant), None)
        if variant is not None and variant.varied in shape_sweep(ctx).sizes:
            kind = variant.varied
    return kind


def co_varying(ctx: AnalysisContext, kind: str) -> tuple[tuple[InputKey, int], ...]:
    """Every (input, dim) of `kind`: the dims the sweep changes together, so the ones to mark together."""
    return tuple((key, dim) for key, dims in ctx.input_dims.items() for dim, k in dims.items() if k == kind)


def marks_for(ctx: AnalysisContext, cause: Cause) -> tuple[tuple[InputKey, int], ...]:
    """The (input, dim) pairs to mark dynamic for a dynamic-dim cause: the named one and every input dim
    of the same kind."""
    key = input_key(ctx, cause)
    kind = dim_kind(ctx, cause) if cause.dim is not None else None
    group = co_varying(ctx, kind) if kind else ()
    if key is not None and cause.dim is not None and (key, cause.dim) not in group:
        group = ((key, cause.dim), *group)
    return group


def plan_fix(causes: Sequence[Cause], ctx: AnalysisContext) -> Fix:
    """The targeted fix: mark the dims that recompiled dynamic, with every input dim that changes with
    them; pass the scalars that recompiled as tensors."""
    marks: list[tuple[InputKey, int]] = []
    scalars: list[InputKey] = []
    for c in causes:
        if c.kind == "dynamic-dim":
            marks.extend(m for m in marks_for(ctx, c) if m not in marks)
        key = input_key(ctx, c)
        if c.kind == "python-scalar" and key is not None and not isinstance(key, tuple) and key not in scalars:
            scalars.append(key)
    return Fix(mark_dynamic=tuple(marks), tensorize=tuple(scalars))


def describe_fix(fix: Fix, ctx: AnalysisContext) -> str:
    """The fix as the lines of code a user writes, "; "-separated."""
    parts = [f"torch._dynamo.mark_dynamic({ctx.input_name(k)}, {d})" for k, d in fix.mark_dynamic]
    parts += [f"pass {ctx.input_name(k)} as torch.tensor(value)" for k in fix.tensorize]
    if fix.dynamic is not None:
        parts.append(f"torch.compile(..., dynamic={fix.dynamic})")
    if fix.recompile_limit is not None:
        parts.append(f"torch._dynamo.config.{recompile_limit_name()} = {fix.recompile_limit}")
    if fix.duck_shape is not None:
        parts.append(f"torch.fx.experimental._config.use_duck_shape = {fix.duck_shape}")
    return "; ".join(parts) or "nothing"


def _new_errors(attempt: SweepResult, baseline: SweepResult) -> tuple[tuple[str, str], ...]:
    old = {label for label, _ in baseline.errors}
    return tuple((label, err) for label, err in attempt.errors if label not in old)


def try_fixes(ctx: AnalysisContext, causes: Sequence[Cause], baseline: SweepResult) -> list[Attempt]:
    """Re-run the sweep with the targeted fix, then with dynamic=True where that is needed: a size
    mark_dynamic cannot reach (a value of another frame), or the targeted fix left recompiles or failed."""
    sweep = shape_sweep(ctx)
    attempts: list[Attempt] = []
    plan = plan_fix(causes, ctx)
    if not plan.is_empty():
        result = sweep.run(plan)
        attempts.append(Attempt("targeted", plan, result, _new_errors(result, baseline)))
    unreachable = any(c.kind in SHAPE_LIKE and input_key(ctx, c) is None for c in causes)
    needs_dynamic = any(c.kind in SHAPE_LIKE for c in causes) and (
        unreachable or not attempts or attempts[0].recompiles > 1 or not attempts[0].valid
    )
    if needs_dynamic and ctx.options.dynamic is not True:
        fix = Fix(dynamic=True)
        result = sweep.run(fix)
        attempts.append(Attempt("dynamic=True", fix, result, _new_errors(result, baseline)))
    # dynamic=True gives sizes equal in the first call one symbol (duck sizing); a later call where
    # they differ recompiles on their equality: check that separate symbols remove it
    dynamic = [a for a in attempts if a.valid and a.fix.dynamic is True]
    left = dynamic[0].result.recompiles if dynamic else baseline.recompiles if ctx.options.dynamic else ()
    if any(_EQUAL.search(failed_guard(r.recompile_reason or "")) for r in left):
        fix = Fix(dynamic=True if ctx.options.dynamic is not True else None, duck_shape=False)
        result = sweep.run(fix)
        attempts.append(Attempt("no duck sizing", fix, result, _new_errors(result, baseline)))
    return attempts


def best_attempt(attempts: Sequence[Attempt], n_before: int) -> Attempt | None:
    """The valid attempt with the fewest recompiles, if it has fewer than the baseline."""
    best = min((a for a in attempts if a.valid), key=lambda a: a.recompiles, default=None)
    return best if best is not None and best.recompiles < n_before else None


def covers(fix: Fix, ctx: AnalysisContext, cause: Cause) -> bool:
    """Whether `fix` addresses `cause`: marks its dims, tensorises its scalar, or is dynamic=True (or
    un-duck-sizes the model compiled with it)."""
    dynamic = fix.dynamic is True or (fix.duck_shape is not None and ctx.options.dynamic is True)
    if dynamic and cause.kind in SHAPE_LIKE:
        return True
    if cause.kind == "dynamic-dim":
        wanted = marks_for(ctx, cause)
        return bool(wanted) and all(m in fix.mark_dynamic for m in wanted)
    return cause.kind == "python-scalar" and input_key(ctx, cause) in fix.tensorize


# ----- why a cause stays ---------------------------------------------------------------------------

_NOT_TRIED: dict[str, str] = {
    "dtype": "each dtype is its own graph: no compile setting shares one graph across dtypes",
    "device": "each device is its own graph: no compile setting shares one graph across devices",
    "stride": "the fix is in the calling code (contiguous inputs), which the analyser does not change",
    "requires-grad": "the fix is in the calling code (one requires_grad setting), which the analyser does not change",
    "grad-mode": "the fix is in the calling code (one grad mode), which the analyser does not change",
    "type-change": "the fix is in the calling code (one argument type), which the analyser does not change",
    "rank": "each rank is its own graph: reshaping at the boundary is a change to the calling code",
    "object-identity": "the value is not an input the analyser can pass another way; keeping it fixed is a "
    "change to the calling code",
    "other": "the analyser knows no fix for this guard",
}

_RANGE = re.compile(r"(?:(\d+) <= )?(\S+?)\.size\(\)\[(\d+)\] <= (\d+)")
_CONSTANT = re.compile(r"You marked (\S+?) as dynamic but your code specialized it to be a constant \((\d+)\)")
_EQUAL = re.compile(r"\bEq\(|size\(\)\[\d+\] == \S+\.size\(\)\[\d+\]")


def is_duck_sizing(guard: str) -> bool:
    """A guard that two sizes are equal: what dynamic=True's one symbol for equal sizes leaves."""
    return _EQUAL.search(guard) is not None


def explain_guard(guard: str, ctx: AnalysisContext, dynamic: bool = False) -> str:
    """What a guard that survived the fixes says, and what would remove it (`dynamic`: it survived
    dynamic=True, so a size mismatch there is a size the code needs exactly)."""
    m = _RANGE.search(guard)
    if m:
        lo, name, dim, hi = m.group(1) or "0", m.group(2), m.group(3), m.group(4)
        key = ctx.resolve_input(name)
        shown = ctx.input_name(key) if key is not None else name
        return (
            f"the code bounds dim {dim} of `{shown}` to {lo}..{hi} (an assert, a table of {hi} rows): sizes "
            f"outside need their own graph; `torch._dynamo.mark_dynamic({shown}, {dim}, min={lo}, max={hi})` "
            f"states the range (guard: {guard})"
        )
    if _EQUAL.search(guard):
        return (
            "two dims of the example share a size, and dynamic=True gives equal sizes one symbol (duck "
            f"sizing): a call where they differ recompiles; pick distinct example sizes (guard: {guard})"
        )
    if dynamic and "size mismatch" in guard:
        return (
            "even dynamic=True keeps this size a constant: the code needs it exactly (a branch on it, a size "
            f"turned into a Python int) (guard: {guard})"
        )
    return f"no fix found: the guard `{guard}` still fails"


def explain_error(error: str, ctx: AnalysisContext) -> str:
    """What an error a fix provoked says (a dim marked dynamic that the code specialises)."""
    m = _CONSTANT.search(error)
    if m:
        key = ctx.resolve_input(m.group(1).split(".size()")[0])
        shown = ctx.input_name(key) if key is not None else m.group(1)
        return (
            f"marking `{shown}` dynamic conflicts with the code, which specialises that size to the constant "
            f"{m.group(2)} (another input of that size is static, or the code branches on it or reads it as a "
            "Python int)"
        )
    return f"the fix made a call fail: {error}"


def why_unverified(ctx: AnalysisContext, cause: Cause, attempts: Sequence[Attempt], root_frame: int | None) -> str:
    """Why no fix removed `cause`: what was tried and what the remaining guard (or error) says, or why
    nothing could be tried for its kind."""
    if cause.kind not in SHAPE_LIKE:
        return _NOT_TRIED.get(cause.kind, _NOT_TRIED["other"]) + "; not re-run"
    tried = [a for a in attempts if covers(a.fix, ctx, cause)] or list(attempts)
    if not tried:
        if ctx.options.dynamic is True:
            return f"the model is compiled with dynamic=True already; {explain_guard(cause.guard, ctx)}"
        return f"no fix reaches it; {explain_guard(cause.guard, ctx)}"
    parts = [f"{a.label}: {explain_error(a.new_errors[0][1], ctx)}" for a in tried if not a.valid]
    valid = [a for a in tried if a.valid]
    if valid:
        best = min(valid, key=lambda a: a.recompiles)
        remaining = [classify_recompile(r, ctx, root_frame) for r in best.result.recompiles]
        guard = next((c.guard for c in remaining if c.kind == cause.kind), None) or (
            remaining[0].guard if remaining else cause.guard
        )
        dynamic = best.fix.dynamic is True or ctx.options.dynamic is True
        parts.append(f"{best.label}: {best.recompiles} left; {explain_guard(guard, ctx, dynamic)}")
    return "; ".join(parts)
