"""The compile side of `optimize()`: the analyser's fixes that change how a model is compiled, each
kept only where a measurement says it helps.

- Regional compilation (`assistant.regional.find_repeated_blocks`): compile each repeated block
  (decoder layer, transformer block) in place with `nn.Module.compile`, so identical blocks share one
  graph. `compile="auto"` times the forward+backward before and after on CUDA and keeps the blocks
  compiled only when the slow end of the compiled band beats the fast end of the eager one; on the CPU
  it measures nothing and applies nothing (CPU timings say nothing about the GPU), and says so.
  `compile=True` applies it whatever the device, measured where possible.
- `mark_dynamic` for varying dims needs inputs of several shapes to know which dims vary: not applied
  from one example, and reported as such.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.regional import find_repeated_blocks
from kernel_pytorch.benchmark.module import benchmark_module, infer_device
from kernel_pytorch.optimize.report import CompileStep

CompileMode = Literal["auto"] | bool


def _blocks(model: nn.Module) -> tuple[list[nn.Module], str] | None:
    found = find_repeated_blocks(model)
    if found is None:
        return None
    container = model.get_submodule(found.path) if found.path else model
    entries = list(container)
    where = f"{found.count} x {found.block_type} in {found.path or 'the model'}"
    return [entries[i] for i in found.indices], where


def _fwd_bwd_ms(model: nn.Module, inputs: Any) -> tuple[float, float, float] | None:
    """(median, q20, q80) of the forward+backward in ms, or None when it cannot run."""
    result = benchmark_module(model, inputs, passes=("fwd+bwd",), measure_memory=False)
    timing = result.passes["fwd+bwd"].timing
    return None if timing is None else (timing.median_ms, timing.q20_ms, timing.q80_ms)


def uncompile(blocks: list[nn.Module]) -> None:
    """Undo `nn.Module.compile` on `blocks` (the instance's compiled call is dropped)."""
    for b in blocks:
        b._compiled_call_impl = None


def compile_model(
    model: nn.Module, inputs: Any, mode: CompileMode, options: dict[str, Any] | None = None
) -> tuple[list[CompileStep], list[nn.Module]]:
    """Apply the compile fixes `mode` asks for to `model` in place.

    Args:
        model: the (already swapped) model.
        inputs: example inputs (tuple of args or dict of kwargs), or None (nothing is measured).
        mode: "auto" (measured on CUDA, kept only if faster), True (apply), False (nothing).
        options: keyword arguments for `nn.Module.compile` (backend, mode, dynamic ...).
    Returns:
        (the steps for the report, the blocks left compiled, for `uncompile` on a failed validation).
    """
    if mode is False:
        return [], []
    steps = [CompileStep("mark_dynamic", "skipped",
                         "needs example inputs of several shapes to know which dims vary; not applied")]
    found = _blocks(model)
    if found is None:
        steps.insert(0, CompileStep("regional", "skipped",
                                    "no repeated blocks holding a quarter of the parameters"))
        return steps, []
    blocks, where = found
    device = infer_device(model, inputs) if inputs is not None else torch.device("cpu")
    measurable = device.type == "cuda" and inputs is not None
    if mode == "auto" and not measurable:
        why = "on the CPU" if inputs is not None else "without example inputs"
        steps.insert(0, CompileStep("regional", "skipped", f"{where}: not measured {why}, so not applied "
                                    "(compile='auto' keeps only measured gains; compile=True applies it)"))
        return steps, []
    before = _fwd_bwd_ms(model, inputs) if measurable else None
    for b in blocks:
        b.compile(**(options or {}))
    if not measurable:
        steps.insert(0, CompileStep("regional", "applied", f"{where}: compiled each block (not measured)"))
        return steps, blocks
    try:
        after = _fwd_bwd_ms(model, inputs)
    except Exception as exc:
        uncompile(blocks)
        steps.insert(0, CompileStep("regional", "reverted", f"{where}: {short_error(exc, 300)}"))
        return steps, []
    measured = None
    if before and after:
        measured = {"eager_ms": before[0], "compiled_ms": after[0], "speedup": before[0] / after[0]}
    if mode == "auto" and not (before and after and after[2] < before[1]):
        uncompile(blocks)
        steps.insert(0, CompileStep("regional", "reverted", f"{where}: not faster beyond the timing spread",
                                    measured))
        return steps, []
    steps.insert(0, CompileStep("regional", "applied", f"{where}: compiled each block", measured))
    return steps, blocks


__all__ = ["CompileMode", "compile_model", "uncompile"]
