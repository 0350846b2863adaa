"""The gemv kernel: y[m, :] = x[m, :] @ dequant(W).T for M = 1, the path of one-token decode (one
program per row of x and block of N: a few rows read each block's weight from L2 after the first). The
weight is read once, 16 bytes a load along K, and turned into fp32 in a few full-rate instructions per
weight:

  - a tile is [BLOCK_N, CHUNKS, CB] bytes: CHUNKS runs of CB contiguous bytes per row, each run inside
    one int4 group, so the group's scale and zero point are one load per (row, run), not per weight
    (int8 and fp8: one run, the row scale applied once after the loop);
  - int4 keeps a byte's two nibbles as two tiles (the even and the odd columns of K) multiplied by x's
    even and odd columns: no interleave of the nibbles;
  - integers become fp32 through their bits, not the conversion instruction (an eighth of the fp32
    rate, which a weight-bound gemv cannot afford): the fp32 of bits 0x4B000000 | i is 2^23 + i for
    0 <= i < 2^23, so q - zero = float(bits) - (2^23 + zero), exact, is one logic op and one fp32 add;
    the high nibble stays in place, bits 4..7 under 2^19's exponent (0x49000000, a unit of 2^-4 in
    the last place): float((b & 0xF0) | 0x49000000) = 2^19 + (b >> 4), no shift;
  - each step's products are summed along K at once (int4: then scaled by their run's group scale),
    so the registers hold the step's bytes in flight (one fp32 accumulator per product slot, summed
    after the loop, takes 241 registers a thread for int8 and spills for int4 at the default tiles:
    ptxas for sm_90).

Sums are fp32 in another order than the reference's (tolerances.matmul_sum_bound); the products are
exact (x's dtype times small integers, or times e4m3 values). With K slices (PARTIAL) a program stores its
fp32 partial sums for kernels._sum_splits_kernel, else the bias is added and y stored in x's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_pytorch.ops.quant_matmul.kernels import TWO_23, _e4m3_from_bytes

_TWO_19 = tl.constexpr(524288.0)  # 2^19: bits 0x49000000, a unit in the last place of 2^-4


@triton.jit
def _gemv_kernel(
    X, W, S, Z, B, OUT, M, N, K, KB, kb_per_split, stride_xm, stride_wn, stride_sn, stride_zn, stride_om,
    SCHEME: tl.constexpr, GROUP: tl.constexpr, FP8_NATIVE: tl.constexpr, PARTIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, CB: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    # grid (M rows x N blocks, K slices), the rows of x innermost: the programs of one block of N run
    # together and read its weight once from memory. W's rows are KB bytes (int4: K / 2, two weights a
    # byte; int8 as uint8, fp8 as e4m3 or uint8); a step reads CHUNKS x CB bytes of each of BLOCK_N rows
    m = tl.program_id(0) % M
    pid_n = tl.program_id(0) // M
    split = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rows < N
    run = tl.arange(0, CHUNKS)
    col = tl.arange(0, CB)
    w_rows = W + rows[:, None, None] * stride_wn
    x_row = X + m.to(tl.int64) * stride_xm
    b_start = split * kb_per_split
    b_end = tl.minimum(b_start + kb_per_split, KB)
    acc = tl.zeros([BLOCK_N, CHUNKS], dtype=tl.float32)
    # NUM_STAGES > 1: the weight tiles of the next steps stream into shared memory (cp.async) while
    # this one is summed (a plain range is not pipelined: no tl.dot in the loop)
    for b0 in tl.range(b_start, b_end, CHUNKS * CB, num_stages=NUM_STAGES):
        kb = b0 + run[:, None] * CB + col[None, :]  # [CHUNKS, CB] byte columns
        kb_ok = kb < KB
        ok = n_ok[:, None, None] & kb_ok[None, :, :]
        if SCHEME == 1:  # int4: byte kb holds k = 2 kb (low nibble) and 2 kb + 1 (high)
            byte = tl.load(w_rows + kb[None, :, :], mask=ok, other=0).to(tl.int32)
            x_even = tl.load(x_row + 2 * kb, mask=kb_ok, other=0.0).to(tl.float32)
            x_odd = tl.load(x_row + 2 * kb + 1, mask=kb_ok, other=0.0).to(tl.float32)
            k_run = 2 * b0 + run * (2 * CB)  # each run's first k: the run lies in group k_run // GROUP
            g_ok = n_ok[:, None] & (k_run < K)[None, :]
            g = (k_run // GROUP)[None, :]
            zero = tl.load(Z + rows[:, None] * stride_zn + g, mask=g_ok, other=0).to(tl.float32)[:, :, None]
            scale = tl.load(S + rows[:, None] * stride_sn + g, mask=g_ok, other=0.0).to(tl.float32)
            # q - zero, exact: 2^23 + q_lo and 2^19 + q_hi from the bits, less 2^23 + zero and 2^19 + zero
            w_lo = (byte & 0x0F | 0x4B000000).to(tl.float32, bitcast=True) - (zero + TWO_23)
            w_hi = (byte & 0xF0 | 0x49000000).to(tl.float32, bitcast=True) - (zero + _TWO_19)
            acc += tl.sum(w_lo * x_even[None, :, :] + w_hi * x_odd[None, :, :], axis=2) * scale
        else:
            x = tl.load(x_row + kb, mask=kb_ok, other=0.0).to(tl.float32)
            if SCHEME == 0:  # the int8 read as uint8 u: u ^ 0x80 = q + 128, so q = float(bits) - (2^23 + 128)
                byte = tl.load(w_rows + kb[None, :, :], mask=ok, other=0).to(tl.int32)
                w = (byte ^ 0x4B000080).to(tl.float32, bitcast=True) - (TWO_23 + 128.0)
            elif FP8_NATIVE:  # no `other` (a rounding cast to e4m3 Triton refuses): masked lanes zeroed
                w = tl.where(ok, tl.load(w_rows + kb[None, :, :], mask=ok).to(tl.float32), 0.0)
            else:
                w = _e4m3_from_bytes(tl.load(w_rows + kb[None, :, :], mask=ok, other=0)).to(tl.float32)
            acc += tl.sum(w * x[None, :, :], axis=2)
    y = tl.sum(acc, axis=1)
    if SCHEME != 1:  # int8, fp8: the row's scale, once
        y = y * tl.load(S + rows, mask=n_ok, other=0.0).to(tl.float32)
    if PARTIAL:  # this K slice's fp32 sums, slice-major: OUT[split, m, n]
        tl.store(OUT + split.to(tl.int64) * M * N + m.to(tl.int64) * N + rows, y, mask=n_ok)
    else:
        if HAS_BIAS:
            y += tl.load(B + rows, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(OUT + m.to(tl.int64) * stride_om + rows, y.to(OUT.dtype.element_ty), mask=n_ok)


def gemv_runs(scheme: str, block_k: int, group: int) -> tuple[int, int]:
    """(CHUNKS, CB): a step of `block_k` weights as runs of CB bytes, each inside one int4 group."""
    if scheme != "int4":
        return 1, block_k
    run = min(block_k, group)  # both powers of two: a run never straddles a group
    return block_k // run, run // 2
