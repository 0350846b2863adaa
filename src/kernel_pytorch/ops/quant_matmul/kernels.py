"""The quantized matmuls' Triton kernels: y[M, N] = x[M, K] @ dequant(W)[N, K].T (+ bias), the weight
dequantized in registers, tile by tile. The kernels serve the three schemes (SCHEME: the index in
SCHEME_CODES); launch.py picks a path per call (gemv, M = 1, is gemv.py's kernel):

  _quant_matmul_kernel   split_k and tiled: grid (M x N tiles, K slices). Each program walks its slice
                         of K a tile at a time: the x tile [BLOCK_M, BLOCK_K], the weight tile
                         [BLOCK_N, BLOCK_K] as stored (int8, e4m3 or packed nibbles) turned into exact
                         values of x's dtype (`_weight_tile`), multiplied by tl.dot in fp32 (M padded to
                         16 rows); int4's tile lies in one group (BLOCK_K <= group size), so each tile's
                         sum is scaled once per row; int8 and fp8 apply the row scale once after the
                         loop. With one K slice the program adds the bias and stores y in x's dtype;
                         with several it stores its fp32 partial sum (so does gemv.py's kernel), and
  _sum_splits_kernel     adds the slices' partial sums in slice order (the same order on every run:
                         deterministic, no atomics), adds the bias and stores y.
  _dequant_kernel        the weight dequantized into a dense (N, K) tensor: the backward's dx = dy @ W
                         and the "dequant" prefill mode run torch's matmul on it.

Exactness: int8 values and the e4m3 values are exact in bf16 and fp16, and so is int4's q - zero, so
x * w is exact in fp32 and the only roundings are fp32's sums and the scale products
(tolerances.matmul_sum_bound). fp32 x runs tl.dot in IEEE fp32 (no TF32), DOT_FP32; so does bf16 x
in Triton's CPU interpreter, which multiplies bf16 tiles as their bit patterns (the tests' only way
to run the bf16 tiles; on the GPU bf16 tiles go to the tensor cores as they are).

fp8 on GPUs before compute capability 8.9 (no e4m3 conversion instructions) is decoded from the bytes
(FP8_NATIVE=False): the e4m3 bits, shifted into an fp16's, are the value / 2^8 (subnormals included).
"""

from __future__ import annotations

import triton
import triton.language as tl

SCHEME_CODES = ("int8", "int4", "fp8")  # a kernel's SCHEME is the scheme's index here
TWO_23 = tl.constexpr(8388608.0)  # 2^23, the fp32 of bits 0x4B000000: 0x4B000000 | i is 2^23 + i, 0 <= i < 2^23


@triton.jit
def _e4m3_from_bytes(b):
    # e4m3 (bias 7) into fp16 (bias 15): sign to bit 15, exponent and mantissa to bits 7..14; the fp16
    # so formed is the value times 2^-8, for subnormals too (fp16 holds e4m3's smallest, 2^-9, exactly)
    h = ((b.to(tl.uint16) & 0x80) << 8) | ((b.to(tl.uint16) & 0x7F) << 7)
    return h.to(tl.float16, bitcast=True) * 256.0


@triton.jit
def _weight_tile(W, Z, rows, n_ok, k0, K, stride_wn, stride_zn, GROUP: tl.constexpr, SCHEME: tl.constexpr,
                 FP8_NATIVE: tl.constexpr, PER_TILE: tl.constexpr, DTYPE: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] weight values of rows `rows` (int64), columns k0 .. k0 + BLOCK_K - 1,
    before their scale, in DTYPE: int8 q, fp8 float(q), int4 q - zero (the tile's one zero point per
    row with PER_TILE, else each column's group's). Rows and columns past the weight read 0."""
    k = k0 + tl.arange(0, BLOCK_K)
    if SCHEME == 1:  # int4: BLOCK_K / 2 bytes per row, two values each (the even k in the low nibble)
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b = tl.load(W + rows[:, None] * stride_wn + kb[None, :], mask=n_ok[:, None] & (kb < K // 2)[None, :],
                    other=0)
        q = tl.reshape(tl.join(b & 15, b >> 4), [BLOCK_N, BLOCK_K]).to(tl.int32)
        # q (and the zero point) into fp32 through their bits, 2^23 + i, not the conversion instruction
        # (an eighth of the fp32 rate): q - zero exact, then exact in DTYPE
        q = (q | 0x4B000000).to(tl.float32, bitcast=True)
        if PER_TILE:
            z = tl.load(Z + rows * stride_zn + k0 // GROUP, mask=n_ok, other=0).to(tl.float32) + TWO_23
            w = q - z[:, None]
        else:
            z = tl.load(Z + rows[:, None] * stride_zn + (k // GROUP)[None, :],
                        mask=n_ok[:, None] & (k < K)[None, :], other=0).to(tl.int32)
            w = q - (z | 0x4B000000).to(tl.float32, bitcast=True)
        return w.to(DTYPE)
    else:
        ptrs = W + rows[:, None] * stride_wn + k[None, :]
        ok = n_ok[:, None] & (k < K)[None, :]
        # if/else, not an early return: Triton's compiler goes on past a return inside a constexpr `if`,
        # and the byte decode's `other=0` on an e4m3 pointer is a cast it refuses
        if SCHEME == 2:
            if FP8_NATIVE:
                # no `other`: Triton would cast it to e4m3, a rounding cast it refuses; masked lanes zeroed after
                w = tl.where(ok, tl.load(ptrs, mask=ok).to(DTYPE), 0.0)
            else:
                w = _e4m3_from_bytes(tl.load(ptrs, mask=ok, other=0)).to(DTYPE)
        else:
            w = tl.load(ptrs, mask=ok, other=0).to(tl.float32).to(DTYPE)
        return w


@triton.jit
def _group_scales(S, rows, n_ok, k0, K, stride_sn, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """int4's scales of columns k0 .. k0 + BLOCK_K - 1, fp32 [BLOCK_N, BLOCK_K] (each column's group's)."""
    k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(S + rows[:, None] * stride_sn + (k // GROUP)[None, :], mask=n_ok[:, None] & (k < K)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _quant_matmul_kernel(
    X, W, S, Z, B, OUT, M, N, K, k_per_split, stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    SCHEME: tl.constexpr, GROUP: tl.constexpr, FP8_NATIVE: tl.constexpr, DOT_FP32: tl.constexpr,
    PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # output tiles in groups of GROUP_M tile rows, column by column within a group: the group's programs
    # share weight tiles in L2 (GROUP_M = 1: row-major order)
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_here
    pid_n = (pid % per_group) // rows_here
    split = tl.program_id(1)

    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < M
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rows < N
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    x_rows = X + m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        # the tile in x's dtype (exact), products and sums in fp32 on the tensor cores; int4's tile lies
        # in one group (BLOCK_K <= GROUP on these paths): one zero point per row
        if DOT_FP32:
            x = x.to(tl.float32)
            w = _weight_tile(W, Z, rows, n_ok, k0, K, stride_wn, stride_zn, GROUP, SCHEME, FP8_NATIVE, True,
                             tl.float32, BLOCK_N, BLOCK_K)
            part = tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            w = _weight_tile(W, Z, rows, n_ok, k0, K, stride_wn, stride_zn, GROUP, SCHEME, FP8_NATIVE, True,
                             X.dtype.element_ty, BLOCK_N, BLOCK_K)
            part = tl.dot(x, tl.trans(w))
        if SCHEME == 1:  # one scale per row for the whole tile
            acc += part * tl.load(S + rows * stride_sn + k0 // GROUP, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        else:
            acc += part
    if SCHEME != 1:  # int8, fp8: the row's scale, once
        acc = acc * tl.load(S + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if PARTIAL:  # this K slice's fp32 sums, slice-major: OUT[split, m, n]
        out = OUT + split.to(tl.int64) * M * N + m.to(tl.int64)[:, None] * N + rows[None, :]
        tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(B + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = OUT + m.to(tl.int64)[:, None] * stride_om + rows[None, :]
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_splits_kernel(P, B, Y, M, N, n_splits, stride_ym, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # y[m, n] = sum over slices s = 0, 1, ... of P[s, m, n] (that order), + bias[n]
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(n_splits):
        acc += tl.load(P + s * M * N + offs, mask=ok, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(B + n, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + (offs // N) * stride_ym + n, acc.to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _dequant_kernel(
    W, S, Z, OUT, N, K, stride_wn, stride_sn, stride_zn,
    SCHEME: tl.constexpr, GROUP: tl.constexpr, FP8_NATIVE: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # OUT[n, k] = dequant(W)[n, k] in OUT's dtype, one [BLOCK_N, BLOCK_K] tile a program
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rows < N
    k0 = tl.program_id(1) * BLOCK_K
    k = k0 + tl.arange(0, BLOCK_K)
    w = _weight_tile(W, Z, rows, n_ok, k0, K, stride_wn, stride_zn, GROUP, SCHEME, FP8_NATIVE, False, tl.float32,
                     BLOCK_N, BLOCK_K)
    if SCHEME == 1:
        w = w * _group_scales(S, rows, n_ok, k0, K, stride_sn, GROUP, BLOCK_K)
    else:
        w = w * tl.load(S + rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(OUT + rows[:, None] * K + k[None, :], w.to(OUT.dtype.element_ty), mask=n_ok[:, None] & (k < K)[None, :])
