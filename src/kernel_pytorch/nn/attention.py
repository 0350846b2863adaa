"""Attention modules: `Attention` (fused QKV, GQA, RoPE, sdpa / flex / eager backends, a static KV cache)
and the tutorial pair `StandardAttention` / `MemoryEfficientAttention` (plus `LoopAttention`, the
Python-loop anti-pattern kept as a test subject for the analyser).

`Attention` holds one `qkv_proj` Linear (one matmul instead of three) but its state dict speaks
transformers' names: saving splits it into `q_proj` / `k_proj` / `v_proj`, loading concatenates them
(a fused `qkv_proj` loads too), so a `LlamaAttention`'s weights load unchanged and ours load back into
transformers. K/V heads are never repeated for GQA (functional/attention.py).

Decoding with `StaticKVCache`: the cache's tensors have a fixed shape (max_batch, Hk, max_seq, D), the
new keys and values are written with `index_copy_` at `cache_position` (a tensor, so the step number is
data, not a constant Dynamo specialises on), and attention reads the whole cache with a mask of the
positions written so far. Every decoding step therefore has the same shapes and the same graph: under
torch.compile one graph for the prefill, one for all decoding steps (tests/nn/test_attention.py counts),
and with mode="reduce-overhead" on CUDA one CUDA graph replay per step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch import reference
from kernel_pytorch.functional.attention import AttentionBackend, attention, prepare_mask
from kernel_pytorch.functional.rope import apply_rotary
from kernel_pytorch.reference.rope_tables import RotaryConfig, inv_freq_and_scaling, rotary_config

_SPLIT = ("q_proj", "k_proj", "v_proj")


def _rotary(q: Tensor, k: Tensor, inv_freq: Tensor, scaling: float, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """The one place RoPE is applied: q, k (B, H, T, D) rotated at position_ids (B, T), q and k in one
    launch on CUDA (functional.apply_rotary)."""
    cos, sin = reference.cos_sin(inv_freq, position_ids, scaling, q.dtype)
    return apply_rotary(q, k, cos, sin)


def _rope_config(rope: Any, head_dim: int) -> RotaryConfig | None:
    """None (no RoPE), "default" (theta 10000), a float theta, a RotaryConfig, or a transformers config /
    config dict (read by reference.rotary_config)."""
    if rope is None:
        return None
    if rope == "default":
        return RotaryConfig(head_dim=head_dim)
    if isinstance(rope, (int, float)):
        return RotaryConfig(theta=float(rope), head_dim=head_dim)
    if isinstance(rope, RotaryConfig):
        return rope
    if isinstance(rope, Mapping) or hasattr(rope, "max_position_embeddings"):
        return rotary_config(rope)
    raise TypeError(f"rope must be None, 'default', a theta, a RotaryConfig or a model config (got {rope!r})")


def cache_mask(cache_position: Tensor, max_seq: int) -> Tensor:
    """(1, 1, T, max_seq) boolean mask of a static cache: the query at cache_position[i] (T,) sees the
    slots at or before it (causal, and the slots not written yet hidden); built on the device, no sync."""
    keys = torch.arange(max_seq, device=cache_position.device)
    return (keys[None, :] <= cache_position[:, None])[None, None]


class StaticKVCache(nn.Module):
    """Keys and values of one attention layer for incremental decoding, in fixed-shape buffers.

    Args:
        max_batch, max_seq: the largest batch and the longest sequence (prompt + generated) served.
        n_kv_heads, head_dim: the layer's K/V heads and head size.
    Buffers k, v: (max_batch, n_kv_heads, max_seq, head_dim), not saved in state dicts.
    """

    def __init__(self, max_batch: int, max_seq: int, n_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        super().__init__()
        shape = (max_batch, n_kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, k: Tensor, v: Tensor, cache_position: Tensor) -> tuple[Tensor, Tensor]:
        """Write k, v (B, Hk, T, D) at positions cache_position (T,) and return the cache's (B, Hk, S, D)."""
        b = k.shape[0]
        keys, values = self.k[:b], self.v[:b]
        keys.index_copy_(2, cache_position, k.to(keys.dtype))
        values.index_copy_(2, cache_position, v.to(values.dtype))
        return keys, values

    def mask(self, cache_position: Tensor) -> Tensor:
        """(1, 1, T, S) boolean: query at cache_position[i] sees the keys written at or before it."""
        return cache_mask(cache_position, self.k.shape[2])

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()


class Attention(nn.Module):
    """Multi-head / grouped-query self-attention with RoPE, transformers' LlamaAttention's parameters.

    Args:
        dim: model width; n_heads query heads; n_kv_heads K/V heads (default n_heads; must divide it);
        head_dim: default dim // n_heads.
        bias: biases on the q/k/v projections (and o_proj unless o_bias says otherwise; Qwen2: o_bias=False).
        rope: None, "default", a theta, a RotaryConfig or a transformers config (see `_rope_config`).
        backend: functional.attention's backend ("auto" | "sdpa" | "flex" | "eager").
        is_causal, window, softcap, scale: functional.attention's options (scale default head_dim ** -0.5).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None, head_dim: int | None = None,
                 bias: bool = False, rope: Any = "default", backend: AttentionBackend = "auto", *,
                 o_bias: bool | None = None, is_causal: bool = True, window: int | None = None,
                 softcap: float | None = None, scale: float | None = None) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim or dim // n_heads
        self.backend, self.is_causal, self.window, self.softcap = backend, is_causal, window, softcap
        self.scale = scale
        self._sizes = (n_heads * self.head_dim, n_kv_heads * self.head_dim, n_kv_heads * self.head_dim)
        self.qkv_proj = nn.Linear(dim, sum(self._sizes), bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=bias if o_bias is None else o_bias)
        self.rope = _rope_config(rope, self.head_dim)
        self.attention_scaling = 1.0
        inv_freq = None
        if self.rope is not None:
            inv_freq, self.attention_scaling = inv_freq_and_scaling(self.rope)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_state_dict_post_hook(_save_split)
        self.register_load_state_dict_pre_hook(_load_split)

    def forward(self, x: Tensor, position_ids: Tensor | None = None, attention_mask: Tensor | None = None, *,
                kv_cache: StaticKVCache | None = None, cache_position: Tensor | None = None,
                seq_ids: Tensor | None = None) -> Tensor:
        """x (B, T, dim) -> (B, T, dim).

        Args:
            position_ids: (B or 1, T) RoPE positions (default cache_position, else 0 .. T-1).
            attention_mask: transformers' (B, K) padding mask or 4-D boolean / additive mask over the keys
                (K = T, or max_seq with a cache).
            kv_cache, cache_position: decode with a StaticKVCache; cache_position (T,) int64, where these
                tokens go (default 0 .. T-1).
            seq_ids: (B or 1, T) document ids of packed sequences (no cache).
        """
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self._sizes, dim=-1)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if cache_position is None and (kv_cache is not None or (position_ids is None and self.inv_freq is not None)):
            cache_position = torch.arange(t, device=x.device)
        if self.inv_freq is not None:
            pos = position_ids if position_ids is not None else cache_position[None]
            q, k = _rotary(q, k, self.inv_freq, self.attention_scaling, pos.expand(b, t))
        is_causal = self.is_causal
        mask = prepare_mask(attention_mask, t, k.shape[2] if kv_cache is None else kv_cache.k.shape[2])
        if kv_cache is not None:
            k, v = kv_cache.update(k, v, cache_position)
            if is_causal:  # the cache mask is causal and hides the slots not written yet
                written = kv_cache.mask(cache_position)
                mask = written if mask is None else (written & mask if mask.dtype == torch.bool
                                                     else mask.masked_fill(~written, float("-inf")))
            is_causal = False
        out = attention(q, k, v, mask=mask, is_causal=is_causal, scale=self.scale, softcap=self.softcap,
                        window=self.window, seq_ids=seq_ids, backend=self.backend)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"backend={self.backend!r}")


def _save_split(module: Attention, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: qkv_proj.{weight,bias} -> q_proj / k_proj / v_proj (transformers' names),
    placed before o_proj as transformers orders them."""
    later = {key: state_dict.pop(key) for key in list(state_dict) if key.startswith(f"{prefix}o_proj.")}
    parts = {}
    for kind in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}qkv_proj.{kind}", None)
        if fused is not None:
            parts[kind] = fused.split(module._sizes, dim=0)
    for i, name in enumerate(_SPLIT):
        for kind, split in parts.items():
            state_dict[f"{prefix}{name}.{kind}"] = split[i]
    state_dict.update(later)


def _load_split(module: Attention, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
                missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook: q_proj / k_proj / v_proj -> qkv_proj (a fused checkpoint passes as is)."""
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{name}.{kind}" for name in _SPLIT]
        if all(key in state_dict for key in keys):
            state_dict[f"{prefix}qkv_proj.{kind}"] = torch.cat([state_dict.pop(key) for key in keys], dim=0)


class _TutorialAttention(nn.Module):
    """The tutorials' self-attention block: one fused qkv_proj (dim -> 3 dim), heads, o_proj. Subclasses
    differ only in how they attend, so their state dicts load into one another."""

    def __init__(self, dim: int, num_heads: int, bias: bool = True, is_causal: bool = False) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be a multiple of num_heads ({num_heads})")
        self.num_heads, self.head_dim, self.is_causal = num_heads, dim // num_heads, is_causal
        self.qkv_proj = nn.Linear(dim, 3 * dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, dim) -> (B, T, dim)."""
        b, t, c = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return self.o_proj(self._attend(q, k, v).transpose(1, 2).reshape(b, t, c))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        raise NotImplementedError


class StandardAttention(_TutorialAttention):
    """Plain matmul-softmax-matmul: materialises the (B, H, T, T) scores."""

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if self.is_causal:
            t = q.shape[2]
            causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class MemoryEfficientAttention(_TutorialAttention):
    """The same block on scaled_dot_product_attention (flash / memory-efficient kernels where they apply)."""

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)


class LoopAttention(_TutorialAttention):
    """The anti-pattern: a Python loop over query positions (T small matmuls, T graph nodes under
    compile, recompiles for every new length). Kept as a subject for the analyser's tests."""

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        outs = []
        for i in range(q.shape[2]):
            keys = k[:, :, : i + 1] if self.is_causal else k
            values = v[:, :, : i + 1] if self.is_causal else v
            w = torch.softmax((q[:, :, i : i + 1] @ keys.transpose(-1, -2)) / math.sqrt(self.head_dim), dim=-1)
            outs.append(w @ values)
        return torch.cat(outs, dim=2)
