"""Rotary position embedding kernels: q and k rotated in one launch, forward and backward.

Math (reference/rope.py is the specification): for each token's heads of q (Hq) and k (Hk), rotary
width r <= D, a pair (x1, x2) of features -- (i, i + r/2) for rotate-half, (2i, 2i + 1) interleaved --
with that pair's cos/sin entries (c1, c2), (s1, s2):

    forward:  y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2          # fp32, rounded once
    backward: dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1      # the transpose (inverse rotation)
    features r.. D - 1 pass through (copied out-of-place, untouched in place)

The backward is the forward with (s1, s2) -> (-s2, -s1): one kernel, a BACKWARD flag.

Design. q/k/outputs are addressed through (batch, token, head, feature) strides, so (B, H, T, D),
(B, T, H, D) and views of one fused QKV projection run without a copy. Grid: one program per
(batch, token). The program reads that token's cos/sin row once -- from (B or 1, T, r) rows, or
row position_ids[b, t] of a (P, r) table -- and rotates all Hq + Hk heads with it, BLOCK_H heads at a
time ([BLOCK_H, r/2] tiles, so registers stay bounded for any head count). Rotate-half loads each
head's two halves as two contiguous vectors; interleaved loads the head's r features contiguously and
splits even/odd in registers (tl.split), never a stride-2 load. cos/sin rows are tiny next to q and k
(r values each vs (Hq + Hk) * D) and shared by all heads, so the traffic is q and k read once and
written once: the copy bound. An out-of-range position id gives NaN rows instead of reading outside
the table (the eager check in reference/rope_checks.py reports it by name).

HF_ROUNDING (hf_rounding=True): products rounded to the input dtype before the sum, bitwise
transformers' eager result (and its autograd gradient) for parity checks; the default rounds once.

Saved for backward: nothing but cos/sin (or the table and position ids), which the model keeps anyway.
In place (inplace=True) the outputs are q and k themselves and the pass-through features are not read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._launch import Launcher, next_power_of_2

# Elements of q/k a program holds per head block (both halves): 32 heads of 128 in one tile. Bounds the
# registers for wide models; the probe (scripts/probe_rope.py) sweeps it with the warps.
TILE_ELEMENTS = 4096
NUM_WARPS = 4


@triton.jit
def _rotate_pair(x1, x2, c1, c2, s1, s2, DTYPE: tl.constexpr, HF_ROUNDING: tl.constexpr):
    # (y1, y2) = (x1 c1 - x2 s1, x2 c2 + x1 s2) in fp32; HF_ROUNDING rounds each product to DTYPE
    # first, as transformers' eager code does (an fp32 product of two DTYPE values is exact, and the
    # rounded products cannot be fused into an FMA: bitwise the eager result)
    if HF_ROUNDING:
        y1 = (x1 * c1).to(DTYPE).to(tl.float32) - (x2 * s1).to(DTYPE).to(tl.float32)
        y2 = (x2 * c2).to(DTYPE).to(tl.float32) + (x1 * s2).to(DTYPE).to(tl.float32)
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    return y1, y2


@triton.jit
def _rotate_heads(
    X, XO, x_base, o_base, stride_h, stride_d, stride_oh, stride_od, n_heads, half, n_pass,
    c1, c2, s1, s2,
    BLOCK_H: tl.constexpr, BLOCK_R2: tl.constexpr, BLOCK_P: tl.constexpr,
    INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr, HF_ROUNDING: tl.constexpr,
):
    # rotate heads 0 .. n_heads - 1 of one token, BLOCK_H at a time; c*/s* are [1, BLOCK_R2] fp32
    i = tl.arange(0, BLOCK_R2)[None, :]
    for h0 in range(0, n_heads, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[:, None]
        h_ok = h < n_heads
        row = X + x_base + h.to(tl.int64) * stride_h
        out = XO + o_base + h.to(tl.int64) * stride_oh
        if INTERLEAVED:
            j = tl.arange(0, 2 * BLOCK_R2)[None, :]
            ok = h_ok & (j < 2 * half)
            x = tl.load(row + j * stride_d, mask=ok, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, [BLOCK_H, BLOCK_R2, 2]))
            y1, y2 = _rotate_pair(x1, x2, c1, c2, s1, s2, XO.dtype.element_ty, HF_ROUNDING)
            y = tl.reshape(tl.join(y1, y2), [BLOCK_H, 2 * BLOCK_R2])
            tl.store(out + j * stride_od, y.to(XO.dtype.element_ty), mask=ok)
        else:
            ok = h_ok & (i < half)
            x1 = tl.load(row + i * stride_d, mask=ok, other=0.0).to(tl.float32)
            x2 = tl.load(row + (i + half) * stride_d, mask=ok, other=0.0).to(tl.float32)
            y1, y2 = _rotate_pair(x1, x2, c1, c2, s1, s2, XO.dtype.element_ty, HF_ROUNDING)
            tl.store(out + i * stride_od, y1.to(XO.dtype.element_ty), mask=ok)
            tl.store(out + (i + half) * stride_od, y2.to(XO.dtype.element_ty), mask=ok)
        if COPY_PASS:
            p = tl.arange(0, BLOCK_P)[None, :]
            ok = h_ok & (p < n_pass)
            v = tl.load(row + (2 * half + p) * stride_d, mask=ok)
            tl.store(out + (2 * half + p) * stride_od, v, mask=ok)


@triton.jit
def _load_pair(ROW, half, limit, i, INTERLEAVED: tl.constexpr, BLOCK_R2: tl.constexpr):
    # a cos/sin row as its (first, second)-of-pair entries, [1, BLOCK_R2] fp32 each; features past
    # `limit` pairs read NaN (limit is 0 for a position outside the table: NaN rows, no stray read)
    if INTERLEAVED:
        j = tl.arange(0, 2 * BLOCK_R2)[None, :]
        v = tl.load(ROW + j, mask=j < 2 * limit, other=float("nan")).to(tl.float32)
        a, b = tl.split(tl.reshape(v, [1, BLOCK_R2, 2]))
    else:
        a = tl.load(ROW + i, mask=i < limit, other=float("nan")).to(tl.float32)
        b = tl.load(ROW + half + i, mask=i < limit, other=float("nan")).to(tl.float32)
    return a, b


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, POS,
    sqb, sqt, sqh, sqd, skb, skt, skh, skd,
    soqb, soqt, soqh, soqd, sokb, sokt, sokh, sokd,
    scb, sct, ssb, sst, spb, spt,
    seq_len, heads_q, heads_k, half, n_pass, n_positions,
    BLOCK_R2: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_POS: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr,
    HF_ROUNDING: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // seq_len).to(tl.int64)
    t = (pid % seq_len).to(tl.int64)
    i = tl.arange(0, BLOCK_R2)[None, :]
    if HAS_POS:
        pos = tl.load(POS + b * spb + t * spt).to(tl.int64)
        limit = tl.where((pos >= 0) & (pos < n_positions), half, 0)
        c1, c2 = _load_pair(COS + pos * sct, half, limit, i, INTERLEAVED, BLOCK_R2)
        s1, s2 = _load_pair(SIN + pos * sst, half, limit, i, INTERLEAVED, BLOCK_R2)
    else:
        c1, c2 = _load_pair(COS + b * scb + t * sct, half, half, i, INTERLEAVED, BLOCK_R2)
        s1, s2 = _load_pair(SIN + b * ssb + t * sst, half, half, i, INTERLEAVED, BLOCK_R2)
    if HF_ROUNDING:  # transformers multiplies by cos/sin in q's dtype
        c1, c2 = c1.to(Q.dtype.element_ty).to(tl.float32), c2.to(Q.dtype.element_ty).to(tl.float32)
        s1, s2 = s1.to(Q.dtype.element_ty).to(tl.float32), s2.to(Q.dtype.element_ty).to(tl.float32)
    if BACKWARD:  # the transpose: (s1, s2) -> (-s2, -s1)
        s1, s2 = -s2, -s1
    _rotate_heads(Q, QO, b * sqb + t * sqt, b * soqb + t * soqt, sqh, sqd, soqh, soqd, heads_q, half, n_pass,
                  c1, c2, s1, s2, BLOCK_HQ, BLOCK_R2, BLOCK_P, INTERLEAVED, COPY_PASS, HF_ROUNDING)
    _rotate_heads(K, KO, b * skb + t * skt, b * sokb + t * sokt, skh, skd, sokh, sokd, heads_k, half, n_pass,
                  c1, c2, s1, s2, BLOCK_HK, BLOCK_R2, BLOCK_P, INTERLEAVED, COPY_PASS, HF_ROUNDING)


_kernel = Launcher(_rope_kernel)


def _bthd_strides(x: Tensor, unsqueeze_dim: int) -> tuple[int, int, int, int]:
    """(batch, token, head, feature) strides of a (B, H, T, D) (unsqueeze_dim=1) or (B, T, H, D) tensor."""
    s = x.stride()
    return (s[0], s[2], s[1], s[3]) if unsqueeze_dim == 1 else s


def _row_strides(t: Tensor, table: bool) -> tuple[Tensor, int, int]:
    """cos or sin with a unit last stride, and its (batch, row) strides: batch 0 where it broadcasts;
    a table's rows are indexed by position (batch stride unused)."""
    if t.stride(-1) != 1:
        t = t.contiguous()  # (rows, r) of cos/sin: small next to q and k
    if table or t.dim() == 2:
        return t, 0, t.stride(0)
    return t, (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def heads_per_tile(heads: int, block_r2: int) -> int:
    """Heads a program rotates at once: all of them up to TILE_ELEMENTS elements, a power of two."""
    return max(1, min(next_power_of_2(heads), next_power_of_2(max(1, TILE_ELEMENTS // (2 * block_r2)))))


def _launch(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None,
    interleaved: bool, unsqueeze_dim: int, inplace: bool, hf_rounding: bool, backward: bool, eager: bool,
) -> tuple[Tensor, Tensor]:
    qo = q if inplace else torch.empty_like(q)
    ko = k if inplace else torch.empty_like(k)
    t_dim = 3 - unsqueeze_dim
    batch, seq_len, d = q.shape[0], q.shape[t_dim], q.shape[-1]
    if batch * seq_len == 0:
        return qo, ko
    table = position_ids is not None
    cos, scb, sct = _row_strides(cos, table)
    sin, ssb, sst = _row_strides(sin, table)
    if table:
        pos = position_ids
        spb, spt = (0, pos.stride(0)) if pos.dim() == 1 else (pos.stride(0) if pos.shape[0] > 1 else 0, pos.stride(1))
    else:
        pos, spb, spt = cos, 0, 0
    half = cos.shape[-1] // 2
    n_pass = d - 2 * half
    copy_pass = not inplace and n_pass > 0
    block_r2 = next_power_of_2(half)
    heads_q, heads_k = q.shape[unsqueeze_dim], k.shape[unsqueeze_dim]
    _kernel(
        (batch * seq_len,), q, k, qo, ko, cos, sin, pos,
        *_bthd_strides(q, unsqueeze_dim), *_bthd_strides(k, unsqueeze_dim),
        *_bthd_strides(qo, unsqueeze_dim), *_bthd_strides(ko, unsqueeze_dim),
        scb, sct, ssb, sst, spb, spt,
        seq_len, heads_q, heads_k, half, n_pass, cos.shape[0] if table else 0,
        BLOCK_R2=block_r2, BLOCK_P=next_power_of_2(n_pass) if copy_pass else 1,
        BLOCK_HQ=heads_per_tile(heads_q, block_r2), BLOCK_HK=heads_per_tile(heads_k, block_r2),
        INTERLEAVED=interleaved, HAS_POS=table, COPY_PASS=copy_pass, BACKWARD=backward, HF_ROUNDING=hf_rounding,
        num_warps=NUM_WARPS, eager=eager,
    )
    return qo, ko


def rope_fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
    *, interleaved: bool = False, unsqueeze_dim: int = 1, inplace: bool = False, hf_rounding: bool = False,
    eager: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k in one launch (arguments checked by reference/rope_checks.check_rope_args).

    Args:
        q: (B, Hq, T, D) for unsqueeze_dim=1 or (B, T, Hq, D) for unsqueeze_dim=2, any strides,
            fp32/bf16/fp16, CUDA (or CPU under TRITON_INTERPRET=1).
        k: the same layout and dtype, Hk heads.
        cos, sin: (B or 1, T, r) or (T, r) rows; with position_ids, (P, r) tables. Any float dtype.
        position_ids: None or integer (T,), (1, T), (B, T).
        interleaved: pairs (2i, 2i + 1) instead of (i, i + r/2).
        inplace: write into q and k (returned) instead of new tensors.
        hf_rounding: round each product to q's dtype as transformers' eager code does (bitwise its
            result) instead of fp32 math rounded once.
        eager: launch directly rather than through wrap_triton.
    Returns:
        (q_embed, k_embed): q's and k's shapes and dtypes; new tensors laid out like q and k
        (torch.empty_like), or q and k themselves in place.
    """
    return _launch(q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, inplace, hf_rounding, False, eager)


def rope_bwd(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
    *, interleaved: bool = False, unsqueeze_dim: int = 1, inplace: bool = False, hf_rounding: bool = False,
    eager: bool = False,
) -> tuple[Tensor, Tensor]:
    """Gradients for q and k from the upstream (dq_embed, dk_embed): the inverse rotation, same
    arguments as `rope_fwd` (inplace overwrites dq and dk). Returns (dq, dk)."""
    return _launch(dq, dk, cos, sin, position_ids, interleaved, unsqueeze_dim, inplace, hf_rounding, True, eager)
