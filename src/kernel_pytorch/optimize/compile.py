"""The compile side of `optimize()`: the analyser's fixes that change how a model is compiled, each
kept only where a measurement says it helps. In the report, in this order:

- `regional`: regional compilation (`assistant.regional.find_repeated_blocks`): compile each repeated
  block (decoder layer, transformer block) in place with `nn.Module.compile`, so identical blocks share
  one graph. `compile="auto"` times the forward+backward before and after on CUDA and keeps the blocks
  compiled only when the slow end of the compiled band beats the fast end of the eager one; on the CPU
  it measures nothing and applies nothing (CPU timings say nothing about the GPU), and says so.
  `compile=True` applies it whatever the device, measured where possible.
- `mark_dynamic`: from the example and `extra_inputs` of other shapes, the dims that vary
  (`optimize.dynamic`); kept when compiling with them marked recompiles less across those shapes (a
  count, not a timing, so checked on the CPU too; the check resets Dynamo, as the analyser does, so
  other models compiled in the process recompile on their next call). Kept dims go to
  `report.dynamic_dims`, which `kernel_pytorch.save` writes as the manifest's `dynamic_dims`.
- `channels_last`, `cuda_graphs` (and `tf32`, which `optimize()` runs after validation):
  `optimize.compile_steps`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.regional import find_repeated_blocks
from kernel_pytorch.benchmark.module import infer_device
from kernel_pytorch.optimize.compile_steps import (
    channels_last_step,
    compile_blocks,
    cuda_graph_step,
    faster,
    fwd_bwd_ms,
    timing,
    uncompile,
)
from kernel_pytorch.optimize.dynamic import count_recompiles, varying_dims
from kernel_pytorch.optimize.report import CompileStep

CompileMode = Literal["auto"] | bool

# Inductor options for compiling an optimized model whole: torch.compile(model, options=INDUCTOR_OPTIONS).
# allow_buffer_reuse off: Inductor frees each buffer of a compiled graph after its last use instead of
# holding it for a later buffer of the same size. A compiled training step's backward otherwise keeps the
# last layer's MLP gradients ((N, I) buffers, held for the next layer's) alive through its attention
# backward, where the step's memory peaks. The e2e step (HF Llama, 8 layers, 4 x 2048 tokens, H200):
# peak 9203 -> 8982 MiB (benchmarks/results/probes/e2e/probe_e2e_memory_h200.txt); the freed blocks go back
# to the caching allocator, which hands them to the next allocation of any size. Same run, reuse on and
# off (benchmarks/results/probes/e2e/buffer_reuse_h200.md): 64.95 against 65.47 ms a step (+0.8%; the q20-q80
# bands overlap).
# Not for mode="reduce-overhead" (torch.compile takes a mode or options, not both). Pass a copy to
# change it: torch.compile keeps the dict it is given.
INDUCTOR_OPTIONS: dict[str, Any] = {"allow_buffer_reuse": False}


def _blocks(model: nn.Module) -> tuple[list[nn.Module], str] | None:
    found = find_repeated_blocks(model)
    if found is None:
        return None
    container = model.get_submodule(found.path) if found.path else model
    entries = list(container)
    where = f"{found.count} x {found.block_type} in {found.path or 'the model'}"
    return [entries[i] for i in found.indices], where


@dataclass
class CompileResult:
    """What `compile_model` did: the steps for the report, the blocks left compiled, whether the weights
    went to channels_last, and the dims kept dynamic (input name -> dims). Unpacks as (steps, blocks)."""

    steps: list[CompileStep] = field(default_factory=list)
    blocks: list[nn.Module] = field(default_factory=list)
    channels_last: bool = False
    dynamic_dims: dict[str, list[int]] = field(default_factory=dict)
    graphs: bool = False  # the blocks are compiled with mode="reduce-overhead" ...
    options: dict[str, Any] = field(default_factory=dict)  # ... instead of these options

    def drop_graphs(self, why: str) -> bool:
        """Recompile the blocks without CUDA graphs (`options`), marking that step reverted with `why`;
        False when they had none."""
        if not self.graphs:
            return False
        uncompile(self.blocks)
        compile_blocks(self.blocks, self.options)
        for s in self.steps:
            if s.name == "cuda_graphs" and s.status == "applied":
                s.status, s.reason = "reverted", f"{s.reason}; {why}"
        self.graphs = False
        return True

    def __iter__(self) -> Iterator[Any]:  # `steps, blocks = compile_model(...)`, as before
        return iter((self.steps, self.blocks))

    def undo(self, model: nn.Module, why: str) -> None:
        """Revert what changed the model (compiled blocks, channels_last), marking those steps reverted
        with `why`. The dynamic dims stay: they describe the inputs, not the model."""
        if not (self.blocks or self.channels_last):
            return
        uncompile(self.blocks)
        if self.channels_last:
            model.to(memory_format=torch.contiguous_format)
        for s in self.steps:
            if s.name in ("regional", "cuda_graphs", "channels_last") and s.status == "applied":
                s.status, s.reason = "reverted", f"{s.reason}; {why}"
        self.blocks, self.channels_last, self.graphs = [], False, False


def mark_dynamic_step(model: nn.Module, inputs: Any, extra: list[Any]) -> tuple[CompileStep, dict[str, list[int]]]:
    """Find the dims that vary across `inputs` and `extra`, and check that marking them dynamic compiles
    fewer graphs over those calls. Returns (the step, the dims kept: input name -> dims)."""
    if inputs is None or not extra:
        return CompileStep("mark_dynamic", "skipped", "needs extra_inputs of other shapes beside the example to "
                           "know which dims vary; not applied"), {}
    found = varying_dims(model, inputs, extra)
    problems = "; ".join(found.problems)
    if not found.marks:
        return CompileStep("mark_dynamic", "skipped", f"no dim varies across the {len(extra) + 1} calls"
                           + (f" ({problems})" if problems else "")), {}
    calls = [inputs, *extra]
    dims = ", ".join(f"{name} {d}" for name, d in found.names.items())
    try:
        plain = count_recompiles(model, calls)
        marked = count_recompiles(model, calls, found.marks)
    except Exception as exc:
        return CompileStep("mark_dynamic", "skipped", f"{dims}: the check failed: {short_error(exc, 300)}"), {}
    measured = {"calls": float(len(calls)), "recompiles_unmarked": float(plain.recompiles),
                "recompiles_marked": float(marked.recompiles)}
    new = [f"{label}: {err}" for label, err in marked.errors if label not in dict(plain.errors)]
    extra_note = f"; {problems}" if problems else ""
    if marked.first > 1:
        measured["frames_first_call"] = float(marked.first)
        extra_note += (f"; the first call compiled {marked.first} frames (graph breaks): a frame after a break "
                       "gets intermediate tensors, which the input marks do not reach")
    if new:
        return CompileStep("mark_dynamic", "reverted", f"{dims}: marking them makes calls fail ({new[0]})"
                           + extra_note, measured), {}
    if marked.recompiles and marked.recompiles >= plain.recompiles:
        return CompileStep("mark_dynamic", "reverted", f"{dims}: no fewer recompiles with them marked"
                           + extra_note, measured), {}
    return CompileStep("mark_dynamic", "applied", f"{dims}: the {len(calls)} calls compile "
                       f"{'once' if not marked.recompiles else 'with fewer recompiles'} with them marked "
                       "(checked with backend='eager'); recorded in report.dynamic_dims (the saved manifest's). "
                       "Mark them before the first compiled call: kernel_pytorch.optimize.mark_dynamic_inputs("
                       "model, inputs, report.dynamic_dims), or torch._dynamo.mark_dynamic(tensor, dim)"
                       + extra_note, measured), dict(found.names)


def _regional(model: nn.Module, inputs: Any, mode: CompileMode, options: dict[str, Any],
              measurable: bool) -> tuple[CompileStep, list[nn.Module]]:
    found = _blocks(model)
    if found is None:
        return CompileStep("regional", "skipped", "no repeated blocks holding a quarter of the parameters"), []
    blocks, where = found
    if mode == "auto" and not measurable:
        why = "on the CPU" if inputs is not None else "without example inputs"
        return CompileStep("regional", "skipped", f"{where}: not measured {why}, so not applied "
                           "(compile='auto' keeps only measured gains; compile=True applies it)"), []
    before = fwd_bwd_ms(model, inputs) if measurable else None
    compile_blocks(blocks, options)
    if not measurable:
        return CompileStep("regional", "applied", f"{where}: compiled each block (not measured)"), blocks
    try:
        after = fwd_bwd_ms(model, inputs)
    except Exception as exc:
        uncompile(blocks)
        return CompileStep("regional", "reverted", f"{where}: {short_error(exc, 300)}"), []
    measured = timing(before, after, ("eager", "compiled"))
    if mode == "auto" and not faster(before, after):
        uncompile(blocks)
        return CompileStep("regional", "reverted", f"{where}: not faster beyond the timing spread", measured), []
    return CompileStep("regional", "applied", f"{where}: compiled each block", measured), blocks


def compile_model(
    model: nn.Module, inputs: Any, mode: CompileMode, options: dict[str, Any] | None = None,
    extra_inputs: list[Any] | None = None,
) -> CompileResult:
    """Apply the compile fixes `mode` asks for to `model` in place.

    Args:
        model: the (already swapped) model.
        inputs: example inputs (tuple of args or dict of kwargs), or None (nothing is measured).
        mode: "auto" (measured on CUDA, kept only if faster), True (apply), False (nothing).
        options: keyword arguments for `nn.Module.compile` (backend, mode, dynamic ...).
        extra_inputs: more calls like `inputs`, of other shapes, for `mark_dynamic`.
    Returns:
        a `CompileResult`: the steps for the report (regional, mark_dynamic, channels_last,
        cuda_graphs), and what to undo on a failed validation; it unpacks as (steps, blocks).
    """
    if mode is False:
        return CompileResult()
    options = dict(options or {})
    device = infer_device(model, inputs) if inputs is not None else torch.device("cpu")
    measurable = device.type == "cuda" and inputs is not None
    out = CompileResult()
    # first: its check resets Dynamo, which would drop the blocks' compiled code
    dynamic, out.dynamic_dims = mark_dynamic_step(model, inputs, list(extra_inputs or []))
    layout, out.channels_last = channels_last_step(model, inputs, mode, measurable)
    regional, out.blocks = _regional(model, inputs, mode, options, measurable)
    graphs, out.graphs = cuda_graph_step(model, inputs, out.blocks, options, device, mode)
    out.options = options
    out.steps = [regional, dynamic, layout, graphs]
    return out


__all__ = ["CompileMode", "CompileResult", "compile_model", "mark_dynamic_step", "uncompile"]
