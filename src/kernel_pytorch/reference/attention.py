"""Scaled dot-product attention, written out: matmul, softmax, matmul (the specification).

For q of shape (B, Hq, Q, D), k of shape (B, Hk, K, D) and v of shape (B, Hk, K, Dv), Hq a multiple of
Hk (grouped-query attention: query head h reads key/value head h // (Hq / Hk)):

    s[b, h, i, j] = scale * <q[b, h, i], k[b, h // g, j]>          # scale = 1 / sqrt(D) by default
    s = softcap * tanh(s / softcap)                                   # soft-capping (Gemma 2), optional
    s = s + slope[h] * (j - pos(i))                                   # ALiBi, optional
    s = s + mask[b, h, i, j]                                          # an additive (float) mask, optional
    s = -inf where the key is not allowed                             # boolean masks, below
    out[b, h, i] = sum_j softmax_j(s[b, h, i]) * v[b, h // g, j]

Queries are end-aligned with the keys: query i sits at position pos(i) = i + K - Q (Q = K without a
cache; a decoding step's queries are the last positions). A key j is allowed when every mask given
allows it:
* is_causal: j <= pos(i);
* window w (sliding-window attention, Mistral's `sliding_window`): pos(i) - j < w, with causality;
* seq_ids (B, K) (documents packed in one row): key j and query i belong to the same document, the
  query's id being seq_ids[b, pos(i)];
* a boolean mask broadcastable to (B, Hq, Q, K): True = attend.

A query with no allowed key outputs zeros (as FlexAttention and SDPA's math path do), not NaN.
Math in fp32 (fp64 stays fp64), the result rounded once to q's dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc


def query_positions(q_len: int, kv_len: int, device: torch.device | str | None = None) -> Tensor:
    """pos(i) = i + kv_len - q_len for i < q_len: (Q,) int64, the queries' positions among the keys."""
    return torch.arange(q_len, device=device) + (kv_len - q_len)


def allowed_keys(
    q_len: int, kv_len: int, *, is_causal: bool = False, window: int | None = None,
    seq_ids: Tensor | None = None, device: torch.device | str | None = None,
) -> Tensor | None:
    """The boolean (B or 1, 1, Q, K) mask of the structural masks (True = attend), None if none is set.

    Args:
        is_causal, window: as in the module docstring (a window implies causality).
        seq_ids: (B, K) integer document ids of the keys; the query's id is read at its position.
    """
    if not is_causal and window is None and seq_ids is None:
        return None
    dev = seq_ids.device if seq_ids is not None else device
    i = query_positions(q_len, kv_len, dev)[:, None]
    j = torch.arange(kv_len, device=dev)[None, :]
    keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=dev)
    if is_causal or window is not None:
        keep = keep & (j <= i)
    if window is not None:
        keep = keep & (i - j < window)
    keep = keep[None, None]
    if seq_ids is not None:
        q_ids = seq_ids[:, kv_len - q_len:]
        keep = keep & (q_ids[:, None, :, None] == seq_ids[:, None, None, :])
    return keep


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, softcap: float | None = None, window: int | None = None,
    alibi_slopes: Tensor | None = None, seq_ids: Tensor | None = None,
) -> Tensor:
    """Attention as the module docstring defines it.

    Args:
        q: (B, Hq, Q, D); k: (B, Hk, K, D); v: (B, Hk, K, Dv), Hq % Hk == 0.
        mask: boolean (True = attend) or additive float, broadcastable to (B, Hq, Q, K).
        is_causal, window, seq_ids: the structural masks (module docstring).
        scale: multiplies q.k (default 1 / sqrt(D)).
        softcap: s -> softcap * tanh(s / softcap) before the masks.
        alibi_slopes: (Hq,) per-head ALiBi slopes (reference.positions.alibi_slopes).
    Returns:
        (B, Hq, Q, Dv) in q's dtype.
    """
    b, hq, q_len, d = q.shape
    hk, kv_len = k.shape[1], k.shape[2]
    groups = hq // hk
    q32, k32, v32 = acc(q), acc(k), acc(v)
    if groups > 1:  # the readable form: repeat each key/value head for its group of query heads
        k32, v32 = k32.repeat_interleave(groups, dim=1), v32.repeat_interleave(groups, dim=1)
    s = (q32 @ k32.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(d))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        distance = torch.arange(kv_len, device=q.device) - query_positions(q_len, kv_len, q.device)[:, None]
        s = s + acc(alibi_slopes)[:, None, None] * distance
    keep = allowed_keys(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=seq_ids, device=q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = mask if keep is None else keep & mask
        else:
            s = s + acc(mask)
    if keep is not None:
        s = s.masked_fill(~keep, -math.inf)
    # a row with no allowed key is all -inf: softmax would give NaN, the definition gives zeros
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ v32).to(q.dtype)
