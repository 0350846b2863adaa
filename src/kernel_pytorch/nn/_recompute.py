"""Norm outputs made again in the backward instead of kept from the forward.

A decoder layer's norm output feeds projections (q/k/v, gate/up) that save it for their weight
gradients: one (N, D) tensor per norm kept from forward to backward, although the norm's own backward
keeps its input already, from which the output is one cheap pass. In a Llama-style layer that is two
(N, D) tensors per layer (at 4 x 2048 tokens and D = 2048, 64 MiB per layer).

`remember(out, module, x)` records, while `out` lives, how to make it again (the module and its input).
Inside `recompute_norm_outputs()` (entered by the consuming modules) autograd's pack hook replaces a
saved tensor that is `out` or a view of it by a handle, and the unpack hook makes the output again, once
per backward, and hands out the same view. The kernels are deterministic, so the gradients are bitwise
those of the saving path. The hooks stand aside where other saved-tensor hooks are active (activation
checkpointing, a memory measurement) and under torch.compile (nothing is remembered while tracing).

Under torch.compile the norm runs inside `recompute_in_backward` instead: a non-reentrant checkpoint of
the norm alone, which Dynamo records as the `tag_activation_checkpoint` higher-order op. Its nodes reach
the AOT partitioner tagged for recomputation (the tag overrides the rule that keeps custom ops and
Triton kernels out of the backward), so the compiled forward keeps the norm's input, which the norm's
backward needs anyway, and the backward runs the norm's forward again. The same kernels run on the same
input: the gradients are bitwise those of the saving graph. A norm whose output no consumer keeps (the
final norm before a fused loss) runs again too, for its rstd: one norm pass, no memory. Not while
torch.export traces (strict export refuses the checkpoint, and an exported program has no backward to
save for).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import Tensor

from kernel_pytorch._env import is_plain_tensor

# storage address -> the source of the live norm output whose storage it is
_LIVE: dict[int, _Source] = {}


class _Source:
    """How to make one norm output again: its module (`module._normed(x)`), input and weight, the
    versions input and weight had in the forward, and, once made in the backward, the output itself."""

    __slots__ = ("module", "x", "weight", "nbytes", "dtype", "versions", "made", "out_ref", "__weakref__")

    def __init__(self, module: torch.nn.Module, x: Tensor, weight: Tensor | None, out: Tensor) -> None:
        self.module, self.x, self.weight = module, x, weight
        self.nbytes, self.dtype = out.untyped_storage().nbytes(), out.dtype
        self.versions = self._versions()
        self.made: Tensor | None = None
        self.out_ref: weakref.ref | None = None  # to the output, calling _forget when it dies

    def _versions(self) -> tuple[int, int]:
        return self.x._version, -1 if self.weight is None else self.weight._version

    def output(self) -> Tensor:
        if self.made is None:
            if self._versions() != self.versions:
                raise RuntimeError(
                    f"the input or the weight of {type(self.module).__name__} was modified in place after the "
                    "forward, so its output, which the backward makes again, would differ")
            with torch.no_grad():
                self.made = self.module._normed(self.x)
        return self.made


class _Saved:
    """What the pack hook keeps instead of a norm output (or a view of it): the source and the view."""

    __slots__ = ("source", "size", "stride", "offset")

    def __init__(self, source: _Source, t: Tensor) -> None:
        self.source, self.size, self.stride, self.offset = source, t.size(), t.stride(), t.storage_offset()

    def tensor(self) -> Tensor:
        return self.source.output().as_strided(self.size, self.stride, self.offset)


def remember(out: Tensor, module: torch.nn.Module, x: Tensor, weight: Tensor | None) -> None:
    """Record that `out` is `module._normed(x)` (with `weight`, or None) while `out` lives (the caller
    checked that out records a gradient and that this is not a traced call). A few microseconds."""
    key = out.untyped_storage().data_ptr()
    source = _LIVE[key] = _Source(module, x, weight, out)
    source.out_ref = weakref.ref(out, functools.partial(_forget, key, weakref.ref(source)))


def _forget(key: int, source: weakref.ref, _: Any) -> None:
    """When the output dies: drop its entry (it holds the norm's input), unless a newer one took it."""
    entry = source()
    if entry is not None and _LIVE.get(key) is entry:
        del _LIVE[key]


def _source_of(t: Tensor) -> _Source | None:
    """The source when t is a live norm output or a view of one (same storage), else None."""
    if not _LIVE or not is_plain_tensor(t):  # only plain outputs are remembered (nn/norm.py), never a DTensor
        return None
    storage = t.untyped_storage()
    source = _LIVE.get(storage.data_ptr())
    if source is None or source.nbytes != storage.nbytes() or source.dtype != t.dtype or source.x.device != t.device:
        return None
    return source


def _pack(t: Tensor) -> Any:
    source = _source_of(t)
    return t if source is None else _Saved(source, t)


def _unpack(saved: Any) -> Tensor:
    return saved.tensor() if type(saved) is _Saved else saved


_TOP_HOOKS: Callable[[bool], Any] | None = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def recompute_norm_outputs() -> contextlib.AbstractContextManager:
    """A context in which a saved norm output (one `remember`ed) is made again in the backward instead
    of kept. A no-op when none is live, while tracing, or where other saved-tensor hooks are active."""
    if not _LIVE or _TOP_HOOKS is None or torch.compiler.is_compiling() or _TOP_HOOKS(False) is not None:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)


def recompute_in_backward(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """fn(x) (a norm: x (..., D) -> (..., D)), which a compiled graph makes again in the backward rather
    than keeping it from the forward: the caller checked that it is compiling, not exporting, with
    gradients recorded. The region holds the norm's op and views alone, so a plain checkpoint recomputes
    exactly the norm (no selection policy needed)."""
    return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)
