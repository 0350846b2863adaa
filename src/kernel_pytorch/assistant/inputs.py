"""Example inputs of the component under analysis: moving, copying and resizing them, and guessing
which of their dims are the batch and the sequence.

Inputs are (args, kwargs); one input is named by its key, a position (int) or a keyword (str).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kernel_pytorch._tree import map_tensors, move

InputKey = int | str  # position of a positional argument, or name of a keyword argument
InputDims = Mapping[InputKey, Mapping[int, str]]  # {input: {dim: kind}}


def prepare(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    device: str | torch.device | None,
    dtype: torch.dtype | None,
) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """Move the module and the tensors of the inputs to `device`; cast floating ones to `dtype`."""
    dev = torch.device(device) if device is not None else None
    if dev is not None or dtype is not None:
        module = module.to(device=dev, dtype=dtype) if dtype is not None else module.to(device=dev)
    return module, move(args, dev, dtype), move(kwargs, dev, dtype)


def _clone_tensor(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, nn.Parameter):
        return nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
    return t.detach().clone()


def clone_inputs(value: Any) -> Any:
    """Fresh tensors with the same values: marks like mark_dynamic must not stick to the originals.

    Parameters stay Parameters: whether an argument is one is part of what Dynamo guards on.
    """
    return map_tensors(_clone_tensor, value)


def with_input(
    args: Sequence[Any], kwargs: Mapping[str, Any], key: InputKey, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """New (args, kwargs) with input `key` (a position or a keyword) set to `value`."""
    args, kwargs = list(args), dict(kwargs)
    if isinstance(key, int):
        args[key] = value
    else:
        kwargs[key] = value
    return tuple(args), kwargs


def resize(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """`t` with dim `dim` cut or tiled to `size`, contiguous (a view's strides would add guards).

    Tiling repeats the existing values, so token ids stay inside the vocabulary and masks stay masks.
    """
    n = t.shape[dim]
    if size > n:
        reps = [1] * t.dim()
        reps[dim] = -(-size // n)
        t = t.repeat(*reps)
    return t.narrow(dim, 0, size).contiguous()


def infer_input_dims(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[InputKey, dict[int, str]]:
    """Guess which dims of the tensor inputs are the batch and the sequence.

    Batch: dim 0 of every tensor input whose size there is the most common dim-0 size among the
    inputs of 2 or more dims (of all inputs when every one is 1-D). Sequence: dim 1 of (B, T) integer
    or boolean inputs (token ids, masks) and (B, T, C) floating inputs. Images (B, C, H, W) get
    only a batch dim: which of their dims may vary depends on the model.
    """
    tensors: dict[InputKey, torch.Tensor] = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    tensors.update({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
    multi = [t.shape[0] for t in tensors.values() if t.dim() >= 2]
    pool = multi or [t.shape[0] for t in tensors.values() if t.dim() >= 1]
    if not pool:
        return {}
    batch = max(set(pool), key=pool.count)
    out: dict[InputKey, dict[int, str]] = {}
    for key, t in tensors.items():
        dims: dict[int, str] = {}
        if t.dim() >= 1 and t.shape[0] == batch:
            dims[0] = "batch"
        integral = not t.is_floating_point() and not t.is_complex()
        if (t.dim() == 2 and integral) or (t.dim() == 3 and t.is_floating_point()):
            dims[1] = "seq"
        if dims:
            out[key] = dims
    return out
