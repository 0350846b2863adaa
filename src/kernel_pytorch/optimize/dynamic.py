"""`mark_dynamic` from several shapes: which input dims vary across the example and the extra inputs,
and a check that compiling with those dims marked dynamic compiles once for every shape.

Inputs are read as the analyser reads them (`assistant.inputs`): one key per tensor leaf, whole
arguments or tensors inside container arguments. A dim varies when its size differs between any two
calls; every varying dim is marked, on every input that has it, since marking only one of the inputs
the code ties together (input_ids and labels) makes Dynamo specialise it to the others' static size
(see `assistant.recompiles.fixes`). Names are the forward's parameter names ("input_ids", or
"batch['x']" for a tensor inside an argument), as the deploy manifest's `dynamic_dims` records them.

The check compiles the whole model with a trace-only backend (`backend="eager"`: Dynamo traces, no
code is generated), calls it on every shape with and without the marks, and counts the frames compiled
after the first call. It measures recompiles, not time, so it runs on any device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import call, split_inputs
from kernel_pytorch.assistant.dynamo import compilation_metrics, fresh_dynamo, metrics_room
from kernel_pytorch.assistant.inputs import InputKey, clone_inputs, get_input, leaves, positional_names

Marks = dict[InputKey, list[int]]  # {input key: dims to mark dynamic}


@dataclass
class VaryingDims:
    """What varies across the calls: `marks` by input key, `names` the same by input name, and
    `problems`: calls that cannot share a graph whatever is marked (another structure, rank or dtype),
    and dims that take size 0 or 1 somewhere (torch specialises those sizes)."""

    marks: Marks = field(default_factory=dict)
    names: dict[str, list[int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def input_name(model: nn.Module, key: InputKey) -> str:
    """The name of input `key` in `model.forward`'s signature: "input_ids", "x", "batch['x']";
    "args[2]" for a position the signature does not name."""
    root, path = (key[0], key[1]) if isinstance(key, tuple) else (key, "")
    if isinstance(root, int):
        names = positional_names(model)
        root = names[root] if root < len(names) else f"args[{root}]"
    return f"{root}{path}"


def _tensors(inputs: tuple | dict) -> dict[InputKey, torch.Tensor]:
    args, kwargs = split_inputs(inputs)
    return {k: v for k, v in leaves(args, kwargs) if isinstance(v, torch.Tensor)}


def varying_dims(model: nn.Module, example: tuple | dict, extra: Sequence[tuple | dict]) -> VaryingDims:
    """The tensor dims whose size differs between `example` and any of `extra` (each a tuple of args
    or a dict of kwargs, like the example)."""
    out = VaryingDims()
    base = _tensors(example)
    others = [_tensors(x) for x in extra]
    for i, other in enumerate(others):
        if set(other) != set(base):
            names = sorted(input_name(model, k) for k in set(other) ^ set(base))
            out.problems.append(f"extra_inputs[{i}] has other tensor inputs than the example ({', '.join(names)}): "
                                "it compiles a graph of its own whatever is marked; left out")
    others = [o for o in others if set(o) == set(base)]
    args, kwargs = split_inputs(example)
    for key, value in leaves(args, kwargs):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seen = {value}
            for x in extra:
                try:
                    seen.add(get_input(*split_inputs(x), key))
                except (KeyError, IndexError):
                    pass
            if len(seen) > 1:
                out.problems.append(f"{input_name(model, key)} is a Python number that changes across the calls: "
                                    "Dynamo specialises it (a recompile per value until it goes dynamic); pass it "
                                    "as a tensor")
    for key, t in base.items():
        name = input_name(model, key)
        shapes = [t.shape] + [o[key].shape for o in others]
        if len({len(s) for s in shapes}) > 1 or len({o[key].dtype for o in others} | {t.dtype}) > 1:
            out.problems.append(f"{name} changes rank or dtype across the calls: each compiles its own graph")
            continue
        dims = [d for d in range(t.dim()) if len({s[d] for s in shapes}) > 1]
        small = [d for d in dims if min(s[d] for s in shapes) <= 1]
        if small:
            out.problems.append(f"{name} dim(s) {small} take size 0 or 1 in some call: torch specialises those "
                                "sizes, so such a call compiles a graph of its own")
        if dims:
            out.marks[key] = dims
            out.names[name] = dims
    return out


def mark_inputs(inputs: tuple | dict, marks: Marks) -> tuple | dict:
    """Fresh copies of `inputs` with `marks` applied (`torch._dynamo.mark_dynamic`); the given tensors
    stay unmarked."""
    fresh = clone_inputs(inputs)
    args, kwargs = split_inputs(fresh)
    for key, dims in marks.items():
        value = get_input(args, kwargs, key)
        for d in dims:
            torch._dynamo.mark_dynamic(value, d)
    return fresh


def mark_dynamic_inputs(model: nn.Module, inputs: Any, dynamic_dims: Mapping[str, Sequence[int]]) -> None:
    """Mark the dims `dynamic_dims` names ({"input_ids": [0, 1]}, the report's or the manifest's) on the
    tensors of `inputs` in place, before the first call of a compiled model, so it compiles one graph
    for every size of those dims.

    Args:
        model: the model `inputs` are for (its forward's signature names positional inputs).
        inputs: a tuple of positional args or a dict of keyword args, as the model is called.
        dynamic_dims: input name -> dims.
    """
    args, kwargs = split_inputs(inputs if isinstance(inputs, (tuple, list, Mapping)) else (inputs,))
    for key, value in leaves(args, kwargs):
        dims = dynamic_dims.get(input_name(model, key))
        if isinstance(value, torch.Tensor) and dims:
            for d in dims:
                torch._dynamo.mark_dynamic(value, int(d))


@dataclass
class RecompileCount:
    """Frames compiled by the first call, frames compiled by the later calls (the recompiles), and the
    calls that raised (label, short error)."""

    first: int
    recompiles: int
    errors: list[tuple[str, str]]


def count_recompiles(model: nn.Module, calls: Sequence[tuple | dict], marks: Marks | None = None,
                     backend: str = "eager") -> RecompileCount:
    """Compile `model` once (`torch.compile(model, backend=backend)`, Dynamo reset before and after) and
    call it on each of `calls` in turn (under no_grad), with `marks` applied to fresh copies of each.

    Returns:
        the frames compiled by the first call and by the others, and the calls that raised.
    """
    errors: list[tuple[str, str]] = []
    first = 0
    with fresh_dynamo(), metrics_room(8 * len(calls) + 64):
        compiled = torch.compile(model, backend=backend)
        for i, inputs in enumerate(calls):
            label = "example" if i == 0 else f"extra_inputs[{i - 1}]"
            try:
                call(compiled, mark_inputs(inputs, marks) if marks else clone_inputs(inputs))
            except Exception as exc:
                errors.append((label, short_error(exc, 300)))
            if i == 0:
                first = len(compilation_metrics())
        total = len(compilation_metrics())
    return RecompileCount(first, total - first, errors)


__all__ = ["RecompileCount", "VaryingDims", "count_recompiles", "input_name", "mark_dynamic_inputs",
           "mark_inputs", "varying_dims"]
