"""What the tile and flat rotary kernels share (tile.py, flat.py): the cos/sin rows of a block of tokens,
and fp32 products of a feature and its partner with cos/sin, optionally rounded as transformers' eager
code rounds them. @triton.jit helpers only; the math is in the package docstring."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _products(a, n, c, e, z, DTYPE: tl.constexpr, HF_ROUNDING: tl.constexpr):
    # a * c + n * e in fp32. HF_ROUNDING rounds each product to DTYPE before the sum, as eager
    # transformers does. Each product is then fma(., ., z) with z = -0.0 given at run time: the
    # product rounded to fp32 (exact for bf16/fp16 operands), and an addend the compiler cannot see
    # stops it from narrowing the product to DTYPE and fusing it with the sum into one FMA, which
    # skips the product's rounding (a plain `(a * c).to(DTYPE)` is not bitwise eager on the GPU for
    # that reason)
    if HF_ROUNDING:
        y = tl.fma(a, c, z).to(DTYPE).to(tl.float32) + tl.fma(n, e, z).to(DTYPE).to(tl.float32)
    else:
        y = a * c + n * e
    return y


@triton.jit
def _pair_outputs(x1, x2, c1, c2, s1, s2, z, DTYPE: tl.constexpr, BACKWARD: tl.constexpr,
                  HF_ROUNDING: tl.constexpr):
    if BACKWARD:  # the transpose
        y1 = _products(x1, x2, c1, s2, z, DTYPE, HF_ROUNDING)
        y2 = _products(x2, -x1, c2, s1, z, DTYPE, HF_ROUNDING)
    else:
        y1 = _products(x1, -x2, c1, s1, z, DTYPE, HF_ROUNDING)
        y2 = _products(x2, x1, c2, s2, z, DTYPE, HF_ROUNDING)
    return y1, y2


@triton.jit
def _cs(v, DTYPE_IN: tl.constexpr, HF_ROUNDING: tl.constexpr):
    # cos/sin in fp32; transformers multiplies by them in q's dtype
    if HF_ROUNDING:
        v = v.to(DTYPE_IN)
    return v.to(tl.float32)


@triton.jit
def _partner_outputs(x, xp, first, c_row, s_row, j, p, cm, z, DTYPE_IN: tl.constexpr, DTYPE: tl.constexpr,
                     BACKWARD: tl.constexpr, HF_ROUNDING: tl.constexpr, EVICT: tl.constexpr):
    # fp32 outputs of features x with their pair partners xp (first: x is a pair's first member), cos/sin
    # read at feature j (and the partner's p in the backward) where cm holds, with eviction policy EVICT
    c = _cs(tl.load(c_row + j, mask=cm, other=float("nan"), eviction_policy=EVICT), DTYPE_IN, HF_ROUNDING)
    if BACKWARD:  # dx[j] = dy[j] c[j] +- dy[p] s[p]
        s = _cs(tl.load(s_row + p, mask=cm, other=float("nan"), eviction_policy=EVICT), DTYPE_IN, HF_ROUNDING)
        xp = tl.where(first, xp, -xp)
    else:  # y[j] = x[j] c[j] -+ x[p] s[j]
        s = _cs(tl.load(s_row + j, mask=cm, other=float("nan"), eviction_policy=EVICT), DTYPE_IN, HF_ROUNDING)
        xp = tl.where(first, -xp, xp)
    return _products(x, xp, c, s, z, DTYPE, HF_ROUNDING)


@triton.jit
def _cos_sin_rows(COS, SIN, POS, b, t, ok, half, n_positions, scb, sct, ssb, sst, spb, spt,
                  HAS_POS: tl.constexpr):
    # (limit, cos row, sin row) of tokens (b, t) where ok: the row position_ids[b, t] of a table, or row
    # (b, t) of (B or 1, T, r) rows; limit is the pairs to read, 0 past the tokens or outside the table
    if HAS_POS:
        pos = tl.load(POS + b * spb + t * spt, mask=ok, other=0).to(tl.int64)
        limit = tl.where((pos >= 0) & (pos < n_positions) & ok, half, 0)
        c_row, s_row = COS + pos * sct, SIN + pos * sst
    else:
        limit = tl.where(ok, half, 0)
        c_row, s_row = COS + b * scb + t * sct, SIN + b * ssb + t * sst
    return limit, c_row, s_row
