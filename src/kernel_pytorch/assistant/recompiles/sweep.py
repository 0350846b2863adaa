"""The recompilation sweep: call the model compiled once with the trace backend on the shapes and
scalars it will meet in use, and record every compile with the guard that failed.

One `ShapeSweep` per context (`shape_sweep(ctx)`): its calls are checked eagerly once, and each sweep
(the baseline, and one per fix tried) runs once and is kept, so analyses can ask for it again.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx.experimental._config  # noqa: F401  (use_duck_shape, patched by a Fix)

from kernel_pytorch._env import recompile_limit_name
from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import compilation_metrics, fresh_dynamo, metrics_room
from kernel_pytorch.assistant.inputs import InputKey, clone_inputs, get_input, resize, with_input
from kernel_pytorch.assistant.records import CompileRecord, Fix, SweepResult, Variant

_NO_FIX = Fix()  # the baseline sweep: the model compiled and called as given


def shape_sweep(ctx: AnalysisContext) -> ShapeSweep:
    """The sweep of `ctx`, built on first use and kept with the context."""
    return ctx.part(ShapeSweep)


class ShapeSweep:
    """The calls of the recompilation sweep for one context, and the sweeps run on them.

    Args:
        ctx: the context: its module, example and extra inputs, input dims and options.
    """

    def __init__(self, ctx: AnalysisContext) -> None:
        self.ctx = ctx
        self._runs: dict[Fix, SweepResult] = {}

    @functools.cached_property
    def sizes(self) -> dict[str, tuple[int, ...]]:
        """{dim kind: sizes}, the example size first; from options.shapes where given."""
        ctx = self.ctx
        examples: dict[str, int] = {}
        for key, dims in ctx.input_dims.items():
            value = _example(ctx, key)
            for dim, kind in dims.items():
                if isinstance(value, torch.Tensor) and dim < value.dim():
                    examples.setdefault(kind, int(value.shape[dim]))
        given = dict(ctx.options.shapes or {})
        out: dict[str, tuple[int, ...]] = {}
        for kind, example in examples.items():
            sizes = tuple(given[kind]) if kind in given else default_sizes(kind, example)
            out[kind] = (example, *[s for s in sizes if s != example])
        return out

    def _resized(self, kind: str, size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The example inputs with every dim of `kind` cut or tiled to `size` (tensors inside container
        arguments included)."""
        args, kwargs = self.ctx.args, dict(self.ctx.kwargs)
        for key, dims in self.ctx.input_dims.items():
            value = _example(self.ctx, key)  # each key once: earlier keys' changes do not touch it
            if not isinstance(value, torch.Tensor):
                continue
            for dim, k in dims.items():
                if k == kind and dim < value.dim():
                    value = resize(value, dim, size)
            args, kwargs = with_input(args, kwargs, key, value)
        return args, kwargs

    @functools.cached_property
    def _checked(self) -> tuple[tuple[Variant, ...], tuple[tuple[str, str], ...]]:
        """(calls of the sweep, (label, error) of candidate calls the eager model rejected).

        One dim kind changes at a time, so each recompilation has a single cause; then each Python
        int/float argument takes two other values; the extra inputs come last. Torch's recompile reason
        names the guard that failed against the newest compiled entry, so a call whose change is the
        newest one (a dtype after the sizes, not before) is named by what it changed. Every candidate
        runs eagerly first: a size the model cannot take (a sequence longer than its position table)
        is left out, not blamed on torch.compile.
        """
        ctx = self.ctx
        ctx.progress("preparing the shape sweep")
        candidates = [Variant("example", "example", ctx.args, ctx.kwargs)]
        for kind, sizes in self.sizes.items():
            for size in sizes[1:]:
                args, kwargs = self._resized(kind, size)
                candidates.append(Variant(f"{kind}={size}", kind, args, kwargs, varied=kind, value=size))
        if ctx.options.vary_scalars:
            for key, name in ctx.input_names.items():
                value = ctx.input_value(key)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                for new in _other_values(value):
                    args, kwargs = with_input(ctx.args, ctx.kwargs, key, new)
                    candidates.append(Variant(f"{name}={new}", "scalar", args, kwargs, varied=name, value=new))
        for i, (args, kwargs) in enumerate(ctx.extra_inputs):
            candidates.append(Variant(f"extra_inputs[{i}]", "given", args, kwargs))
        kept: list[Variant] = []
        rejected: list[tuple[str, str]] = []
        with torch.no_grad():
            for v in candidates:
                if v.kind == "example":
                    kept.append(v)
                    continue
                try:
                    ctx.call(ctx.module, clone_inputs(v.args), clone_inputs(v.kwargs))
                except Exception as exc:
                    rejected.append((v.label, short_error(exc, 200)))
                    continue
                kept.append(v)
        return tuple(kept), tuple(rejected)

    @property
    def variants(self) -> tuple[Variant, ...]:
        """The calls of the sweep, the example first (see `_checked`)."""
        return self._checked[0]

    @property
    def rejected(self) -> tuple[tuple[str, str], ...]:
        """(label, short error) of the candidate calls the eager model rejected."""
        return self._checked[1]

    def apply_fix(self, fix: Fix, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple, dict]:
        """Fresh copies of the inputs with `fix` applied (scalars as tensors, dims marked dynamic)."""
        args, kwargs = tuple(clone_inputs(args)), dict(clone_inputs(kwargs))
        for key in fix.tensorize:
            value = _find(args, kwargs, key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not isinstance(key, tuple):
                args, kwargs = with_input(args, kwargs, key, torch.tensor(value, device=self.ctx.device))
        for key, dim in fix.mark_dynamic:
            value = _find(args, kwargs, key)  # the fresh copy: marking it leaves the example unmarked
            if isinstance(value, torch.Tensor) and dim < value.dim():
                torch._dynamo.mark_dynamic(value, dim)
        return tuple(args), kwargs

    def run(self, fix: Fix = _NO_FIX) -> SweepResult:
        """Compile once with the trace backend and call on every variant, recording each compile.

        The example is called again before each other variant. Torch reports the guard that failed
        against the newest cache entry only, and a call that hits an entry moves it to the front; so
        the guard a variant's recompile reports is the one that fails against the example's entry,
        from which the variant differs in one thing, not against the previous variant's entry.
        """
        if fix in self._runs:
            return self._runs[fix]
        ctx = self.ctx
        variants = self.variants
        ctx.progress("recompilation sweep" + ("" if fix.is_empty() else " with the fix applied"))
        config: dict[str, Any] = {}
        if fix.recompile_limit is not None:
            config[recompile_limit_name()] = fix.recompile_limit
        dynamic = fix.dynamic if fix.dynamic is not None else ctx.options.dynamic
        compiles: list[CompileRecord] = []
        errors: list[tuple[str, str]] = []
        start = time.perf_counter()
        with fresh_dynamo(**config), metrics_room(8 * len(variants) + 64), _duck_shape(fix.duck_shape):
            compiled = torch.compile(ctx.module, backend=ctx.options.trace_backend, dynamic=dynamic)
            seen = 0

            def call(v: Variant) -> bool:
                nonlocal seen
                args, kwargs = self.apply_fix(fix, v.args, v.kwargs)
                ok = True
                try:
                    ctx.call(compiled, args, kwargs)
                except Exception as exc:
                    ok = False
                    errors.append((v.label, short_error(exc, 400)))
                records = compilation_metrics()
                compiles.extend(CompileRecord.of(rec, v.label) for rec in records[seen:])
                seen = len(records)
                return ok

            example_ok = False
            for i, v in enumerate(variants):
                if i and example_ok:
                    call(variants[0])  # its entry to the front (see above); a hit compiles nothing
                ok = call(v)
                example_ok = example_ok or (i == 0 and ok)
        result = SweepResult(fix, tuple(compiles), tuple(errors), time.perf_counter() - start)
        self._runs[fix] = result
        return result


@contextlib.contextmanager
def _duck_shape(value: bool | None) -> Iterator[None]:
    """Patch `torch.fx.experimental._config.use_duck_shape` for a while (None: leave it)."""
    config = getattr(torch.fx.experimental, "_config", None)
    if value is None or config is None or not hasattr(config, "use_duck_shape"):
        yield
        return
    with config.patch(use_duck_shape=value):
        yield


def _find(args: tuple[Any, ...], kwargs: dict[str, Any], key: InputKey) -> Any:
    """The input at `key`, None when the inputs have none there (a key given for another call)."""
    try:
        return get_input(args, kwargs, key)
    except (KeyError, IndexError):
        return None


def _example(ctx: AnalysisContext, key: InputKey) -> Any:
    """The example input at `key`, None when there is none (an input_dims key naming no input)."""
    return _find(ctx.args, ctx.kwargs, key)


def default_sizes(kind: str, example: int) -> tuple[int, ...]:
    """Sizes to sweep for a dim of `kind` whose example size is `example`; the example size first.

    Batch grows (2x, 3x): serving varies it upward and any size works. Sequence and spatial sizes
    shrink (1/2, 3/4) so a model with a position table of the example length still accepts them.
    Size 1 is avoided unless it is the example: torch specialises dims of size 0 and 1 anyway.
    """
    if kind == "batch":
        sizes = [example, 2 * example, 3 * example]
    else:
        sizes = [example, example // 2, (3 * example) // 4]
    out: list[int] = []
    for s in sizes:
        if (s >= 2 or s == example) and s not in out:
            out.append(s)
    return tuple(out)


def _other_values(value: int | float) -> tuple[int | float, ...]:
    """Two other values of a Python scalar argument for the sweep (same type, same sign)."""
    if isinstance(value, int):
        return (value + 1, value + 2)
    if value == 0.0:
        return (0.5, 1.5)
    return (value * 0.5, value * 1.5)
