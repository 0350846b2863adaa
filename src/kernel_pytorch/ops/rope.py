"""Rotary position embedding kernels, registered as `kernel_pytorch::rope_fwd` / `_bwd`: q and k rotated
in one launch.

Math (reference/rope.py is the specification): for each token's heads of q (Hq) and k (Hk), rotary
width r <= D, a pair (x1, x2) of features -- (i, i + r/2) for rotate-half, (2i, 2i + 1) interleaved --
with that pair's cos/sin entries (c1, c2), (s1, s2):

    forward:  y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2          # fp32, rounded once
    backward: dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1      # the transpose (inverse rotation)
    features r .. D - 1 pass through (copied out of place, untouched in place)

Per feature j with partner p(j) (the other member of its pair): y[j] = x[j] c[j] -+ x[p] s[j] forward,
dx[j] = dy[j] c[j] +- dy[p] s[p] backward (minus on the first member of a pair going forward).

Design. q/k/outputs are addressed through (batch, token, head, feature) strides, so (B, H, T, D),
(B, T, H, D) and views of one fused QKV projection run without a copy. Dense q/k run the flat kernel
(below); other strides the tile kernel (rotate-half) or the per-token kernel (interleaved). The tile
kernel's grid is (batch x token blocks, head blocks of q then of k): each program rotates one
[BLOCK_T tokens, BLOCK_H heads, r] tile of q or of k, about TILE_ELEMENTS elements, all loaded at
once. The tile follows the memory: (B, H, T, D) keeps tokens contiguous within a head, so a tile
takes TOKENS_PER_TILE tokens of a few heads (2 KiB runs); (B, T, H, D) keeps a token's heads
contiguous, so a tile takes a token's heads. cos/sin rows
(B or 1, T, r), or rows position_ids[b, t] of a (P, r) table, are read once per tile and shared by
its heads. How a tile forms its pairs (PAIRS_*; the probe times each):
    "partner"  each head's rotary features in one contiguous load, and a second load of every
               feature's partner from the same cache lines (L1/L2 hits, no DRAM traffic)
    "split"    one contiguous load, the pairs separated in registers (interleaved: even/odd lanes;
               rotate-half: the two halves as a [2, r/2] tile, transposed)
    "halves"   rotate-half only: two half-row loads per head (the first kernel's way)
The first kernel (one program per token, all heads; ops/_rope_token.py) stays selectable as
SCHEDULE = "token". The flat kernel (ops/_rope_flat.py) runs a 1-D grid over the rows of q then of k
where each of q, k and their outputs is dense in (B, H, T, D) or (B, T, H, D) order: contiguous runs
of BLOCK_ELEMENTS, token and batch found by integer division, the shape of torch.compile's pointwise
kernel.

Which kernel runs (SCHEDULES, by convention): the flat kernel wherever it applies, else FALLBACK (the
tile kernel for rotate-half pairs, the per-token kernel for interleaved ones). Measured on an H200
(benchmarks/results/probes/rope/probe_rope_pairs_h200.log; q (4, 32, 4096, 128) + k (4, 8, 4096, 128)
bf16, graph replay, fwd / bwd % of copy): rotate-half (B, H, T, D) flat 81.6 / 83.3 against the tile
kernel's 75.1 / 77.8 (its best pairs, 78.5 / 77.9 split); interleaved (B, T, H, D) flat 88.1 / 86.2
against the per-token kernel's 84.6 / 84.6; the flat kernel leads in three of the four layouts and is
within 1.4 points of the best tile form (halves) in the fourth. The H100's first round had measured
the per-token kernel only (interleaved 90.1% fwd+bwd, rotate-half 86.2%; probes/rope/probe_rope_h100.log).

Traffic is q and k read once and written once (the copy bound); an out-of-range
position id gives NaN rows instead of reading outside the table.

hf_rounding=True: each product rounded to the input dtype before the sum, cos/sin taken in it:
transformers' eager result and autograd gradient bit for bit, for parity checks (see `_products`).
Saved for backward: cos, sin (and position ids), which the model keeps anyway.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import _rope_flat, _rope_token
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._rope_math import _cos_sin_rows, _cs, _pair_outputs, _partner_outputs
from kernel_pytorch.reference.rope import rope, rope_backward

# Elements of q or k per program (8 KiB of bf16), tokens per tile where a head's tokens are contiguous,
# warps (4 beat 8 by 5-9 points on an H100, 2026-11-23), how tiles form pairs, which kernel runs.
TILE_ELEMENTS = 4096
TOKENS_PER_TILE = 8
NUM_WARPS = 4
PAIRS_ROTATE_HALF = "partner"
PAIRS_INTERLEAVED = "split"
SCHEDULE: str | None = None  # None: SCHEDULES[interleaved]; "tile", "token" or "flat" forces one (tests, probe)
SCHEDULES = {False: "flat", True: "flat"}  # rotate-half, interleaved (module docstring)
FALLBACK = {False: "tile", True: "token"}  # where the flat kernel does not apply (strides)
_PAIRS = {"halves": 0, "split": 1, "partner": 2}


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


def _bthd_strides(x: Tensor, unsqueeze_dim: int) -> tuple[int, int, int, int]:
    """(batch, token, head, feature) strides of a (B, H, T, D) (unsqueeze_dim=1) or (B, T, H, D) tensor."""
    s = x.stride()
    return (s[0], s[2], s[1], s[3]) if unsqueeze_dim == 1 else s


def _row_strides(t: Tensor, table: bool) -> tuple[int, int]:
    """The (batch, row) strides of cos or sin (unit last stride, which `_launch` makes sure of): batch
    0 where it broadcasts; a table's rows are indexed by position (batch stride unused)."""
    if table or t.dim() == 2:
        return 0, t.stride(0)
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def tile_shape(seq_len: int, heads_q: int, heads_k: int, width: int, heads_contiguous: bool) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_HQ, BLOCK_HK): tokens and q/k heads of a tile of about TILE_ELEMENTS elements.

    Args:
        width: the tile's features (the rotary width rounded up to a power of two).
        heads_contiguous: a token's heads lie closer together than a head's tokens ((B, T, H, D)):
            the tile takes heads first; else tokens first, up to TOKENS_PER_TILE.
    """
    rows = max(1, TILE_ELEMENTS // width)
    tokens = next_power_of_2(seq_len)
    if heads_contiguous:
        block_hq = min(next_power_of_2(heads_q), rows)
        block_t = min(tokens, max(1, rows // block_hq))
    else:
        block_t = min(tokens, TOKENS_PER_TILE, rows)
        block_hq = min(next_power_of_2(heads_q), max(1, rows // block_t))
        block_t = min(tokens, max(block_t, rows // block_hq))  # few heads: more tokens instead
    return block_t, block_hq, min(next_power_of_2(heads_k), max(1, rows // block_t))


# Eager launch plans by the inputs' shapes and strides, flags and the tunables (a decode step meets the
# same shapes every call): `_plan` costs tens of microseconds of Python per call, the lookup a few.
_PLANS: dict[tuple, tuple | None] = {}
MAX_PLANS = 1024


def _launch(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool, inplace: bool, backward: bool, eager: bool,
) -> tuple[Tensor, Tensor]:
    qo = q if inplace else torch.empty_like(q)
    ko = k if inplace else torch.empty_like(k)
    if cos.stride(-1) != 1:
        cos = cos.contiguous()  # (rows, r) of cos/sin: small next to q and k
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    pos = position_ids
    if not eager:  # traced (compile, export): sizes may be symbolic, nothing to cache
        plan = _plan(q, k, qo, ko, cos, sin, pos, interleaved, unsqueeze_dim, hf_rounding, inplace, backward)
    else:
        key = (
            q.shape, q.stride(), k.shape, k.stride(), qo.stride(), ko.stride(), cos.shape, cos.stride(), sin.shape,
            sin.stride(), None if pos is None else (pos.shape, pos.stride()), interleaved, unsqueeze_dim,
            hf_rounding, inplace, backward, TILE_ELEMENTS, TOKENS_PER_TILE, NUM_WARPS, PAIRS_ROTATE_HALF,
            PAIRS_INTERLEAVED, SCHEDULE, SCHEDULES[interleaved], _rope_token.TILE_ELEMENTS,
            _rope_flat.BLOCK_ELEMENTS, _rope_flat.PARTNER, _rope_flat.EVICT_TABLES, _rope_flat.NUM_WARPS,
        )
        plan = _PLANS.get(key, False)
        if plan is False:
            plan = _plan(q, k, qo, ko, cos, sin, pos, interleaved, unsqueeze_dim, hf_rounding, inplace, backward)
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan is not None:
        kernel, grid, scalars, meta = plan
        kernel(grid, q, k, qo, ko, cos, sin, cos if pos is None else pos, *scalars, **meta, eager=eager)
    return qo, ko


def _plan(
    q: Tensor, k: Tensor, qo: Tensor, ko: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None,
    interleaved: bool, unsqueeze_dim: int, hf_rounding: bool, inplace: bool, backward: bool,
) -> tuple | None:
    """(kernel, grid, the scalar arguments after the tensors, constexprs and warps) for these inputs'
    shapes and strides, or None when there is nothing to rotate; cos and sin have a unit last stride."""
    batch, seq_len, d = q.shape[0], q.shape[3 - unsqueeze_dim], q.shape[-1]
    heads_q, heads_k = q.shape[unsqueeze_dim], k.shape[unsqueeze_dim]
    if batch * seq_len * (heads_q + heads_k) == 0:
        return None
    table = position_ids is not None
    scb, sct = _row_strides(cos, table)
    ssb, sst = _row_strides(sin, table)
    if table:
        pos = position_ids
        spb, spt = (0, pos.stride(0)) if pos.dim() == 1 else (pos.stride(0) if pos.shape[0] > 1 else 0, pos.stride(1))
    else:
        spb, spt = 0, 0
    half = cos.shape[-1] // 2
    n_pass = d - 2 * half
    copy_pass = not inplace and n_pass > 0
    sq = _bthd_strides(q, unsqueeze_dim)
    strides = (*sq, *_bthd_strides(k, unsqueeze_dim), *_bthd_strides(qo, unsqueeze_dim),
               *_bthd_strides(ko, unsqueeze_dim), scb, sct, ssb, sst, spb, spt)
    n_positions = cos.shape[0] if table else 0
    schedule = SCHEDULE or SCHEDULES[interleaved]
    if schedule == "flat":
        flat = _rope_flat.plan(q, k, qo, ko, unsqueeze_dim, half, strides[-6:], n_positions, interleaved=interleaved,
                               has_pos=table, copy_pass=copy_pass, backward=backward, hf_rounding=hf_rounding,
                               num_warps=NUM_WARPS)
        if flat is not None:
            return flat
        schedule = FALLBACK[interleaved]  # not dense in one of the two orders
    if schedule == "token":
        kernel, grid, scalars, meta = _rope_token.plan(
            batch, seq_len, heads_q, heads_k, half, n_pass, n_positions, interleaved=interleaved, has_pos=table,
            copy_pass=copy_pass, backward=backward, hf_rounding=hf_rounding, num_warps=NUM_WARPS,
        )
        return kernel, grid, (*strides, *scalars), meta
    pairs = PAIRS_INTERLEAVED if interleaved else PAIRS_ROTATE_HALF
    if pairs not in _PAIRS or (interleaved and pairs == "halves"):
        raise ValueError(f"no pair method {pairs!r} for {'interleaved' if interleaved else 'rotate-half'} pairs")
    block_r2 = next_power_of_2(half)
    block_t, block_hq, block_hk = tile_shape(seq_len, heads_q, heads_k, 2 * block_r2, sq[2] < sq[1])
    q_blocks = triton.cdiv(heads_q, block_hq)
    grid = (batch * triton.cdiv(seq_len, block_t), q_blocks + triton.cdiv(heads_k, block_hk))
    meta = dict(
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_R2=block_r2,
        BLOCK_P=next_power_of_2(n_pass) if copy_pass else 1, PAIRS=_PAIRS[pairs], INTERLEAVED=interleaved,
        HAS_POS=table, COPY_PASS=copy_pass, BACKWARD=backward, HF_ROUNDING=hf_rounding, num_warps=NUM_WARPS,
    )
    return _kernel, grid, (*strides, seq_len, heads_q, heads_k, half, n_pass, n_positions, -0.0, q_blocks), meta


def rope_fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, interleaved: bool = False,
    unsqueeze_dim: int = 1, hf_rounding: bool = False, *, inplace: bool = False, eager: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k in one launch (arguments checked by reference/rope_checks.check_rope_args).

    Args:
        q: (B, Hq, T, D) for unsqueeze_dim=1 or (B, T, Hq, D) for unsqueeze_dim=2, any strides,
            fp32/bf16/fp16, CUDA (or CPU under TRITON_INTERPRET=1).
        k: the same layout and dtype, Hk heads.
        cos, sin: (B or 1, T, r) or (T, r) rows; with position_ids, (P, r) tables. Any float dtype.
        position_ids: None or integer (T,), (1, T), (B, T).
        interleaved: pairs (2i, 2i + 1) instead of (i, i + r/2).
        hf_rounding: round each product to q's dtype as transformers' eager code does (bitwise its
            result) instead of fp32 math rounded once.
        inplace: write into q and k (returned) instead of new tensors.
        eager: launch directly rather than through wrap_triton.
    Returns:
        (q_embed, k_embed): q's and k's shapes and dtypes; new tensors laid out like q and k
        (torch.empty_like), or q and k themselves in place.
    """
    return _launch(q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding, inplace, False, eager)


def rope_bwd(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, interleaved: bool = False,
    unsqueeze_dim: int = 1, hf_rounding: bool = False, *, inplace: bool = False, eager: bool = False,
) -> tuple[Tensor, Tensor]:
    """Gradients for q and k from the upstream (dq_embed, dk_embed): the inverse rotation, same
    arguments as `rope_fwd` (inplace overwrites dq and dk). Returns (dq, dk)."""
    return _launch(dq, dk, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding, inplace, True, eager)


def _fwd_reference(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    qo, ko = rope(q, k, cos, sin, position_ids, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim,
                  hf_rounding=hf_rounding)
    return torch.empty_like(q).copy_(qo), torch.empty_like(k).copy_(ko)  # the launcher's layout


def _bwd_reference(
    dq_embed: Tensor, dk_embed: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    dq, dk = rope_backward(dq_embed, dk_embed, cos, sin, position_ids, interleaved=interleaved,
                           unsqueeze_dim=unsqueeze_dim, hf_rounding=hf_rounding)
    return torch.empty_like(dq_embed).copy_(dq), torch.empty_like(dk_embed).copy_(dk)


def _fake(
    a: Tensor, b: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(a), torch.empty_like(b)


# kernel_pytorch::rope_fwd (q, k, cos, sin, position_ids?, interleaved, unsqueeze_dim, hf_rounding) ->
# (q_embed, k_embed) and rope_bwd (dq_embed, dk_embed, cos, sin, position_ids?, interleaved,
# unsqueeze_dim, hf_rounding) -> (dq, dk); rope_eager(same arguments as rope_fwd) -> (q_embed, k_embed).
# The in-place variant is functional/rope.py's (an op may not return its inputs).
rope_fwd_op, rope_bwd_op, rope_eager = register_op(
    "rope",
    Impl(rope_fwd, _fwd_reference, _fake, outputs=("q_embed", "k_embed")),
    Impl(rope_bwd, _bwd_reference, _fake, outputs=("dq", "dk")),
    differentiable=("q_embed", "k_embed"),
    save=("cos", "sin", "position_ids"),
    keep=("interleaved", "unsqueeze_dim", "hf_rounding"),
    grads={"q": "dq", "k": "dk"},
)
