"""The flat kernel for rotary embeddings (RopeConfig.schedule's default): a 1-D grid over the rows (one
head of one token, D features) of q and then of k, for q, k and their outputs each a dense tensor in
(B, H, T, D) or (B, T, H, D) memory order; `plan` returns None for any other strides (plan.py then runs
the config's fallback kernel).

Each program rotates ROWS = FlatConfig.elements / D consecutive rows: one contiguous run of memory,
loaded and stored as wide vectors. A row's token t (and batch b, for cos/sin rows with a batch dim or
position ids) comes from its index by integer division by the layout's sizes, once per row. Pairs:
rotate-half loads every feature's partner (j + r/2 mod r) a second time from the same cache lines
(FlatConfig.partner); interleaved splits one load into even/odd lanes. The math is math.py's
(`_partner_outputs`, `_pair_outputs`). This is the shape of torch.compile's pointwise kernel, which
reached ~95% of the copy bandwidth on an H200 where the tile kernel reached ~78%
(benchmarks/results/probes/rope/probe_rope_variants_h200.log). Measured on the H200
(benchmarks/results/rope_h200.md, 2026-11-28), q + k fwd+bwd in graph replay: rotate-half 92.7% of copy
(torch.compile 91.4%), interleaved 95.1% (compile 73.7%); rotate-half's forward alone (90.4% against
compile's 95.4%) is where it trails.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops.rope.call import Flags, Operands
from kernel_pytorch.ops.rope.config import FlatConfig
from kernel_pytorch.ops.rope.math import _cos_sin_rows, _cs, _pair_outputs, _partner_outputs


@triton.jit
def _rope_rows(
    X, XO, COS, SIN, POS, r0, n_rows, row_div, rows_per_batch, seq_len, scb, sct, ssb, sst, spb, spt,
    n_positions, z,
    D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_POS: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr, HF_ROUNDING: tl.constexpr,
    HALVES: tl.constexpr, EVICT: tl.constexpr,
):
    # rows r0 .. r0 + ROWS - 1 of one dense tensor; row r is (b, t) = (r // rows_per_batch,
    # (r // row_div) % seq_len): row_div is 1 for (B, H, T, D) memory, H for (B, T, H, D)
    r = r0 + tl.arange(0, ROWS)[:, None]
    ok = r < n_rows
    t = ((r // row_div) % seq_len).to(tl.int64)
    b = (r // rows_per_batch).to(tl.int64)
    limit, c_row, s_row = _cos_sin_rows(COS, SIN, POS, b, t, ok, HALF, n_positions, scb, sct, ssb, sst, spb, spt,
                                        HAS_POS)
    j = tl.arange(0, BLOCK_D)[None, :]
    base = r.to(tl.int64) * D  # int64: q may hold 2^31 elements or more
    offs = base + j
    m = ok & (j < D)
    rot = j < 2 * HALF
    DTYPE_IN = X.dtype.element_ty
    DTYPE = XO.dtype.element_ty
    x_raw = tl.load(X + offs, mask=m, other=0.0)
    x = x_raw.to(tl.float32)
    cm = j < 2 * limit
    if INTERLEAVED:  # even/odd lanes of the one load: neighbours in one thread's registers
        x1, x2 = tl.split(tl.reshape(x, [ROWS, BLOCK_D // 2, 2]))
        c = tl.load(c_row + j, mask=cm, other=float("nan"), eviction_policy=EVICT)
        s = tl.load(s_row + j, mask=cm, other=float("nan"), eviction_policy=EVICT)
        c1, c2 = tl.split(tl.reshape(_cs(c, DTYPE_IN, HF_ROUNDING), [ROWS, BLOCK_D // 2, 2]))
        s1, s2 = tl.split(tl.reshape(_cs(s, DTYPE_IN, HF_ROUNDING), [ROWS, BLOCK_D // 2, 2]))
        y1, y2 = _pair_outputs(x1, x2, c1, c2, s1, s2, z, DTYPE, BACKWARD, HF_ROUNDING)
        y = tl.reshape(tl.join(y1, y2), [ROWS, BLOCK_D])
    else:  # each feature's partner, a second load from the same lines; the modulo keeps it in the row
        # (features past r read some rotary feature, unused) and lets the compiler see contiguous runs
        first = j < HALF
        p = (j + HALF) % (2 * HALF)
        if HALVES:  # two loads, each contiguous within its half (features past r read nothing)
            xp = tl.where(first, tl.load(X + base + j + HALF, mask=m & first, other=0.0),
                          tl.load(X + base + j - HALF, mask=m & ~first & rot, other=0.0)).to(tl.float32)
        else:
            xp = tl.load(X + base + p, mask=m, other=0.0).to(tl.float32)
        y = _partner_outputs(x, xp, first, c_row, s_row, j, p, cm, z, DTYPE_IN, DTYPE, BACKWARD, HF_ROUNDING,
                             EVICT)
    y = tl.where(rot, y.to(DTYPE), x_raw.to(DTYPE))
    if COPY_PASS:
        tl.store(XO + offs, y, mask=m)
    else:  # in place: the pass-through features are left as they are
        tl.store(XO + offs, y, mask=m & rot)


@triton.jit
def _rope_flat_kernel(
    Q, K, QO, KO, COS, SIN, POS,
    rows_q, rows_k, div_q, div_k, per_batch_q, per_batch_k, seq_len,
    scb, sct, ssb, sst, spb, spt, n_positions, neg_zero, q_programs,
    D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_POS: tl.constexpr, COPY_PASS: tl.constexpr, BACKWARD: tl.constexpr, HF_ROUNDING: tl.constexpr,
    HALVES: tl.constexpr, EVICT: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < q_programs:
        _rope_rows(Q, QO, COS, SIN, POS, pid * ROWS, rows_q, div_q, per_batch_q, seq_len, scb, sct, ssb, sst,
                   spb, spt, n_positions, neg_zero, D, HALF, ROWS, BLOCK_D, INTERLEAVED, HAS_POS, COPY_PASS,
                   BACKWARD, HF_ROUNDING, HALVES, EVICT)
    else:
        _rope_rows(K, KO, COS, SIN, POS, (pid - q_programs) * ROWS, rows_k, div_k, per_batch_k, seq_len, scb,
                   sct, ssb, sst, spb, spt, n_positions, neg_zero, D, HALF, ROWS, BLOCK_D, INTERLEAVED, HAS_POS,
                   COPY_PASS, BACKWARD, HF_ROUNDING, HALVES, EVICT)


_kernel = Launcher(_rope_flat_kernel)


def row_divisor(x: Tensor, unsqueeze_dim: int) -> int | None:
    """How a dense q or k numbers its rows: 1 when its memory is (B, H, T, D) order (row = (b, h, t)),
    H when (B, T, H, D) order (row = (b, t, h)); None when it is neither (a view of a fused QKV, a
    slice, a unit feature stride missing). Strides of size-1 dims are ignored."""
    s = x.stride()
    b, h, t, d = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]) if unsqueeze_dim == 1 else \
        (x.shape[0], x.shape[2], x.shape[1], x.shape[3])
    sb, sh, st, sd = (s[0], s[1], s[2], s[3]) if unsqueeze_dim == 1 else (s[0], s[2], s[1], s[3])

    def dense(*pairs: tuple[int, int, int]) -> bool:
        return all(size == 1 or stride == want for size, stride, want in pairs)

    if dense((d, sd, 1), (t, st, d), (h, sh, t * d), (b, sb, h * t * d)):
        return 1
    if dense((d, sd, 1), (h, sh, d), (t, st, h * d), (b, sb, t * h * d)):
        return h
    return None


def plan(
    ops: Operands, unsqueeze_dim: int, half: int, strides: tuple[int, ...], n_positions: int, flags: Flags,
    config: FlatConfig,
) -> tuple[Launcher, tuple[int, ...], tuple, dict] | None:
    """The flat kernel's launch for plan.py: (kernel, grid, the scalar arguments after the tensors,
    the constexprs and warps), or None where q, k or an output is not dense in one of the two orders
    (or an output's order differs from its input's).

    Args:
        ops: q, k: (B, H, T, D) (unsqueeze_dim=1) or (B, T, H, D); qo, ko: the outputs (q and k in place).
        half: r / 2 rotary pairs per row.
        strides: (scb, sct, ssb, sst, spb, spt), cos/sin's (batch, row) strides and position ids'.
    """
    q, k, qo, ko = ops.q, ops.k, ops.qo, ops.ko
    div_q, div_k = row_divisor(q, unsqueeze_dim), row_divisor(k, unsqueeze_dim)
    if div_q is None or div_k is None or row_divisor(qo, unsqueeze_dim) != div_q \
            or row_divisor(ko, unsqueeze_dim) != div_k:
        return None
    batch, seq_len, d = q.shape[0], q.shape[3 - unsqueeze_dim], q.shape[-1]
    heads_q, heads_k = q.shape[unsqueeze_dim], k.shape[unsqueeze_dim]
    rows_q, rows_k = batch * heads_q * seq_len, batch * heads_k * seq_len
    if rows_q + rows_k >= 2**31:  # row indices are int32
        return None
    block_d = next_power_of_2(d)
    rows = max(1, config.elements // block_d)
    q_programs = triton.cdiv(rows_q, rows)
    grid = (q_programs + triton.cdiv(rows_k, rows),)
    meta = dict(D=d, HALF=half, ROWS=rows, BLOCK_D=block_d, **flags.meta(), HALVES=config.partner == "halves",
                EVICT=config.evict_tables, num_warps=config.num_warps)
    scalars = (rows_q, rows_k, div_q, div_k, heads_q * seq_len, heads_k * seq_len, seq_len, *strides,
               n_positions, -0.0, q_programs)
    return _kernel, grid, scalars, meta
