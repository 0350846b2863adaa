"""How `register_op` reads an op's description: the schema implied by the reference's annotations, and
the autograd plan (which values the forward saves and keeps, how the backward's outputs map onto the
inputs' gradients) bound as C-level pickers. Shared by the registration (`register.py`) and the eager
fast path (`fast_path.py`); registers nothing itself."""

from __future__ import annotations

import inspect
import itertools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, Optional

from torch import Tensor

# map(is_not, optional_inputs, NONES): whether each was given, without a Python frame per call
NONES = itertools.repeat(None)


class Schema(NamedTuple):
    signature: inspect.Signature  # the reference's, with schema types (infer_schema reads it)
    inputs: tuple[str, ...]
    optional_inputs: frozenset[str]  # Tensor | None parameters
    n_outputs: int
    single: bool  # the op returns one Tensor, not a tuple
    optional_outputs: tuple[int, ...]  # outputs that may be None (empty in the op)
    defaults: tuple[Any, ...]  # the default values of the trailing parameters that have one


def _is_optional_tensor(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and set(
        typing.get_args(annotation)
    ) == {Tensor, type(None)}


def schema_of(reference: Callable[..., Any]) -> Schema:
    """The op schema implied by the reference's annotations (resolved here: infer_schema would
    evaluate string annotations in the body's module, not the reference's)."""
    hints = typing.get_type_hints(reference)
    params, optional = [], set()
    for p in inspect.signature(reference).parameters.values():
        annotation = hints[p.name]
        if _is_optional_tensor(annotation):
            annotation = Optional[Tensor]  # noqa: UP045 (the form every torch's infer_schema reads)
            optional.add(p.name)
        params.append(p.replace(annotation=annotation))
    if not params or hints[params[0].name] is not Tensor:
        raise TypeError(f"{reference.__qualname__}: the first parameter must be a Tensor (its device picks the kernel)")
    if "return" not in hints:
        raise TypeError(f"{reference.__qualname__}: needs a return annotation (the op's outputs)")
    returns = hints["return"]
    single = typing.get_origin(returns) is not tuple
    items = (returns,) if single else typing.get_args(returns)
    optional_out = tuple(i for i, t in enumerate(items) if _is_optional_tensor(t))
    items = tuple(Tensor if i in optional_out else t for i, t in enumerate(items))
    return Schema(
        signature=inspect.Signature(params, return_annotation=items[0] if single else tuple[items]),
        inputs=tuple(p.name for p in params),
        optional_inputs=frozenset(optional),
        n_outputs=len(items),
        single=single,
        optional_outputs=optional_out,
        defaults=tuple(p.default for p in params if p.default is not inspect.Parameter.empty),
    )


def _picker(indices: Sequence[int]) -> Callable[[tuple], tuple]:
    """A C-level callable returning the tuple of `t[i] for i in indices` (itemgetter returns a bare
    item for one index, so one index is a slice)."""
    if len(indices) == 1:
        return itemgetter(slice(indices[0], indices[0] + 1))
    if not indices:
        return itemgetter(slice(0, 0))
    return itemgetter(*indices)


def _index(names: Sequence[str], table: Mapping[str, int], what: str, op: str) -> list[int]:
    missing = [n for n in names if n not in table]
    if missing:
        raise ValueError(f"{op}: {what} names {missing}, not among {list(table)}")
    return [table[n] for n in names]


class Plan(NamedTuple):
    """How the autograd glue moves values, as C-level pickers bound once."""

    saved: Callable[[tuple], tuple]  # (*inputs, *outputs) -> tensors to save
    kept: Callable[[tuple], tuple]  # inputs -> non-tensor values for the backward
    flagged: Callable[[tuple], tuple] | None  # inputs -> optional inputs whose presence it takes
    flag: int | None  # the one such input's index, where there is exactly one
    returned: Callable[[tuple], Any]  # outputs -> the eager entry's result (a tensor, or a tuple)
    grads_of: Callable[[tuple], tuple]  # gradients of every output -> those of the differentiable ones
    route: Callable[[tuple], tuple]  # (None, *backward outputs) -> one gradient (or None) per input
    optional_grads: tuple[int, ...]  # inputs that may be None and have a gradient


def plan_of(
    name: str, outputs: Sequence[str], backward_outputs: Sequence[str], fs: Schema, bs: Schema,
    differentiable: Sequence[str], save: Sequence[str], keep: Sequence[str], present: Sequence[str],
    grads: Mapping[str, str],
) -> Plan:
    """Check the description against both schemas (forward `fs`, backward `bs`) and bind it."""
    inputs = {n: i for i, n in enumerate(fs.inputs)}
    slots = {**inputs, **{n: len(inputs) + j for j, n in enumerate(outputs)}}
    bad = [n for n in present if n not in fs.optional_inputs]
    if bad:
        raise ValueError(f"{name}: present names {bad}, which are not optional tensor inputs")
    diff = _index(differentiable, {n: j for j, n in enumerate(outputs)}, "differentiable", name)
    if not diff:
        raise ValueError(f"{name}: a backward needs at least one differentiable output")
    expected = len(diff) + len(save) + len(keep) + len(present)
    if len(bs.inputs) != expected:
        raise ValueError(
            f"{name}_bwd takes {len(bs.inputs)} arguments; the description gives {expected} "
            "(gradients, saved tensors, kept values, presence flags)"
        )
    _index(list(grads), inputs, "grads", name)
    sources = _index(list(grads.values()), {n: j for j, n in enumerate(backward_outputs)}, "grads", name)
    source = dict(zip(grads, sources))
    return Plan(
        saved=_picker(_index(save, slots, "save", name)),
        kept=_picker(_index(keep, inputs, "keep", name)),
        flagged=_picker(_index(present, inputs, "present", name)) if present else None,
        flag=inputs[present[0]] if len(present) == 1 else None,
        returned=itemgetter(*diff),  # one index: the tensor itself
        grads_of=_picker(diff),
        # index 0 of (None, *backward outputs) is None: the gradient of an input without one
        route=_picker([1 + source[n] if n in source else 0 for n in fs.inputs]),
        optional_grads=tuple(inputs[n] for n in fs.inputs if n in source and n in fs.optional_inputs),
    )
