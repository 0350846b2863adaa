"""Nested outputs and inputs as named leaves: tuples, lists, dicts (HF `ModelOutput` included),
namedtuples and dataclasses, down to tensors and plain values.

Names read like Python access paths, so a report can say `output['logits']` or
`output.hidden_states[3]` and a user can paste it. `record` writes a dataclass record (a benchmark or
validation result) as a JSON-ready dict. Imports only torch; any layer may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def children(obj: Any) -> list[tuple[str, Any]] | None:
    """(access suffix, child) pairs of a container, or None for a leaf."""
    if isinstance(obj, Tensor):
        return None
    if isinstance(obj, Mapping):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if _is_namedtuple(obj):
        return [(f".{f}", getattr(obj, f)) for f in type(obj)._fields]
    if isinstance(obj, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f".{f.name}", getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return None


def flatten(obj: Any, prefix: str = "output") -> list[tuple[str, Any]]:
    """Leaves of `obj` in a fixed order, each with its access path (`prefix` for a bare leaf).

    Args:
        obj: any nesting of containers; tensors and non-container values are leaves.
        prefix: name of the root.
    Returns:
        [(path, leaf)]; empty containers contribute nothing.
    """
    kids = children(obj)
    if kids is None:
        return [(prefix, obj)]
    out: list[tuple[str, Any]] = []
    for suffix, child in kids:
        out.extend(flatten(child, prefix + suffix))
    return out


def tensors(obj: Any) -> list[Tensor]:
    """Every tensor leaf of `obj`, in `flatten` order."""
    return [leaf for _, leaf in flatten(obj) if isinstance(leaf, Tensor)]


def map_tensors(fn: Callable[[Tensor], Any], obj: Any) -> Any:
    """`obj` rebuilt with `fn` applied to each tensor leaf (containers keep their types)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        items = {k: map_tensors(fn, v) for k, v in obj.items()}
        if type(obj) is dict:
            return items
        try:  # OrderedDict, HF ModelOutput: keyword construction keeps the type
            return type(obj)(**items)
        except TypeError:
            return items
    if _is_namedtuple(obj):
        return type(obj)(*(map_tensors(fn, v) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_tensors(fn, getattr(obj, f.name))
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


Inputs = tuple | dict
"""Example inputs as passed to a model: positional args as a tuple, or keyword args as a dict."""


def as_inputs(inputs: Any) -> Inputs:
    """Positional args as a tuple, keyword args (any mapping: HF `BatchEncoding` too) as a dict;
    any other value (a lone tensor) becomes a 1-tuple."""
    if isinstance(inputs, Mapping):
        return dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of example inputs in any form `as_inputs` takes."""
    norm = as_inputs(inputs)
    return ((), norm) if isinstance(norm, dict) else (norm, {})


def call(fn: Callable[..., Any], inputs: Inputs) -> Any:
    """fn(*inputs) for a tuple, fn(**inputs) for a dict."""
    return fn(**inputs) if isinstance(inputs, Mapping) else fn(*inputs)


def move(obj: Any, device: torch.device | str | None, dtype: torch.dtype | None = None) -> Any:
    """`obj` with its tensors moved to `device` (None: left where they are) and its floating-point
    tensors cast to `dtype` (None: kept); integer and bool tensors keep their dtype."""
    dev = torch.device(device) if device is not None else None
    if dev is None and dtype is None:
        return obj
    return map_tensors(lambda t: t.to(device=dev, dtype=dtype if t.is_floating_point() else None), obj)


def nbytes(obj: Any) -> int:
    """Total bytes of the tensor leaves of `obj`."""
    return sum(t.numel() * t.element_size() for t in tensors(obj))


def clone_detached(obj: Any) -> Any:
    """A deep copy of the tensor leaves (detached, fresh storage); other leaves are shared."""
    return map_tensors(lambda t: t.detach().clone(), obj)


def bitwise_equal(a: Tensor, b: Tensor) -> bool:
    """Same shape, dtype and bytes (NaNs with the same bits compare equal, -0.0 differs from 0.0);
    tensors on different devices are compared on the CPU."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    x, y = (t.detach().reshape(-1).contiguous().view(torch.uint8) for t in (a, b))
    if x.device != y.device:
        x, y = x.cpu(), y.cpu()
    return torch.equal(x, y)


def devices(obj: Any) -> set[torch.device]:
    """Devices of the tensor leaves of `obj`."""
    return {t.device for t in tensors(obj)}


def record(obj: Any, **rename: str) -> dict[str, Any]:
    """A dataclass's fields as a JSON-ready dict, in field order.

    A value with a `to_dict()` goes through it, as do the values of a dict and the items of a list of
    such; everything else is kept as it is. `rename` maps field names to keys, e.g. `pass_name="pass"`.
    """
    return {rename.get(f.name, f.name): _recorded(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


class Recorded:
    """A dataclass whose `to_dict()` is `record(self)`, its fields renamed by `RENAME`: the one JSON form of
    the results and reports. A per-pass row's `pass_name` is written "pass" (a Python keyword, hence the
    field's name)."""

    RENAME: ClassVar[Mapping[str, str]] = {"pass_name": "pass"}

    def to_dict(self) -> dict[str, Any]:
        return record(self, **self.RENAME)


def _recorded(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _recorded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_recorded(v) for v in value]
    return value


__all__ = [
    "Inputs", "Recorded", "as_inputs", "bitwise_equal", "call", "children", "clone_detached", "devices", "flatten",
    "map_tensors", "move", "nbytes", "record", "split_inputs", "tensors",
]

