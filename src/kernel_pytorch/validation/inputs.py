"""Validation's inputs: the first seed uses the example as given; later seeds draw fresh inputs that are
still valid inputs of the model.

Each top-level input is read by its name (the dict key, or the parameter of `forward` a positional
argument binds to), because an integer tensor's meaning decides what may be drawn for it:

    ids       token ids (`input_ids`, `decoder_input_ids`, `idx`, `tokens`, ...): drawn within the
              example's [min, max], so inside the embedding's range
    labels    `labels`, `targets`, `shift_labels`, ...: positions holding the ignore value (the call's
              `ignore_index`, else any negative value such as -100) keep it; the others are drawn within
              the kept values' [min, max] (token ids for a language model, class ids for a classifier)
    kept      masks (0/1 or additive, any dtype: the same padding pattern), positions, token types, cache
              positions, lengths and offsets, and every integer tensor whose meaning cannot be known
              (a positional argument without a name, an unknown keyword)

Floating tensors that are not kept are drawn with the example's mean and spread; bools, complex and
empty tensors and non-tensors are reused.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._tree import as_inputs, map_tensors

# substrings of a name whose tensor is an index or a mask: kept as given, whatever its dtype
_KEPT = ("mask", "position", "token_type", "segment", "cache", "length", "offset", "cu_seq", "seq_idx",
         "index", "indices")
_LABELS = ("label", "target")
_IDS = ("idx", "tokens", "token_ids")
DEFAULT_IGNORE = -100


def role(name: str | None) -> str:
    """'ids', 'labels', 'kept' or 'free' (a float drawn freely; an integer of unknown meaning is kept)."""
    if name is None:
        return "free"
    n = name.lower()
    if any(k in n for k in _KEPT) or n == "ignore_index":
        return "kept"
    if any(k in n for k in _LABELS):
        return "labels"
    if n.endswith("ids") or n in _IDS:
        return "ids"
    return "free"


def named_inputs(model: nn.Module | None, example: tuple | dict) -> list[tuple[str | None, Any]]:
    """(name, value) of each top-level input: dict keys, or positional arguments bound to the names of
    `model.forward`'s parameters (None where they cannot be bound: *args, no model)."""
    if isinstance(example, dict):
        return list(example.items())
    names: list[str | None] = [None] * len(example)
    if model is not None:
        try:
            params = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError):
            params = []
        for i, p in enumerate(params[:len(example)]):
            if p.kind == p.VAR_POSITIONAL:
                break
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names[i] = p.name
    return list(zip(names, example))


def _draw_float(t: Tensor, gen: torch.Generator) -> Tensor:
    ref = t.detach().float()
    mean = float(ref.mean()) if ref.numel() else 0.0
    std = float(ref.std()) if ref.numel() > 1 else 0.0
    if not std > 0:
        std = max(abs(mean), 1.0)
    return (torch.randn(t.shape, generator=gen) * std + mean).to(dtype=t.dtype, device=t.device)


def _draw_range(t: Tensor, lo: int, hi: int, gen: torch.Generator) -> Tensor:
    return torch.randint(lo, hi + 1, t.shape, generator=gen).to(dtype=t.dtype, device=t.device)


def _draw_labels(t: Tensor, ignore_index: int, gen: torch.Generator) -> Tensor:
    ignored = (t == ignore_index) | (t < 0)
    kept = t[~ignored]
    if kept.numel() == 0:
        return t.clone()
    new = _draw_range(t, int(kept.min()), int(kept.max()), gen)
    return torch.where(ignored, t, new)


def redraw(example: tuple | dict, seed: int, model: nn.Module | None = None) -> tuple | dict:
    """Fresh random inputs shaped like `example` that stay valid inputs of `model` (module docstring).

    Args:
        example: positional args (tuple) or keyword args (dict), any nesting below the top level.
        seed: seeds a private generator (the global RNG is untouched).
        model: whose `forward` names positional arguments; None reads them as unnamed.
    Returns:
        The same structure with new tensors where their role allows.
    """
    gen = torch.Generator().manual_seed(seed)
    ignore = example.get("ignore_index", DEFAULT_IGNORE) if isinstance(example, dict) else DEFAULT_IGNORE
    ignore = int(ignore) if isinstance(ignore, (int, Tensor)) else DEFAULT_IGNORE

    def drawer(kind: str) -> Callable[[Tensor], Tensor]:
        def draw(t: Tensor) -> Tensor:
            if t.dtype == torch.bool or t.is_complex() or t.numel() == 0 or kind == "kept":
                return t.clone()
            if t.is_floating_point():
                return _draw_float(t, gen)
            if kind == "labels":
                return _draw_labels(t, ignore, gen)
            if kind == "ids":
                return _draw_range(t, int(t.min()), int(t.max()), gen)
            return t.clone()  # an integer tensor of unknown meaning
        return draw

    drawn = [(name, map_tensors(drawer(role(name)), value)) for name, value in named_inputs(model, example)]
    if isinstance(example, dict):
        return dict(drawn)
    return tuple(value for _, value in drawn)


def is_drawn(inputs: Any) -> bool:
    """Whether validation draws the later seeds' inputs itself (not a user's `seed -> inputs` callable)."""
    return not (callable(inputs) and not isinstance(inputs, (Tensor, nn.Module)))


def inputs_for(inputs: Any, seed: int, first_seed: int, model: nn.Module | None = None) -> tuple | dict:
    """The inputs of `seed`: a callable's `inputs(seed)`; else the example itself for the first seed
    and a `redraw` of it (valid inputs of `model`) for the others."""
    if not is_drawn(inputs):
        return as_inputs(inputs(seed))
    base = as_inputs(inputs)
    return base if seed == first_seed else redraw(base, seed, model)


__all__ = ["DEFAULT_IGNORE", "inputs_for", "is_drawn", "named_inputs", "redraw", "role"]
