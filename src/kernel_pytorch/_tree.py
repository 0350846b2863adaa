"""Nested outputs and inputs as named leaves: tuples, lists, dicts (HF `ModelOutput` included),
namedtuples and dataclasses, down to tensors and plain values.

Names read like Python access paths, so a report can say `output['logits']` or
`output.hidden_states[3]` and a user can paste it. Imports only torch; any layer may use it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

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


def nbytes(obj: Any) -> int:
    """Total bytes of the tensor leaves of `obj`."""
    return sum(t.numel() * t.element_size() for t in tensors(obj))


def clone_detached(obj: Any) -> Any:
    """A deep copy of the tensor leaves (detached, fresh storage); other leaves are shared."""
    return map_tensors(lambda t: t.detach().clone(), obj)


def devices(obj: Any) -> set[torch.device]:
    """Devices of the tensor leaves of `obj`."""
    return {t.device for t in tensors(obj)}


__all__ = ["children", "clone_detached", "devices", "flatten", "map_tensors", "nbytes", "tensors"]
