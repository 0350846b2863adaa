"""Absolute and linear-bias position encodings: sinusoidal tables, learned tables, position ids from
an attention mask, document ids from position ids (packed sequences), and ALiBi slopes and biases.

Packed sequences (several documents in one row, position ids restarting at each): a document starts
wherever a position does not follow the one before it,

    seq_ids[b, 0] = 0,  seq_ids[b, t] = seq_ids[b, t - 1] + (position_ids[b, t] != position_ids[b, t - 1] + 1)

which is how transformers' masking_utils (`find_packed_sequence_indices`) reads packing from position ids.

Sinusoidal (Vaswani et al.; transformers' DistilBERT/XLM and Marian tables), for position p, feature j:

    angle[p, j] = p / base ** (2 * (j // 2) / dim)                  # fp64, rounded to fp32 at the end
    interleaved: out[p, 2i] = sin(angle[p, 2i]), out[p, 2i + 1] = cos(angle[p, 2i + 1])
    concat:      out[p, :ceil(dim/2)] = sin of the even angles, out[p, ceil(dim/2):] = cos of the odd

ALiBi (Press et al.; BLOOM's slopes): for n heads and m = 2 ** floor(log2 n),

    slopes = b ** (1..m), b = 2 ** (-8 / m);  for n > m add b2 ** (1, 3, .., 2(n - m) - 1), b2 = 2 ** (-4 / m)
    bias[h, i, j] = slopes[h] * (j - i - (kv_len - q_len))   # query i aligned to the end of the keys

The bias is 0 on the diagonal and -slope * distance to earlier keys (what a FlexAttention score_mod
adds). BLOOM adds slopes[h] * (key position) instead, the same softmax on every causal row
(softmax ignores a per-row constant); `bloom_alibi` reproduces that tensor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def sinusoidal_positions(
    n_positions: int, dim: int, base: float = 10000.0, interleaved: bool = True
) -> Tensor:
    """The (n_positions, dim) fp32 sinusoidal table, computed in fp64 and rounded once.

    Args:
        interleaved: sin/cos alternate (DistilBERT, XLM); False puts the sines first (Marian).
    """
    pair = torch.div(torch.arange(dim, dtype=torch.float64), 2, rounding_mode="floor")
    angle = torch.arange(n_positions, dtype=torch.float64)[:, None] / base ** (2 * pair / dim)
    out = torch.empty(n_positions, dim, dtype=torch.float64)
    if interleaved:
        out[:, 0::2] = torch.sin(angle[:, 0::2])
        out[:, 1::2] = torch.cos(angle[:, 1::2])
    else:
        half = (dim + 1) // 2
        out[:, :half] = torch.sin(angle[:, 0::2])
        out[:, half:] = torch.cos(angle[:, 1::2])
    return out.float()


def learned_positions(weight: Tensor, position_ids: Tensor, offset: int = 0) -> Tensor:
    """Rows of a learned (P, H) position table: weight[position_ids + offset] (OPT uses offset 2).

    Returns position_ids.shape + (H,) of weight's dtype."""
    return F.embedding(position_ids + offset, weight)


def position_ids_from_attention_mask(attention_mask: Tensor, pad_value: int = 1) -> Tensor:
    """Position ids for a (B, T) 0/1 mask with left (or any) padding: each kept token counts the kept
    tokens before it; padded slots get `pad_value` (1 in transformers' generate, -1 in OPT before its
    offset). Returns int64 (B, T). For decoding, take the last columns of the full mask's ids."""
    ids = attention_mask.long().cumsum(-1) - 1
    return ids.masked_fill(attention_mask == 0, pad_value)


def seq_ids_from_position_ids(position_ids: Tensor) -> Tensor:
    """Document ids (B, T) int64 of packed rows from their position ids (B, T) (module docstring): 0 for
    the first document of each row, one more at every position that does not follow the one before it.
    A row whose last id is 0 holds one document."""
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be (B, T) (got shape {tuple(position_ids.shape)})")
    step = position_ids[:, 1:] - position_ids[:, :-1]
    starts = torch.cat([torch.zeros_like(position_ids[:, :1], dtype=torch.bool), step != 1], dim=1)
    return starts.long().cumsum(-1)


def alibi_slopes(n_heads: int, device: torch.device | str | None = None) -> Tensor:
    """BLOOM's per-head ALiBi slopes, (n_heads,) fp32 (any head count, not only powers of two)."""
    m = 2 ** math.floor(math.log2(n_heads))
    base = torch.full((), 2 ** (-(2 ** -(math.log2(m) - 3))), device=device, dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + m, device=device, dtype=torch.int32))
    if m != n_heads:
        extra = torch.full((), 2 ** (-(2 ** -(math.log2(2 * m) - 3))), device=device, dtype=torch.float32)
        remaining = min(m, n_heads - m)
        odd = torch.arange(1, 1 + 2 * remaining, 2, device=device, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra, odd)])
    return slopes


def alibi_bias(slopes: Tensor, q_len: int, kv_len: int) -> Tensor:
    """The (H, q_len, kv_len) fp32 bias slopes[h] * (j - i - (kv_len - q_len)): 0 on the (end-aligned)
    diagonal, -slope * distance to earlier keys. Apply a causal mask separately."""
    i = torch.arange(q_len, device=slopes.device) + (kv_len - q_len)
    j = torch.arange(kv_len, device=slopes.device)
    return slopes.float()[:, None, None] * (j[None, :] - i[:, None]).float()


def bloom_alibi(attention_mask: Tensor, n_heads: int, dtype: torch.dtype) -> Tensor:
    """BLOOM's alibi tensor, (B * n_heads, 1, T): slopes[h] * (the key's position among kept tokens),
    0 at padded keys, rounded to `dtype`."""
    b, t = attention_mask.shape
    positions = ((attention_mask.cumsum(dim=-1) - 1) * attention_mask)[:, None, :]
    alibi = alibi_slopes(n_heads, attention_mask.device)[..., None] * positions
    return alibi.reshape(b * n_heads, 1, t).to(dtype)
