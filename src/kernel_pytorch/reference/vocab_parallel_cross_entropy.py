"""Vocabulary-parallel linear + cross-entropy: reference/fused_linear_cross_entropy.py's loss with the
LM head's weight split by rows (classes) over the R ranks of a group, no rank ever holding all the logits.

Rank r holds classes [a_r, a_r + V_r) of V: weight rows W_r (V_r, H), bias rows b_r (V_r,) where there
is a bias. Every rank holds the same rows x (..., H) -> N and targets t (N,). Per row i, with
z_ij = softcap(x_i . W_j + b_j) (the logits in x's dtype, then fp32 math, as reference/cross_entropy.py):

    each rank, its V_r columns:     m_r = max_j z_ij,   S_r = sum_j exp(z_ij - m_r),
                                    T_r = z_i,t_i where a_r <= t_i < a_r + V_r, else 0,   Z_r = sum_j z_ij
    all-reduce 1, max, (N,):        M = max_r m_r
    all-reduce 2, sum, (2 or 3, N): S = sum_r S_r exp(m_r - M),   T = sum_r T_r,   Z = sum_r Z_r (smoothing only)
    lse = M + log S
    ce_i = (1 - eps) (lse_i - T_i) + eps (lse_i - Z_i / V),   zl_i = s lse_i^2      (0 on ignored rows)

which is reference/cross_entropy.py's loss without class weights: token scales u and the reductions as
there. The mean's divisor, the number of valid rows, every rank reads from the targets it holds: no
collective. Two all-reduces of O(N) values is what the math needs (the max must be known before the
exponentials are summed against it); the logits stay where they were computed.

Gradient, each rank its own columns, with p_ij = exp(z_ij - lse_i) and the row scales (r_i, q_i) of
reference/cross_entropy.row_scales (no class weights: the mean divides both by the valid rows):

    dz_ij = r_i (p_ij - (1 - eps) [a_r + j == t_i] - eps / V) + q_i 2 s lse_i p_ij,   times 1 - (z_ij / c)^2
    dx = sum_r dz_r @ W_r               each rank's product is one term: the caller all-reduces it
    dW_r = dz_r^T x,  db_r = sum_i dz_r,i    the rank's own rows: nothing to reduce

dz is rounded to x's dtype before its products, as reference/fused_linear_cross_entropy.py does.

The collectives are the caller's: `reduce(tensor, op)` all-reduces over the group ("max" or "sum") and
returns the result (functional/vocab_parallel_cross_entropy.py passes functional collectives; one
process passes the identity). Rows are taken `chunk` at a time (all at once by default): each chunk's
statistics are reduced before its gradient is formed, so the reductions are two per chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc, acc_dtype
from kernel_pytorch.reference.cross_entropy import (
    DEFAULT_OPTIONS,
    REDUCTIONS,
    CrossEntropyOptions,
    apply_softcap,
    row_scales,
    token_scales,
)

# reduce(tensor, op): the all-reduce of `tensor` over the vocabulary's group, op "max" or "sum"; a new tensor
Reduce = Callable[[Tensor, str], Tensor]
# The rows of the statistics a rank computes per row of logits (`shard_stats`): its max, its sum of
# exponentials against that max, its target logit (0 where the target is not its class) and its logit sum.
STATS = ("max", "sumexp", "target", "total")


def no_reduce(t: Tensor, op: str) -> Tensor:
    """The all-reduce of a group of one."""
    return t


class VocabShard(NamedTuple):
    """Which classes a rank holds: rows [start, start + size) of a vocabulary of `vocab` classes, split so
    that no rank holds more than `widest` (what sizes the chunks, alike on every rank)."""

    start: int
    size: int
    vocab: int
    widest: int


def shard_range(vocab: int, world: int, rank: int) -> VocabShard:
    """Rank `rank`'s classes under torch's Shard(0) split (torch.chunk): ceil(V / R) rows per rank, the
    last ranks fewer, or none (37 over 4: 10, 10, 10, 7; 5 over 4: 2, 2, 1, 0)."""
    full = -(-vocab // world)
    start = min(rank * full, vocab)
    return VocabShard(start, max(0, min(full, vocab - start)), vocab, full)


def shard_logits(x2: Tensor, weight: Tensor, bias: Tensor | None, softcap: float | None) -> Tensor:
    """z (C, V_r): the shard's logits in x's dtype, then in the accumulation dtype and soft-capped."""
    return apply_softcap(acc(torch.nn.functional.linear(x2, weight, bias)), softcap)


def _local_target(target: Tensor, shard: VocabShard, ignore_index: int) -> tuple[Tensor, Tensor, Tensor]:
    """(valid (C,), whether the target is one of the shard's classes (C,), its column there or 0 (C,))."""
    t = target.reshape(-1).long()
    valid = t != ignore_index
    local = t - shard.start
    inside = valid & (local >= 0) & (local < shard.size)
    return valid, inside, torch.where(inside, local, 0)


def shard_stats(z: Tensor, target: Tensor, shard: VocabShard, options: CrossEntropyOptions = DEFAULT_OPTIONS
                ) -> Tensor:
    """A rank's statistics of its logits, (4, C) in z's dtype, rows as STATS (module docstring). A row of
    only -inf (or a shard of no class) has max -inf and sum 0."""
    c = z.shape[0]
    if z.shape[1] == 0:
        stats = torch.zeros(4, c, dtype=z.dtype, device=z.device)
        stats[0] = float("-inf")
        return stats
    m = z.amax(-1)
    ref = torch.where(m == float("-inf"), 0.0, m)
    sumexp = torch.exp(z - ref.unsqueeze(1)).sum(-1)
    _, inside, col = _local_target(target, shard, options.ignore_index)
    zt = torch.where(inside, z.gather(1, col.unsqueeze(1)).squeeze(1), 0.0)
    total = z.sum(-1) if options.label_smoothing else torch.zeros_like(m)
    return torch.stack((m, sumexp, zt, total))


def combine_stats(stats: Tensor, reduce: Reduce, smoothing: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """The group's (lse, target logit, logit sum or None) of each row (C,) from every rank's `shard_stats`:
    the module docstring's two all-reduces (the logit sum only with smoothing)."""
    m = stats[0]
    big = reduce(m, "max")
    ref = torch.where(big == float("-inf"), 0.0, big)  # no class anywhere above -inf: every term is 0
    k = 3 if smoothing else 2
    sums = reduce(torch.cat(((stats[1] * torch.exp(m - ref)).unsqueeze(0), stats[2:k + 1])), "sum")
    return ref + torch.log(sums[0]), sums[1], sums[2] if smoothing else None


def row_terms(lse: Tensor, zt: Tensor, total: Tensor | None, target: Tensor, vocab: int,
              options: CrossEntropyOptions) -> tuple[Tensor, Tensor]:
    """(ce, zl) of each row (C,) from the group's statistics, 0 on ignored rows (module docstring)."""
    eps = options.label_smoothing
    ce = (1.0 - eps) * (lse - zt)
    if eps:
        ce = ce + eps * (lse - total / vocab)
    valid = target.reshape(-1) != options.ignore_index
    zero = torch.zeros((), dtype=lse.dtype, device=lse.device)
    return torch.where(valid, ce, zero), torch.where(valid, options.lse_square_scale * lse * lse, zero)


def reduce_loss(rows: Tensor, target: Tensor, options: CrossEntropyOptions) -> Tensor:
    """The loss from each row's u (ce + zl) (N,): per row ("none", target's shape), their sum, or their
    sum over the number of valid rows ("mean"; 0/0 = NaN when there is none, as in torch)."""
    if options.reduction == "none":
        return rows.reshape(target.shape)
    if options.reduction == "sum":
        return rows.sum()
    if options.reduction != "mean":
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {options.reduction!r})")
    return rows.sum() / (target != options.ignore_index).sum().to(rows.dtype)


def shard_grad(z: Tensor, target: Tensor, lse: Tensor, r: Tensor, q: Tensor, shard: VocabShard,
               options: CrossEntropyOptions = DEFAULT_OPTIONS) -> Tensor:
    """dz (C, V_r) in z's dtype for the group's lse (C,) and the row scales r, q (C,), 0 on ignored rows
    (module docstring; dz/dx of the soft-cap included)."""
    eps, cap = options.label_smoothing, options.softcap
    valid, inside, col = _local_target(target, shard, options.ignore_index)
    p = torch.exp(z - lse.unsqueeze(1))
    g = (r + 2.0 * options.lse_square_scale * q * lse).unsqueeze(1) * p
    cols = torch.arange(z.shape[1], device=z.device)
    hit = (cols == col.unsqueeze(1)) & inside.unsqueeze(1)  # the target's column, where it is this shard's
    g = g - torch.where(hit, (r * (1.0 - eps)).unsqueeze(1), 0.0)
    if eps:
        g = g - (r * eps / shard.vocab).unsqueeze(1)
    if cap is not None:
        g = g * (1.0 - (z / cap) ** 2)
    return torch.where(valid.unsqueeze(1), g, torch.zeros((), dtype=z.dtype, device=z.device))


def _chunks(n: int, chunk: int | None) -> range:
    return range(0, n, max(1, chunk or n))


def vocab_parallel_linear_cross_entropy(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, *, shard: VocabShard,
    reduce: Reduce = no_reduce, options: CrossEntropyOptions = DEFAULT_OPTIONS, token_scale: Tensor | None = None,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The loss over the whole vocabulary from this rank's shard, and each row's lse.

    Args:
        x: (..., H), the same on every rank; weight: (V_r, H) this rank's rows, x's dtype; bias: (V_r,) or None.
        target: (...) global class indices; shard: this rank's classes; reduce: the group's all-reduce.
        options: as reference/cross_entropy.py (class weights and the return_* flags are not read).
        token_scale: (...) of target's shape or None; chunk: rows per step (None: all).
    Returns:
        (loss: 0-d, or target's shape for "none"; lse (N,), 0 on ignored rows), in the accumulation dtype.
    """
    x2, t = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    n, dtype = x2.shape[0], acc_dtype(x.dtype)
    lse = torch.zeros(n, dtype=dtype, device=x.device)
    rows = torch.zeros(n, dtype=dtype, device=x.device)
    for s in _chunks(n, chunk):
        e = min(s + (chunk or n), n)
        z = shard_logits(x2[s:e], weight, bias, options.softcap)
        lse_c, zt, total = combine_stats(shard_stats(z, t[s:e], shard, options), reduce, bool(options.label_smoothing))
        ce, zl = row_terms(lse_c, zt, total, t[s:e], shard.vocab, options)
        rows[s:e] = ce + zl
        lse[s:e] = torch.where(t[s:e] != options.ignore_index, lse_c, 0.0)
    if token_scale is not None:
        rows = rows * token_scales(token_scale, n, rows)
    return reduce_loss(rows, target, options), lse


def vocab_parallel_linear_cross_entropy_backward(
    dloss: Tensor, x: Tensor, weight: Tensor, target: Tensor, lse: Tensor, bias: Tensor | None = None, *,
    shard: VocabShard, options: CrossEntropyOptions = DEFAULT_OPTIONS, token_scale: Tensor | None = None,
    chunk: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """This rank's gradients for the upstream gradient `dloss` (the same on every rank) and the forward's
    lse, recomputing its logits chunk by chunk; no collective.

    Returns:
        (this rank's term of dx, x's shape: the caller sums it over the group; dW (V_r, H); db (V_r,) or
        None), each in its input's dtype.
    """
    x2, t = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    n = x2.shape[0]
    r, q = row_scales(dloss, target, None, options, acc_dtype(x.dtype), token_scale)
    dx = torch.empty_like(x2)
    dw = torch.zeros(weight.shape, dtype=acc_dtype(weight.dtype), device=weight.device)
    db = torch.zeros(weight.shape[0], dtype=acc_dtype(x.dtype), device=x.device) if bias is not None else None
    for s in _chunks(n, chunk):
        e = min(s + (chunk or n), n)
        z = shard_logits(x2[s:e], weight, bias, options.softcap)
        g = shard_grad(z, t[s:e], lse[s:e].to(z.dtype), r[s:e], q[s:e], shard, options).to(x.dtype)
        dx[s:e] = g @ weight
        dw += acc(g.t() @ x2[s:e])
        if db is not None:
            db += acc(g).sum(0)
    return (dx.reshape(x.shape), dw.to(weight.dtype),
            db.to(bias.dtype) if db is not None else None)
