"""Pieces shared by the built-in models: build on the meta device then materialise, the config head
split, the pre-norm residual block, the causal-LM loss.

Building on `meta` first means a preset never allocates at its full fp32 size on the host: the dtype is
changed while the tensors are still shapes only, and memory is allocated once, on the target device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

M = TypeVar("M", bound=nn.Module)
C = TypeVar("C")


class HeadSplit:
    """Mixin for the transformer configs (frozen dataclasses with `dim` and `n_heads` fields)."""

    dim: int
    n_heads: int

    def check_heads(self) -> None:
        """Raise ValueError unless `dim` splits evenly over `n_heads` heads."""
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not a multiple of n_heads {self.n_heads}")

    @property
    def head_dim(self) -> int:
        """Dh = dim / n_heads."""
        return self.dim // self.n_heads

    @classmethod
    def tiny(cls: type[C]) -> C:
        """The defaults: the CPU demo size, forward + backward in milliseconds."""
        return cls()


class PreNormBlock(nn.Module):
    """Pre-norm residual block: x = x + attn(attn_norm(x), *context), then x + mlp(mlp_norm(x)).

    Subclasses register the four parts under their checkpoint's names and list those names in `parts`
    (attention norm, attention, MLP norm, MLP), so state_dict keys stay the checkpoint's. `context` is
    what the attention takes besides x (Llama's rotary cos/sin). x (B, T, D) -> (B, T, D).
    """

    parts: ClassVar[tuple[str, str, str, str]]

    def forward(self, x: Tensor, *context: Any) -> Tensor:
        attn_norm, attn, mlp_norm, mlp = (getattr(self, name) for name in self.parts)
        x = x + attn(attn_norm(x), *context)
        return x + mlp(mlp_norm(x))


class LayerNormBlock(PreNormBlock):
    """PreNormBlock with LayerNorm(dim, eps) for both norms (GPT-2, ViT).

    Registers norm, attn, norm, mlp in that order under the names in `parts`.
    """

    def __init__(self, dim: int, eps: float, attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        modules = (nn.LayerNorm(dim, eps=eps), attn, nn.LayerNorm(dim, eps=eps), mlp)
        for name, module in zip(self.parts, modules):
            self.add_module(name, module)


def materialize(make: Callable[[], M], device: torch.device | str, dtype: torch.dtype, seed: int) -> M:
    """Build `make()` on meta, cast to `dtype`, allocate on `device`, initialise deterministically.

    Args:
        make: zero-argument constructor of a module that defines `init_weights(generator)`.
        device: target device; "meta" returns the shapes-only model (no allocation, no init).
        dtype: floating-point dtype of every parameter and floating buffer.
        seed: seeds a generator private to this call, so the global RNG is left untouched.
    Returns:
        The module on `device` with `dtype`; the same seed gives the same weights on the same device type.
    """
    with torch.device("meta"):
        model = make()
    model = model.to(dtype=dtype)
    device = torch.device(device)
    if device.type == "meta":
        return model
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    # init_weights re-ties shared weights too: to_empty gives each module its own new Parameter.
    model.init_weights(generator)  # type: ignore[operator]
    return model


def zero_(t: torch.Tensor | None) -> None:
    """Zero a tensor in place if present (optional biases)."""
    if t is not None:
        with torch.no_grad():
            t.zero_()


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross-entropy in fp32: logits (B, T, V), labels (B, T) long, -100 ignored -> ()."""
    shift_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1]).float()
    shift_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
