"""Example inputs of the component under analysis: moving, copying and resizing them, and guessing
which of their dims are the batch and the sequence.

Inputs are (args, kwargs); one input is named by its key: a position (int) or a keyword (str) for a
whole argument, or `(position or keyword, path)` for a tensor inside one (a dict, a dataclass, an HF
`ModelOutput`), the path written as Python access (`"['x']"`, `".mask"`, `"[0]['ids']"`, as
`kernel_pytorch._tree.flatten` spells it), so `batch['x']` names the tensor `x` of argument `batch`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kernel_pytorch._tree import flatten, map_tensors, move

# a whole argument (its position or keyword), or a tensor inside one: (position or keyword, path)
InputKey = int | str | tuple[int | str, str]
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


def positional_names(module: nn.Module) -> list[str]:
    """The names of `module.forward`'s parameters that positional arguments bind to, in order ([] where
    the signature cannot be read)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def root_of(key: InputKey) -> int | str:
    """The argument (position or keyword) an input key lies in."""
    return key[0] if isinstance(key, tuple) else key


def leaves(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Iterator[tuple[InputKey, Any]]:
    """(key, value) of every input: whole arguments that are not containers, and the leaves of those
    that are (tensors and plain values inside dicts, lists, dataclasses), in argument order."""
    roots: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
    for root, value in roots:
        for path, leaf in flatten(value, ""):
            yield (root if path == "" else (root, path)), leaf


def get_input(args: Sequence[Any], kwargs: Mapping[str, Any], key: InputKey) -> Any:
    """The input at `key` (KeyError or IndexError when there is none)."""
    root = root_of(key)
    value = args[root] if isinstance(root, int) else kwargs[root]
    if not isinstance(key, tuple):
        return value
    for path, leaf in flatten(value, ""):
        if path == key[1]:
            return leaf
    raise KeyError(key)


def with_input(
    args: Sequence[Any], kwargs: Mapping[str, Any], key: InputKey, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """New (args, kwargs) with input `key` set to `value`.

    A tensor inside an argument is replaced in a rebuilt copy of its containers (`_tree.map_tensors`,
    which keeps their types); the same tensor object reached by two paths is replaced at both.
    """
    args, kwargs = list(args), dict(kwargs)
    root = root_of(key)
    if isinstance(key, tuple):
        old = get_input(args, kwargs, key)
        if not isinstance(old, torch.Tensor):
            raise TypeError(f"only tensors inside an argument can be replaced, not {type(old).__name__}")
        container = args[root] if isinstance(root, int) else kwargs[root]
        value = map_tensors(lambda t: value if t is old else t, container)
    if isinstance(root, int):
        args[root] = value
    else:
        kwargs[root] = value
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


def _sequence_first_features(module: nn.Module | None) -> set[int]:
    """Feature sizes of the sequence-first inputs `module` takes: the `input_size` of its recurrent
    layers (nn.RNN/LSTM/GRU) when all of them read (T, B, F) (`batch_first=False`, torch's default),
    plus the width of its embeddings, which turn a (T, B) id tensor into such an input. Empty when
    there is no recurrent layer or any of them is batch-first."""
    if module is None:
        return set()
    rnns = [m for m in module.modules() if isinstance(m, nn.RNNBase)]
    if not rnns or any(m.batch_first for m in rnns):
        return set()
    sizes = {int(m.input_size) for m in rnns}
    embeds = [m for m in module.modules() if isinstance(m, nn.Embedding) and m.embedding_dim in sizes]
    return sizes | ({-1} if embeds else set())  # -1: (T, B) integer ids feed one of those embeddings


def infer_input_dims(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], module: nn.Module | None = None
) -> dict[InputKey, dict[int, str]]:
    """Guess which dims of the tensor inputs (tensors inside container arguments included) are the
    batch and the sequence.

    Batch: dim 0 of every tensor input whose size there is the most common dim-0 size among the
    inputs of 2 or more dims (of all inputs when every one is 1-D). Sequence: dim 1 of (B, T) integer
    or boolean inputs (token ids, masks) and (B, T, C) floating inputs. Images (B, C, H, W) get
    only a batch dim: which of their dims may vary depends on the model. When `module` reads its
    inputs sequence-first (recurrent layers with `batch_first=False`), a (T, B, F) floating input of
    a recurrent layer's feature size F, and a (T, B) integer input feeding an embedding of that
    width, have the sequence at dim 0 and the batch at dim 1.
    """
    tensors = {k: v for k, v in leaves(args, kwargs) if isinstance(v, torch.Tensor)}
    features = _sequence_first_features(module)

    def seq_first(t: torch.Tensor) -> bool:
        integral = not t.is_floating_point() and not t.is_complex()
        return (t.dim() == 3 and t.is_floating_point() and t.shape[2] in features) or (
            t.dim() == 2 and integral and -1 in features
        )

    def batch_dim(t: torch.Tensor) -> int:
        return 1 if seq_first(t) else 0

    multi = [t.shape[batch_dim(t)] for t in tensors.values() if t.dim() >= 2]
    pool = multi or [t.shape[0] for t in tensors.values() if t.dim() >= 1]
    if not pool:
        return {}
    batch = max(set(pool), key=pool.count)
    out: dict[InputKey, dict[int, str]] = {}
    for key, t in tensors.items():
        dims: dict[int, str] = {}
        if seq_first(t):
            dims[0] = "seq"
            if t.shape[1] == batch:
                dims[1] = "batch"
            out[key] = dims
            continue
        if t.dim() >= 1 and t.shape[0] == batch:
            dims[0] = "batch"
        integral = not t.is_floating_point() and not t.is_complex()
        if (t.dim() == 2 and integral) or (t.dim() == 3 and t.is_floating_point()):
            dims[1] = "seq"
        if dims:
            out[key] = dims
    return out
