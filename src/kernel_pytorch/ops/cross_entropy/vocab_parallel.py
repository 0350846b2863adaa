"""One rank's part of the vocabulary-parallel linear cross-entropy: its shard's logits chunk by chunk,
as fused_linear.py computes a whole head's, with the group's statistics combined between the kernels.

Math and symbols: reference/vocab_parallel_cross_entropy.py. Shapes: x (..., H) -> N rows, the same on
every rank; the rank's weight rows W_r (V_r, H) of x's dtype, bias rows (V_r,); global targets (N,).

Per chunk of C rows (`chunk_rows` of the widest shard, without the free-memory cap: each chunk's
all-reduces pair up across the ranks, so every rank must cut the same chunks, and free memory differs
from rank to rank; a shard of V / R classes takes R times more rows per chunk than the whole head):
    logits = x_c @ W_r.T (+ b_r)               cuBLAS, into one preallocated (C, V_r) buffer
    _vocab_stats_kernel                        one read: max, sum of exponentials, target logit, logit sum
    reduce(max), reduce(sum)                   the group's lse, target logit and logit sum (2 all-reduces
                                               of C and 2-3 C fp32 values: `combine_stats`)
    _vocab_grad_kernel ("mean"/"sum")          dz over the logits, in place, for an upstream gradient of 1
    grad_x[c] = dz @ W_r,  grad_W_r (+)= dz.T @ x_c,  grad_b_r += column sums of dz      (fused_linear._Grads)
The O(N) steps between the kernels (combining the reduced statistics, each row's terms and scales, the
reduction) are reference/vocab_parallel_cross_entropy.py's torch code, one definition for every backend.
grad_x is this rank's term only: the caller all-reduces it. reduction "none": the forward computes the
loss and lse; `vocab_parallel_bwd` recomputes each chunk's logits and runs the gradient kernel with the
rows' upstream gradients (no collective there). Reducing each chunk's statistics before its gradient
keeps one logits GEMM per chunk (three GEMMs in all, as the unsharded loss), at two small all-reduces a
chunk; a shard's chunks are wide in rows, so there are few.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._activations import _exp, precise_math
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops.cross_entropy.fused_linear import (
    FusedLinearArgs,
    _Grads,
    _logits_into,
    chunk_rows,
)
from kernel_pytorch.ops.cross_entropy.kernels import _softcap
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions, row_scales, token_scales
from kernel_pytorch.reference.vocab_parallel_cross_entropy import (
    Reduce,
    VocabShard,
    combine_stats,
    reduce_loss,
    row_terms,
)


@triton.jit
def _vocab_stats_kernel(
    X, T, STATS, n_rows, n_cols, x_stride, vocab_start, ignore_index, cap,
    BLOCK: tl.constexpr, HAS_CAP: tl.constexpr, SMOOTH: tl.constexpr, PRECISE: tl.constexpr,
):
    # one program per row: STATS (4, n_rows) gets the row's max, sum of exp(z - max), target logit (0
    # when the target is another rank's class) and logit sum (SMOOTH); ignored rows -inf, 0, 0, 0
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = X + row * x_stride
    t = tl.load(T + row).to(tl.int64)
    m = tl.full([], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK], dtype=tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    zt = tl.zeros([], dtype=tl.float32)
    if t != ignore_index:
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            mask = cols < n_cols
            z = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
            if HAS_CAP:  # the cap maps the padding's -inf to -c: mask it again
                z = tl.where(mask, _softcap(z, cap, PRECISE), float("-inf"))
            m_new = tl.maximum(m, tl.max(z, axis=0))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # d stays 0 while all is -inf
            d = d * _exp(m - m_ref, PRECISE) + _exp(z - m_ref, PRECISE)
            m = m_new
            if SMOOTH:
                s += tl.where(mask, z, 0.0)
        local = t - vocab_start
        inside = (local >= 0) & (local < n_cols)
        x_t = tl.load(x_row + tl.where(inside, local, 0), mask=inside, other=0.0).to(tl.float32)
        if HAS_CAP:
            x_t = _softcap(x_t, cap, PRECISE)
        zt = tl.where(inside, x_t, 0.0)
    tl.store(STATS + row, m)
    tl.store(STATS + n_rows + row, tl.sum(d, axis=0))
    tl.store(STATS + 2 * n_rows + row, zt)
    tl.store(STATS + 3 * n_rows + row, tl.sum(s, axis=0))


@triton.jit
def _vocab_grad_kernel(
    X, T, LSE, R, Q, G, n_cols, x_stride, g_stride, vocab_start, ignore_index, smoothing, inv_vocab, z_scale, cap,
    BLOCK: tl.constexpr, HAS_CAP: tl.constexpr, SMOOTH: tl.constexpr, PRECISE: tl.constexpr,
):
    # program (row, column block): dz = (r + 2 s q lse) p - r (1 - eps) [j == t] - r eps / V, times
    # dz/dx of the cap; the target's column exists only on the rank holding it. 0 on ignored rows
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g_ptrs = G + row * g_stride + cols
    t = tl.load(T + row).to(tl.int64)
    if t != ignore_index:
        z = tl.load(X + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_CAP:
            z = _softcap(z, cap, PRECISE)
        lse = tl.load(LSE + row)
        r = tl.load(R + row)
        q = tl.load(Q + row)
        g = (r + 2.0 * z_scale * q * lse) * _exp(z - lse, PRECISE)
        g -= tl.where(cols == t - vocab_start, r * (1.0 - smoothing), 0.0)
        if SMOOTH:
            g -= r * smoothing * inv_vocab
        if HAS_CAP:
            y = z / cap
            g = g * (1.0 - y * y)
        tl.store(g_ptrs, g.to(G.dtype.element_ty), mask=mask)
    else:
        tl.store(g_ptrs, tl.zeros([BLOCK], dtype=G.dtype.element_ty), mask=mask)


_stats_kernel = Launcher(_vocab_stats_kernel)
_grad_kernel = Launcher(_vocab_grad_kernel)


class VocabParallelForward(NamedTuple):
    """What `vocab_parallel_fwd` returns."""

    loss: Tensor  # 0-d fp32, or target's shape ("none"): the whole vocabulary's loss, the same on every rank
    lse: Tensor  # (N,) fp32, 0 on ignored rows
    grad_x: Tensor | None  # x's shape and dtype: this rank's term (upstream gradient 1; None for "none")
    grad_w: Tensor | None  # (V_r, H), W's dtype
    grad_b: Tensor | None  # (V_r,), bias's dtype


def _cap(options: CrossEntropyOptions) -> float:
    return float(options.softcap) if options.softcap is not None else 1.0


def launch_stats(logits: Tensor, target: Tensor, shard: VocabShard, options: CrossEntropyOptions, *,
                 eager: bool = False) -> Tensor:
    """`_vocab_stats_kernel` on a chunk's logits (C, V_r) (unit column stride) and targets (C,) -> (4, C) fp32,
    rows as reference.vocab_parallel_cross_entropy.STATS."""
    n, v = logits.shape
    stats = torch.empty((4, n), dtype=torch.float32, device=logits.device)
    if v == 0:  # a rank holding no class: nothing to read
        stats[0].fill_(float("-inf"))
        stats[1:].zero_()
        return stats
    if n == 0:
        return stats
    config = tuning.current("cross_entropy")
    block = min(config.fwd.block, next_power_of_2(v))
    _stats_kernel((n,), logits, target, stats, n, v, logits.stride(0), shard.start, int(options.ignore_index),
                  _cap(options), BLOCK=block, HAS_CAP=options.softcap is not None,
                  SMOOTH=options.label_smoothing > 0.0, PRECISE=precise_math(logits),
                  num_warps=max(1, min(config.fwd.num_warps, block // 256)), eager=eager)
    return stats


def launch_grad(logits: Tensor, target: Tensor, lse: Tensor, r: Tensor, q: Tensor, grad: Tensor, shard: VocabShard,
                options: CrossEntropyOptions, *, eager: bool = False) -> None:
    """`_vocab_grad_kernel` into `grad` (C, V_r) (which may be `logits` itself) for the group's lse (C,) and
    the row scales r, q (C,) fp32 (reference.cross_entropy.row_scales)."""
    n, v = logits.shape
    if n == 0 or v == 0:
        return
    config = tuning.current("cross_entropy")
    block = min(config.bwd_block, next_power_of_2(v))
    _grad_kernel((n, triton.cdiv(v, block)), logits, target, lse, r, q, grad, v, logits.stride(0), grad.stride(0),
                 shard.start, int(options.ignore_index), float(options.label_smoothing), 1.0 / shard.vocab,
                 float(options.lse_square_scale), _cap(options), BLOCK=block, HAS_CAP=options.softcap is not None,
                 SMOOTH=options.label_smoothing > 0.0, PRECISE=precise_math(logits),
                 num_warps=max(1, min(config.bwd_warps, block // 256)), eager=eager)


def _setup(x: Tensor, args: FusedLinearArgs, shard: VocabShard, chunk: int | None
           ) -> tuple[Tensor, Tensor, Tensor, int]:
    """(x as (N, H) rows, flat contiguous targets, the (C, V_r) chunk buffer, rows per chunk: the same on
    every rank, module docstring)."""
    if args.ce_weight is not None:
        raise ValueError("ce_weight: the vocabulary-parallel loss takes no class weights")
    x2 = x.reshape(-1, x.shape[-1])
    t = args.target.reshape(-1).contiguous()
    if t.numel() != x2.shape[0]:
        raise ValueError(f"target has {t.numel()} elements for {x2.shape[0]} rows of x")
    n, v = x2.shape[0], args.weight.shape[0]
    c = chunk or chunk_rows(n, max(shard.widest, 1), x.element_size())
    buf = torch.empty((max(1, min(c, n)), v), dtype=x.dtype, device=x.device)
    return x2, t, buf, max(1, c)


def vocab_parallel_fwd(
    x: Tensor, args: FusedLinearArgs, shard: VocabShard, reduce: Reduce, options: CrossEntropyOptions, *,
    needs: tuple[bool, bool, bool] = (True, True, True), chunk: int | None = None, grad_w_fp32: bool = False,
    eager: bool = False,
) -> VocabParallelForward:
    """The loss and lse, and for "mean"/"sum" this rank's gradients for an upstream gradient of 1.

    Args:
        x: (..., H) fp32/bf16/fp16; args: this rank's weight (V_r, H) and bias rows, the global targets and
            token scales (no class weights). shard: this rank's classes; reduce: the group's all-reduce.
        needs: which of (grad_x, grad_w, grad_b) to compute (none for "none": `vocab_parallel_bwd`).
        chunk: rows per chunk, the same on every rank (default: module docstring).
        grad_w_fp32: accumulate grad_W in fp32.
        eager: launch directly rather than through wrap_triton.
    """
    x2, t, buf, c = _setup(x, args, shard, chunk)
    n, weight, bias = x2.shape[0], args.weight, args.bias
    rows = torch.empty(n, dtype=torch.float32, device=x.device)
    lse = torch.empty_like(rows)
    with_grad = options.reduction != "none" and any(needs)
    grads = _Grads(x2, weight, bias, needs, grad_w_fp32, eager) if with_grad else None
    if with_grad:
        r, q = row_scales(torch.ones((), device=x.device), t, None, options, torch.float32, args.token_scale)
    smoothing = bool(options.label_smoothing)
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c, t_c = x2[start:end], t[start:end]
        logits = _logits_into(buf, x_c, weight, bias)
        lse_c, zt, total = combine_stats(launch_stats(logits, t_c, shard, options, eager=eager), reduce, smoothing)
        ce, zl = row_terms(lse_c, zt, total, t_c, shard.vocab, options)
        rows[start:end] = ce + zl
        lse[start:end] = torch.where(t_c != options.ignore_index, lse_c, 0.0)
        if grads is not None:
            launch_grad(logits, t_c, lse_c, r[start:end].contiguous(), q[start:end].contiguous(), logits, shard,
                        options, eager=eager)
            grads.add_chunk(logits, x_c, start, start == 0)
    if args.token_scale is not None:
        rows = rows * token_scales(args.token_scale, n, rows)
    loss = reduce_loss(rows, args.target, options)
    gx, gw, gb = grads.result(x.shape) if grads is not None else (None, None, None)
    return VocabParallelForward(loss, lse, gx, gw, gb)


def vocab_parallel_bwd(
    dloss: Tensor, x: Tensor, args: FusedLinearArgs, shard: VocabShard, lse: Tensor, options: CrossEntropyOptions,
    *, needs: tuple[bool, bool, bool] = (True, True, True), chunk: int | None = None, grad_w_fp32: bool = False,
    eager: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """This rank's gradients for the upstream gradient `dloss` (target's shape for "none", else 0-d; the same
    on every rank) and the forward's lse, recomputing each chunk's logits; no collective.

    Returns:
        (this rank's term of grad_x, grad_w, grad_b), None where not needed (or no bias).
    """
    x2, t, buf, c = _setup(x, args, shard, chunk)
    n = x2.shape[0]
    r, q = row_scales(dloss, t, None, options, torch.float32, args.token_scale)
    grads = _Grads(x2, args.weight, args.bias, needs, grad_w_fp32, eager)
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c = x2[start:end]
        logits = _logits_into(buf, x_c, args.weight, args.bias)
        launch_grad(logits, t[start:end], lse[start:end], r[start:end].contiguous(), q[start:end].contiguous(),
                    logits, shard, options, eager=eager)
        grads.add_chunk(logits, x_c, start, start == 0)
    return grads.result(x.shape)
