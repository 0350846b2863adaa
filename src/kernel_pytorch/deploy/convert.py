"""`convert(src, dst)`: turn a TRUSTED `torch.save` checkpoint into the safetensors layout `save()`
writes, once, so that loading never unpickles again.

This is the one place kernel_pytorch unpickles, and only when asked: unpickling a file runs whatever
code its author put in it. By default the file is read with `torch.load(weights_only=True)`, whose
restricted unpickler takes tensors, containers and plain values only; `unsafe_full_pickle=True` lifts
that restriction for checkpoints holding whole modules or custom classes, for files you trust.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch.deploy.manifest import Manifest
from kernel_pytorch.deploy.saving import DEFAULT_MAX_SHARD_SIZE, save_state_dict

WARNING = ("convert unpickles {src} (torch.load, weights_only={safe}): unpickling runs code from the file, "
           "so convert only checkpoints you trust")
# keys under which training scripts commonly nest the weights, tried in order
NESTED_KEYS: tuple[str, ...] = ("state_dict", "model", "model_state_dict", "module")


def find_state_dict(obj: Any, where: str = "the checkpoint") -> dict[str, Tensor]:
    """The state dict in a loaded checkpoint: a mapping of name -> tensor, a dict holding one under
    "state_dict", "model", "model_state_dict" or "module", or an nn.Module (its state_dict()).
    Raises ValueError naming what it found instead."""
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if not isinstance(obj, Mapping):
        raise ValueError(f"{where} holds a {type(obj).__name__}, not a state dict or a dict holding one")
    for key in NESTED_KEYS:
        if key in obj and isinstance(obj[key], (Mapping, nn.Module)):
            return find_state_dict(obj[key], f"{where}[{key!r}]")
    not_tensors = sorted(str(k) for k, v in obj.items() if not isinstance(v, Tensor))
    if not_tensors:
        raise ValueError(f"{where} is not a state dict: entries {', '.join(not_tensors[:8])} are not tensors "
                         f"(a nested state dict is looked for under {', '.join(NESTED_KEYS)})")
    return {str(k): v for k, v in obj.items()}


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    unsafe_full_pickle: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> list[Path]:
    """Convert the trusted `torch.save` checkpoint `src` to safetensors plus a manifest in `dst`.

    Args:
        src: a file written by torch.save (.bin/.pt/.pth): a state dict, a dict holding one under
            "state_dict"/"model", or (with unsafe_full_pickle) a pickled module.
        dst: the output directory; `kernel_pytorch.load(dst, model)` reads it (no swaps recorded).
        unsafe_full_pickle: unpickle without torch's weights_only restrictions. Runs any code the
            file contains: only for files you trust.
        max_shard_size: bytes per weight file, as in `save()`.
    Returns:
        the files written, the manifest last.
    Raises:
        ValueError: the file holds no state dict; pickle.UnpicklingError: weights_only refused an
            object (the message says which; rerun with unsafe_full_pickle if you trust the file).
    """
    src = Path(src)
    obj = torch.load(src, map_location="cpu", weights_only=not unsafe_full_pickle)  # the caller trusts src
    state = find_state_dict(obj, str(src))
    manifest = Manifest(metadata={"converted_from": src.name,
                                  "unpickled_with": "full pickle" if unsafe_full_pickle else "weights_only"})
    return save_state_dict(state, dst, manifest=manifest, max_shard_size=max_shard_size)


__all__ = ["NESTED_KEYS", "WARNING", "convert", "find_state_dict"]
