"""FlexAttention pieces for functional/attention.py: the mask_mod and score_mod of each option, block
masks (built once per shape and cached where the mask depends only on the shape), and the call.

A block mask records, per (query block, key block) tile of 128 x 128, whether the tile is empty, full
or partial, so the kernel skips empty tiles: a causal mask halves the work, 8 documents of 512 tokens in
4096 leave 1/8 of it. Masks that depend only on the lengths (causal, sliding window) are built once per
(lengths, device) and cached; masks that read a tensor (documents, padding, a user's boolean mask) are
built once per call: build one with `block_mask(...)` and pass it to every layer to build it once per
batch.

torch 2.13 runs FlexAttention on CPU through the same Python front end: forward only (it raises for
inputs that require grad), unfused in eager (it materialises the scores), fused under torch.compile
(which takes about a minute on CPU for the first shape). On CUDA the eager path compiles
flex_attention once (`_compiled_flex`) so an uncompiled caller still gets the fused kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention


def _mask_mod(
    q_len: int, kv_len: int, *, is_causal: bool, window: int | None, seq_ids: Tensor | None, keep: Tensor | None,
) -> Callable | None:
    """mask_mod(b, h, q_idx, kv_idx) -> bool for the options given (None when nothing is masked).

    keep: a boolean (B, H, Q, K) view (expanded, never copied) of a user's or padding mask."""
    offset = kv_len - q_len  # queries are end-aligned with the keys (reference/attention.py)
    causal = is_causal or window is not None

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        allowed = kv_idx >= 0
        if causal:
            allowed = allowed & (kv_idx <= pos)
        if window is not None:
            allowed = allowed & (pos - kv_idx < window)
        if seq_ids is not None:
            allowed = allowed & (seq_ids[b, pos] == seq_ids[b, kv_idx])
        if keep is not None:
            allowed = allowed & keep[b, h, q_idx, kv_idx]
        return allowed

    if not causal and seq_ids is None and keep is None:
        return None
    return mask_mod


def score_mod(
    q_len: int, kv_len: int, *, softcap: float | None, alibi_slopes: Tensor | None, bias: Tensor | None,
) -> Callable | None:
    """score_mod(score, b, h, q_idx, kv_idx) applying soft-capping, ALiBi and an additive bias (B, H, Q, K)
    view in the reference's order; None when there is nothing to apply."""
    if softcap is None and alibi_slopes is None and bias is None:
        return None
    offset = kv_len - q_len

    def mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if alibi_slopes is not None:
            score = score + alibi_slopes[h] * (kv_idx - q_idx - offset)
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return mod


@functools.lru_cache(maxsize=64)
def _shape_block_mask(is_causal: bool, window: int | None, q_len: int, kv_len: int, device: str) -> BlockMask:
    mod = _mask_mod(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=None, keep=None)
    return create_block_mask(mod, None, None, q_len, kv_len, device=device)


def block_mask(
    q_len: int, kv_len: int, *, is_causal: bool = False, window: int | None = None,
    seq_ids: Tensor | None = None, keep: Tensor | None = None, batch: int | None = None,
    heads: int | None = None, device: torch.device | str = "cpu",
) -> BlockMask | None:
    """The BlockMask of the options (None when nothing is masked). Shape-only masks come from a cache.

    Args:
        q_len, kv_len: query and key lengths.
        is_causal, window, seq_ids: as in reference/attention.py; seq_ids (B, K).
        keep: boolean (B, H, Q, K) (an expanded view is fine).
        batch, heads: the mask's B and H (None: the same for every batch row / head).
    """
    if seq_ids is None and keep is None:
        if not is_causal and window is None:
            return None
        if not torch.compiler.is_compiling():
            return _shape_block_mask(is_causal, window, q_len, kv_len, str(torch.device(device)))
    mod = _mask_mod(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=seq_ids, keep=keep)
    if seq_ids is not None:
        batch = seq_ids.shape[0]
    return create_block_mask(mod, batch, heads, q_len, kv_len, device=device)


@functools.cache
def _compiled_flex() -> Callable:
    # the fused kernel exists only through torch.compile; compiled once, shapes are static
    return torch.compile(flex_attention, dynamic=False)


def flex(
    q: Tensor, k: Tensor, v: Tensor, *, mask: BlockMask | None, score: Callable | None, scale: float | None,
) -> Tensor:
    """flex_attention with GQA by enable_gqa (no repeated K/V); the compiled kernel on CUDA in eager."""
    run = flex_attention
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        run = _compiled_flex()
    gqa = False
    if q.shape[1] != k.shape[1]:  # a branch: with dynamic shapes the comparison is a SymBool (see _sdpa)
        gqa = True
    return run(q, k, v, score_mod=score, block_mask=mask, scale=scale, enable_gqa=gqa)
