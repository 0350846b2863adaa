"""`optimize(model, example_inputs)`: swap in kernel_pytorch's modules where rules match, apply the
compile fixes that are measured to help, validate the result against the original, revert what
fails, and report every change.

Validation compares the model against a copy of itself taken before any change. The copy shares the
parameter and buffer tensors (only the module objects are copied), so it costs no weight memory, and
the replacements hold those same `Parameter` objects: an optimizer built before `optimize()` keeps
working, checkpoints load both ways, ties stay tied.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import as_inputs
from kernel_pytorch.benchmark.module import infer_device
from kernel_pytorch.optimize import swap
from kernel_pytorch.optimize.compile import CompileMode, compile_model
from kernel_pytorch.optimize.compile_steps import tf32_step
from kernel_pytorch.optimize.options import CompileOptions, typed
from kernel_pytorch.optimize.report import CompileStep, OptimizeReport
from kernel_pytorch.optimize.rewrite import patterns_of
from kernel_pytorch.optimize.rewrite import sites as rewrites
from kernel_pytorch.optimize.rules import Rule, default_rules
from kernel_pytorch.validation import ValidationOptions, ValidationResult, validate_optimization


def select_rules(components: Any) -> list[Rule]:
    """The rules `components` names: "auto"/True (all built-in), False/None/"none" (none), or a list
    of rule names ("hf_rms_norm"), family names ("norm") and `Rule` objects."""
    if components in ("auto", True):
        return default_rules()
    if components in (False, None, "none"):
        return []
    if isinstance(components, str):
        components = [components]
    builtin = default_rules()
    chosen: list[Rule] = []
    for c in components:
        if isinstance(c, str):
            found = [r for r in builtin if c in (r.name, r.family)]
            if not found:
                known = sorted({r.name for r in builtin} | {r.family for r in builtin})
                raise ValueError(f"no rule or family {c!r}; known: {', '.join(known)}")
            chosen += [r for r in found if r not in chosen]
        elif isinstance(c, Rule):
            chosen.append(c)
        else:
            raise TypeError(f"components entries are rule names, families or Rule objects (got {type(c).__name__})")
    return chosen


def _reference_copy(model: nn.Module) -> nn.Module:
    """A copy of `model`'s module objects sharing its parameter and buffer tensors."""
    memo: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def _validation_inputs(model: nn.Module, inputs: tuple | dict, report: OptimizeReport) -> tuple | dict:
    """Inputs for validation: a Hugging Face model is asked not to return its KV cache (a cache object
    is not a tensor to compare; the logits and gradients are)."""
    if isinstance(inputs, dict) and "use_cache" not in inputs:
        try:
            takes = "use_cache" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            takes = False
        if takes:
            report.notes.append("validated with use_cache=False (the KV cache object is not compared)")
            return {**inputs, "use_cache": False}
    return inputs


def _why(result: ValidationResult) -> str:
    c = result.correctness_check
    if c.errors:
        return c.errors[0]
    fails = c.failures()
    if fails:
        seed, check = fails[0]
        more = f" (and {len(fails) - 1} more failing tensors)" if len(fails) > 1 else ""
        return f"seed {seed}: {check.message()}{more}"
    return "validation failed"


def optimize(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    components: Any = "auto",
    compile: CompileMode = "auto",
    validate: bool = True,
    compile_options: CompileOptions | None = None,
    extra_inputs: Sequence[Any] = (),
    tf32: bool = False,
    seeds: Sequence[int] = (0, 1),
    validate_options: ValidationOptions | None = None,
    rewrite: bool | str | Sequence[str] = False,
) -> tuple[nn.Module, OptimizeReport]:
    """Optimize `model` in place with kernel_pytorch's modules and compile fixes, validated.

    Args:
        model: any nn.Module (a Hugging Face model, a torch model); changed in place and returned.
            Optimize before sharding (then `fully_shard`, DDP): modules holding DTensor parameters, and
            every module of a model holding FSDP modules, are left as they are and listed in
            `report.sharded` (optimize/swap.py says why); such a model is not run, copied or compiled.
        example_inputs: a tuple of positional args, a dict of keyword args
            (`{"input_ids": ids, "labels": ids}`) or one tensor, as the model is called. Needed to
            validate; a Hugging Face model without them is validated on its `dummy_inputs`.
        components: "auto" (every rule), False (none), or rule names / families / `Rule` objects.
        compile: "auto" (the compile steps: regional compilation, mark_dynamic, channels_last, CUDA
            graphs, each kept where measured to help; timings on CUDA only), True (apply what the CPU
            cannot time, unmeasured), False (none).
        validate: compare outputs and gradients with the original on the inputs and revert failures.
        compile_options: how each compiled block is compiled (`CompileOptions`: backend, mode ...);
            default torch's.
        extra_inputs: more calls like `example_inputs` with other shapes (other batch sizes, sequence
            lengths): the dims that vary between them are checked for `mark_dynamic` and kept in
            `report.dynamic_dims` (and a saved model's manifest).
        tf32: opt in to TF32 for fp32 matmuls on CUDA (`torch.set_float32_matmul_precision("high")`,
            process-wide state that stays set when kept); checked with TF32's tolerance, reported.
            False (default): the global matmul precision is never touched.
        seeds: validation seeds (the first uses the inputs as given; later ones redraw them).
        validate_options: what validation checks (`ValidationOptions`); default
            `ValidationOptions.correctness_only()`: outputs and gradients on every seed, nothing timed.
        rewrite: graph rewrites of hand-written patterns in the modules' own forwards (`optimize.rewrite`):
            False (default: none), True (every family) or family names ("norm", "activation", "rope",
            "cross_entropy"). Each is validated with the rest and reverted alone if it fails;
            `report.rewrites` lists each at its source line.
    Returns:
        (model, report): the same model object with the kept changes; the report lists every change,
        kept, reverted or skipped, with reasons, and the final validation.
    Raises:
        ValueError: validate=True with no inputs to validate on.
        TypeError: compile_options or validate_options not an options object (a dict names the call to
            write instead).
    """
    compile_options = typed(compile_options, CompileOptions, "compile_options")
    validate_options = typed(validate_options, ValidationOptions, "validate_options") \
        or ValidationOptions.correctness_only()
    report = OptimizeReport()
    rules = select_rules(components)
    patterns = patterns_of(rewrite)
    inputs = as_inputs(example_inputs) if example_inputs is not None else None
    if inputs is None and isinstance(getattr(model, "dummy_inputs", None), dict):
        inputs = dict(model.dummy_inputs)
        report.notes.append(f"no example_inputs: used the model's dummy_inputs ({', '.join(inputs)})")
    if validate and inputs is None:
        raise ValueError("optimize(validate=True) needs example_inputs to validate on (or validate=False)")
    swaps, skipped = swap.plan(model, rules)  # changes nothing: the rules only look
    report.sharded = swap.sharded_modules(model)
    fsdp = swap.has_fsdp(model)
    if fsdp:
        report.notes.append("the model holds FSDP modules: none of its modules is offered to the rules, and the "
                            "model is not run (a forward outside training leaves FSDP2's root modules holding "
                            "their unsharded parameters, which an optimizer built afterwards would take)")
    if report.sharded or fsdp:
        compile, tf32 = _sharded_compile(report, compile, tf32)
        if not swaps:  # nothing to validate; a sharded model may not be copyable (FSDP2 refuses deepcopy)
            report.changes += skipped
            return model, report
    reference = None
    if validate:
        try:
            reference = _reference_copy(model)
        except Exception as exc:
            report.notes.append(f"could not copy the model to validate against ({short_error(exc, 300)}); "
                                "nothing changed")
            return model, report
    report.changes += [s.change for s in swaps] + skipped
    swap.apply(model, swaps)
    sites: list[rewrites.Site] = []
    if patterns and (report.sharded or fsdp):
        report.notes.append("rewrite: not run on a model holding sharded parameters (rewrite before sharding)")
    elif patterns:
        sites, notes = rewrites.plan(model, patterns)
        report.notes += notes
        report.rewrites += [s.record for s in sites]
        rewrites.apply(model, sites, sites)
    extra = [as_inputs(x) for x in extra_inputs]
    compiled = compile_model(model, inputs, compile, compile_options, extra)
    report.compile_steps += compiled.steps
    report.dynamic_dims = dict(compiled.dynamic_dims)
    device = infer_device(model, inputs if inputs is not None else ())
    if not validate:
        if tf32 or compile is not False:
            report.compile_steps.append(tf32_step(model, inputs, tf32, device, compile))
        return model, report
    report.validated = True
    assert reference is not None and inputs is not None
    vinputs = _validation_inputs(model, inputs, report)
    def check() -> ValidationResult:
        return validate_optimization(reference, model, vinputs, seeds=tuple(seeds), options=validate_options)

    result = check()
    if not result.passed and compiled.drop_graphs(f"failed validation: {_why(result)}"):
        result = check()
    if not result.passed and (compiled.blocks or compiled.channels_last):
        compiled.undo(model, f"failed validation: {_why(result)}")
        result = check()
    if not result.passed and sites:
        rewrites.revert(model, sites, sites, "")
        result = check()
        if not result.passed and swaps:
            result = _bisect(model, swaps, check)
        result = _bisect_rewrites(model, sites, check, result)
    elif not result.passed and swaps:
        result = _bisect(model, swaps, check)
    report.validation = result
    if not result.passed:
        report.notes.append("the model fails validation against an unchanged copy of itself: "
                            f"{_why(result)} (nothing of ours is in it)")
        if tf32:
            report.compile_steps.append(CompileStep("tf32", "skipped", "the model fails validation; global "
                                                    "state unchanged"))
    elif tf32 or compile is not False:
        # after validation, which compares the model with its copy at the same precision: TF32 is global,
        # so it would change both alike; its own check compares the model with itself at fp32
        report.compile_steps.append(tf32_step(model, inputs, tf32, device, compile))
    return model, report


def _sharded_compile(report: OptimizeReport, compile: CompileMode, tf32: bool) -> tuple[CompileMode, bool]:
    """(compile, tf32) for a model holding sharded parameters: no compile step and no TF32 check (they time
    and trace the model whole, on each rank apart), said in the report where they were asked for."""
    why = "the model holds sharded parameters (DTensors, or under FSDP): not run on it"
    if compile is not False:
        report.compile_steps.append(CompileStep(
            "regional", "skipped", f"{why}; compile each block before fully_shard (torchtitan's order: "
            "activation checkpointing, compile, fully_shard)"))
    if tf32:
        report.compile_steps.append(CompileStep("tf32", "skipped", f"{why}; global state unchanged"))
    return False, False


def _bisect(model: nn.Module, swaps: list[swap.Swap], check: Any) -> ValidationResult:
    """All swaps failed together: try each rule's swaps alone, revert the rules that fail, then check
    the survivors together (reverting all if only the combination fails). Returns the last result."""
    swap.revert(model, swaps, "")
    by_rule: dict[str, list[swap.Swap]] = {}
    for s in swaps:
        by_rule.setdefault(s.change.rule, []).append(s)
    kept: list[swap.Swap] = []
    for rule, group in by_rule.items():
        swap.apply(model, group)
        result = check()
        swap.revert(model, group, f"failed validation with the rest of rule {rule}'s swaps: {_why(result)}")
        if result.passed:
            kept += group
    swap.apply(model, kept)
    for s in kept:
        s.change.status, s.change.detail = "applied", ""
    result = check()
    if not result.passed and kept:
        swap.revert(model, kept, f"passed rule by rule, failed together: {_why(result)}")
        result = check()
    return result


def _bisect_rewrites(model: nn.Module, sites: list[rewrites.Site], check: Any, base: ValidationResult
                     ) -> ValidationResult:
    """The rewrites failed with the rest of the changes and are all out, `base` the result without them:
    try each alone on top of the kept swaps, then the survivors together (reverting all if only the
    combination fails). Returns the last result."""
    if not base.passed:
        for s in sites:
            s.record.detail = "not kept: the model fails validation without any rewrite"
        return base
    kept: list[rewrites.Site] = []
    for s in sites:
        rewrites.apply(model, [s], sites)
        result = check()
        rewrites.revert(model, [s], sites, f"failed validation: {_why(result)}")
        if result.passed:
            kept.append(s)
    if not kept:
        return base
    rewrites.apply(model, kept, sites)
    result = check()
    if not result.passed:
        rewrites.revert(model, kept, sites, f"passed one by one, failed together: {_why(result)}")
        result = check()
    return result


__all__ = ["optimize", "select_rules"]
