"""The tile kernel for rotary embeddings: q and k rotated in [BLOCK_T tokens, BLOCK_H heads, r] tiles,
at any (batch, token, head, feature) strides. It runs rotate-half pairs where the flat kernel (flat.py)
does not apply (RopeConfig.fallback_rotate_half), and every layout under schedule="tile".

The grid is (batch x token blocks, head blocks of q then of k): each program rotates one tile of q or
of k, about TileConfig.elements elements, all loaded at once. The tile follows the memory: (B, H, T, D)
keeps tokens contiguous within a head, so a tile takes TileConfig.tokens tokens of a few heads (2 KiB
runs); (B, T, H, D) keeps a token's heads contiguous, so a tile takes a token's heads. cos/sin rows
(B or 1, T, r), or rows position_ids[b, t] of a (P, r) table, are read once per tile and shared by its
heads. How a tile forms its pairs (TileConfig.pairs_rotate_half / pairs_interleaved):
    "partner"  each head's rotary features in one contiguous load, and a second load of every
               feature's partner from the same cache lines (L1/L2 hits, no DRAM traffic)
    "split"    one contiguous load, the pairs separated in registers (interleaved: even/odd lanes;
               rotate-half: the two halves as a [2, r/2] tile, transposed)
    "halves"   rotate-half only: two half-row loads per head
The math is math.py's; the package docstring has it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops.rope.call import Flags, Sizes
from kernel_pytorch.ops.rope.config import PAIR_METHODS, TileConfig
from kernel_pytorch.ops.rope.math import _cos_sin_rows, _cs, _pair_outputs, _partner_outputs


@triton.jit
def _rope_tile(
    X, XO, x_base, o_base, h0, n_heads, sxh, sxd, soh, sod, t_ok, c_row, s_row, limit, half, n_pass, z,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R2: tl.constexpr, BLOCK_P: tl.constexpr,
    PAIRS: tl.constexpr, INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr,
    HF_ROUNDING: tl.constexpr,
):
    # one [BLOCK_T, BLOCK_H, features] tile of q or k; x_base, o_base, c_row, s_row, limit (pairs of
    # cos/sin to read: 0 past the tokens or outside the table) are [BLOCK_T, 1, 1]
    h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
    ok = t_ok & (h < n_heads)
    row = X + x_base + h.to(tl.int64) * sxh
    out = XO + o_base + h.to(tl.int64) * soh
    DTYPE_IN = X.dtype.element_ty
    DTYPE = XO.dtype.element_ty
    if PAIRS == 2:  # partner: the row, then each feature's partner from the same lines
        j = tl.arange(0, 2 * BLOCK_R2)[None, None, :]
        if INTERLEAVED:
            first = (j % 2) == 0
            p = j ^ 1
        else:
            first = j < half
            p = tl.where(first, j + half, j - half)
        m = ok & (j < 2 * half)
        x = tl.load(row + j * sxd, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(row + p * sxd, mask=m, other=0.0).to(tl.float32)
        cm = j < 2 * limit
        y = _partner_outputs(x, xp, first, c_row, s_row, j, p, cm, z, DTYPE_IN, DTYPE, BACKWARD, HF_ROUNDING,
                             "")
        tl.store(out + j * sod, y.to(DTYPE), mask=m)
    elif PAIRS == 1 and INTERLEAVED:  # split: even/odd lanes of one contiguous load
        j = tl.arange(0, 2 * BLOCK_R2)[None, None, :]
        m = ok & (j < 2 * half)
        x = tl.load(row + j * sxd, mask=m, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_H, BLOCK_R2, 2]))
        cm = j < 2 * limit
        c1, c2 = tl.split(tl.reshape(_cs(tl.load(c_row + j, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING),
                                     [BLOCK_T, 1, BLOCK_R2, 2]))
        s1, s2 = tl.split(tl.reshape(_cs(tl.load(s_row + j, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING),
                                     [BLOCK_T, 1, BLOCK_R2, 2]))
        y1, y2 = _pair_outputs(x1, x2, c1, c2, s1, s2, z, DTYPE, BACKWARD, HF_ROUNDING)
        y = tl.reshape(tl.join(y1, y2), [BLOCK_T, BLOCK_H, 2 * BLOCK_R2])
        tl.store(out + j * sod, y.to(DTYPE), mask=m)
    elif PAIRS == 1:  # split, rotate-half: both halves as one [2, r/2] tile per head, transposed
        i = tl.arange(0, BLOCK_R2)[None, None, None, :]
        f = tl.arange(0, 2)[None, None, :, None] * half + i
        m = tl.expand_dims(ok, 3) & (i < half)
        x = tl.load(tl.expand_dims(row, 3) + f * sxd, mask=m, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.permute(x, (0, 1, 3, 2)))
        cm = i < tl.expand_dims(limit, 3)
        c1, c2 = tl.split(tl.permute(_cs(tl.load(tl.expand_dims(c_row, 3) + f, mask=cm, other=float("nan")), DTYPE_IN,
                                         HF_ROUNDING), (0, 1, 3, 2)))
        s1, s2 = tl.split(tl.permute(_cs(tl.load(tl.expand_dims(s_row, 3) + f, mask=cm, other=float("nan")), DTYPE_IN,
                                         HF_ROUNDING), (0, 1, 3, 2)))
        y1, y2 = _pair_outputs(x1, x2, c1, c2, s1, s2, z, DTYPE, BACKWARD, HF_ROUNDING)
        y = tl.permute(tl.join(y1, y2), (0, 1, 3, 2))
        tl.store(tl.expand_dims(out, 3) + f * sod, y.to(DTYPE), mask=m)
    else:  # halves: two half-row loads per head
        i = tl.arange(0, BLOCK_R2)[None, None, :]
        m = ok & (i < half)
        x1 = tl.load(row + i * sxd, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(row + (i + half) * sxd, mask=m, other=0.0).to(tl.float32)
        cm = i < limit
        c1 = _cs(tl.load(c_row + i, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING)
        c2 = _cs(tl.load(c_row + half + i, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING)
        s1 = _cs(tl.load(s_row + i, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING)
        s2 = _cs(tl.load(s_row + half + i, mask=cm, other=float("nan")), DTYPE_IN, HF_ROUNDING)
        y1, y2 = _pair_outputs(x1, x2, c1, c2, s1, s2, z, DTYPE, BACKWARD, HF_ROUNDING)
        tl.store(out + i * sod, y1.to(DTYPE), mask=m)
        tl.store(out + (i + half) * sod, y2.to(DTYPE), mask=m)
    if COPY_PASS:
        f = 2 * half + tl.arange(0, BLOCK_P)[None, None, :]
        m = ok & (f < 2 * half + n_pass)
        tl.store(out + f * sod, tl.load(row + f * sxd, mask=m), mask=m)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, POS,
    sqb, sqt, sqh, sqd, skb, skt, skh, skd,
    soqb, soqt, soqh, soqd, sokb, sokt, sokh, sokd,
    scb, sct, ssb, sst, spb, spt,
    seq_len, heads_q, heads_k, half, n_pass, n_positions, neg_zero, q_blocks,
    BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_R2: tl.constexpr,
    BLOCK_P: tl.constexpr, PAIRS: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr,
    COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr, HF_ROUNDING: tl.constexpr,
):
    token_blocks = tl.cdiv(seq_len, BLOCK_T)
    pid = tl.program_id(0)
    b = (pid // token_blocks).to(tl.int64)
    t = (pid % token_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    t_ok = t < seq_len
    t = t.to(tl.int64)
    limit, c_row, s_row = _cos_sin_rows(COS, SIN, POS, b, t, t_ok, half, n_positions, scb, sct, ssb, sst, spb, spt,
                                        HAS_POS)
    hb = tl.program_id(1)
    if hb < q_blocks:
        _rope_tile(Q, QO, b * sqb + t * sqt, b * soqb + t * soqt, hb * BLOCK_HQ, heads_q, sqh, sqd, soqh, soqd,
                   t_ok, c_row, s_row, limit, half, n_pass, neg_zero, BLOCK_T, BLOCK_HQ, BLOCK_R2, BLOCK_P,
                   PAIRS, INTERLEAVED, COPY_PASS, BACKWARD, HF_ROUNDING)
    else:
        _rope_tile(K, KO, b * skb + t * skt, b * sokb + t * sokt, (hb - q_blocks) * BLOCK_HK, heads_k, skh, skd,
                   sokh, sokd, t_ok, c_row, s_row, limit, half, n_pass, neg_zero, BLOCK_T, BLOCK_HK, BLOCK_R2,
                   BLOCK_P, PAIRS, INTERLEAVED, COPY_PASS, BACKWARD, HF_ROUNDING)


_kernel = Launcher(_rope_kernel)


def tile_shape(
    seq_len: int, heads_q: int, heads_k: int, width: int, heads_contiguous: bool, config: TileConfig
) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_HQ, BLOCK_HK): tokens and q/k heads of a tile of about `config.elements` elements.

    Args:
        width: the tile's features (the rotary width rounded up to a power of two).
        heads_contiguous: a token's heads lie closer together than a head's tokens ((B, T, H, D)):
            the tile takes heads first; else tokens first, up to `config.tokens`.
    """
    rows = max(1, config.elements // width)
    tokens = next_power_of_2(seq_len)
    if heads_contiguous:
        block_hq = min(next_power_of_2(heads_q), rows)
        block_t = min(tokens, max(1, rows // block_hq))
    else:
        block_t = min(tokens, config.tokens, rows)
        block_hq = min(next_power_of_2(heads_q), max(1, rows // block_t))
        block_t = min(tokens, max(block_t, rows // block_hq))  # few heads: more tokens instead
    return block_t, block_hq, min(next_power_of_2(heads_k), max(1, rows // block_t))


def plan(
    sizes: Sizes, heads_contiguous: bool, flags: Flags, config: TileConfig,
) -> tuple[Launcher, tuple[int, ...], tuple, dict]:
    """The tile kernel's launch for plan.py: (kernel, grid, the scalar arguments after the strides, the
    constexprs and warps). `heads_contiguous` as for `tile_shape` (q's head stride below its token
    stride)."""
    batch, seq_len, heads_q, heads_k, half, n_pass, n_positions = sizes
    pairs = config.pairs_interleaved if flags.interleaved else config.pairs_rotate_half
    block_r2 = next_power_of_2(half)
    block_t, block_hq, block_hk = tile_shape(seq_len, heads_q, heads_k, 2 * block_r2, heads_contiguous, config)
    q_blocks = triton.cdiv(heads_q, block_hq)
    grid = (batch * triton.cdiv(seq_len, block_t), q_blocks + triton.cdiv(heads_k, block_hk))
    meta = dict(
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_R2=block_r2,
        BLOCK_P=next_power_of_2(n_pass) if flags.copy_pass else 1, PAIRS=PAIR_METHODS.index(pairs),
        **flags.meta(), num_warps=config.num_warps,
    )
    return _kernel, grid, (seq_len, heads_q, heads_k, half, n_pass, n_positions, -0.0, q_blocks), meta
