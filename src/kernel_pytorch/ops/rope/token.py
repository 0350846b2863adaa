"""The per-token kernel for rotary embeddings: one program per (batch, token), at any strides. It runs
interleaved pairs where the flat kernel (flat.py) does not apply (RopeConfig.fallback_interleaved), and
every layout under schedule="token" (same arguments, same results as the tile kernel).

A program reads its token's cos/sin row once and rotates all Hq + Hk heads with it, BLOCK_H heads at a
time ([BLOCK_H, r/2] tiles, a loop over head tiles for wide models; TokenConfig.elements bounds a
tile). Rotate-half loads each head's two halves as two half-row vectors; interleaved loads the rotary
features contiguously and splits even/odd in registers. Measured on an H100
(benchmarks/results/probes/rope/probe_rope_h100.log, 2026-11-23): fwd+bwd 86.2% of copy rotate-half, 90.1%
interleaved, (B, H, T, D) layout.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops.rope.call import Flags, Sizes
from kernel_pytorch.ops.rope.config import TokenConfig


@triton.jit
def _rotate_pair(x1, x2, c1, c2, s1, s2, z, DTYPE: tl.constexpr, HF_ROUNDING: tl.constexpr):
    # (y1, y2) = (x1 c1 - x2 s1, x2 c2 + x1 s2) in fp32; HF_ROUNDING rounds each product to DTYPE
    # first (fma with the run-time -0.0 `z`: see math.py's _products)
    if HF_ROUNDING:
        y1 = tl.fma(x1, c1, z).to(DTYPE).to(tl.float32) + tl.fma(-x2, s1, z).to(DTYPE).to(tl.float32)
        y2 = tl.fma(x2, c2, z).to(DTYPE).to(tl.float32) + tl.fma(x1, s2, z).to(DTYPE).to(tl.float32)
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    return y1, y2


@triton.jit
def _rotate_heads(
    X, XO, x_base, o_base, stride_h, stride_d, stride_oh, stride_od, n_heads, half, n_pass,
    c1, c2, s1, s2, z,
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
            y1, y2 = _rotate_pair(x1, x2, c1, c2, s1, s2, z, XO.dtype.element_ty, HF_ROUNDING)
            y = tl.reshape(tl.join(y1, y2), [BLOCK_H, 2 * BLOCK_R2])
            tl.store(out + j * stride_od, y.to(XO.dtype.element_ty), mask=ok)
        else:
            ok = h_ok & (i < half)
            x1 = tl.load(row + i * stride_d, mask=ok, other=0.0).to(tl.float32)
            x2 = tl.load(row + (i + half) * stride_d, mask=ok, other=0.0).to(tl.float32)
            y1, y2 = _rotate_pair(x1, x2, c1, c2, s1, s2, z, XO.dtype.element_ty, HF_ROUNDING)
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
def _rope_token_kernel(
    Q, K, QO, KO, COS, SIN, POS,
    sqb, sqt, sqh, sqd, skb, skt, skh, skd,
    soqb, soqt, soqh, soqd, sokb, sokt, sokh, sokd,
    scb, sct, ssb, sst, spb, spt,
    seq_len, heads_q, heads_k, half, n_pass, n_positions, neg_zero,
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
                  c1, c2, s1, s2, neg_zero, BLOCK_HQ, BLOCK_R2, BLOCK_P, INTERLEAVED, COPY_PASS, HF_ROUNDING)
    _rotate_heads(K, KO, b * skb + t * skt, b * sokb + t * sokt, skh, skd, sokh, sokd, heads_k, half, n_pass,
                  c1, c2, s1, s2, neg_zero, BLOCK_HK, BLOCK_R2, BLOCK_P, INTERLEAVED, COPY_PASS, HF_ROUNDING)


_kernel = Launcher(_rope_token_kernel)


def heads_per_tile(heads: int, block_r2: int, config: TokenConfig) -> int:
    """Heads a program rotates at once: all of them up to `config.elements` elements, a power of two."""
    return max(1, min(next_power_of_2(heads), next_power_of_2(max(1, config.elements // (2 * block_r2)))))


def plan(sizes: Sizes, flags: Flags, config: TokenConfig) -> tuple[Launcher, tuple[int, ...], tuple, dict]:
    """The per-token kernel's launch for plan.py: (kernel, grid, the scalar arguments after the
    strides, the constexprs and warps)."""
    batch, seq_len, heads_q, heads_k, half, n_pass, n_positions = sizes
    block_r2 = next_power_of_2(half)
    meta = dict(
        BLOCK_R2=block_r2, BLOCK_P=next_power_of_2(n_pass) if flags.copy_pass else 1,
        BLOCK_HQ=heads_per_tile(heads_q, block_r2, config), BLOCK_HK=heads_per_tile(heads_k, block_r2, config),
        **flags.meta(), num_warps=config.num_warps,
    )
    return _kernel, (batch * seq_len,), (seq_len, heads_q, heads_k, half, n_pass, n_positions, -0.0), meta

