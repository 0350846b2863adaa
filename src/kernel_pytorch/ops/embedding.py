"""Token embedding with a deterministic backward, registered as `kernel_pytorch::embedding_fwd` / `_bwd`:
the forward is torch's gather (already at copy speed), the backward a segment sum over the sorted token
indices, no atomics.

Math (reference/embedding.py): for weight (V, H), dy (N, H) and indices (N,) into V rows,
    y = weight[indices]
    dweight[v] = sum of dy[n] over the tokens n with indices[n] == v   (fp32, rounded once)
    zero for padding_idx; divided by the count with scale_grad_by_freq.

Plan. torch sorts the indices stably (order: token ids by index) and finds each row's run of sorted
tokens (bounds = searchsorted(sorted, 0..V)): both without a host sync. Then one kernel writes every
gradient row exactly once:
  "rows": grid (row groups, column blocks). Each program owns VROWS vocabulary rows and a
      BLOCK of columns; for each row it sums that row's tokens in sorted order, ROWS tokens per step
      into a [ROWS, BLOCK] fp32 accumulator (ROWS loads in flight: a frequent token's long run is not
      one dependent load after another), reduces it with a fixed tree and stores the row -- zeros for
      rows no token hit, so no separate memset. Fixed order, fixed tree: bitwise-reproducible.
  "segments" (the default, EmbeddingConfig.mode): zero the gradient (memset), then one program per
      sorted token position; the first position of each run sums the run and stores its row, the
      others store nothing. Writes ~N rows after the memset rather than looping over all V rows.
Measured on the H100 at V = 128256, H = 4096, N = 16384 bf16 (benchmarks/results/probes/rope/probe_rope_h100.log,
graph replay): uniform ids rows 586 us, segments 631 us, torch 1345 us; Zipf ids (one id 1427 times)
rows 1680 us, segments 876 us, torch 1045 us. "segments" is the default: it never lost to torch there,
"rows" did on skewed ids. torch's own backward was bitwise reproducible across reruns in that run too.
The launch knobs are the "embedding" tuning config (`EmbeddingConfig`).
Bytes: dy read once (N*H), the gradient written once (V*H) -- plus the memset's V*H in "segments".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import P, Strategy, all_dims, register_rules, shard
from kernel_pytorch.reference.embedding import embedding, embedding_backward


@dataclass(frozen=True)
class EmbeddingConfig:
    """The embedding backward's launch knobs (the "embedding" tuning family; the embedding section of
    benchmarks/probes/probe_rope.py sweeps them).

    Fields:
        mode: "segments" or "rows" (module docstring: "segments" never lost to torch on the H100,
            benchmarks/results/probes/rope/probe_rope_h100.log).
        block_cols: columns per program; 256 ran 4.4 ("segments") to 32 ("rows") times slower than 1024
            at H = 4096 (the same log).
        tokens_per_step: tokens summed per step (loads in flight along a run).
        vocab_rows_per_program: vocabulary rows per program in "rows" mode.
        num_warps: warps per program.
    """

    mode: str = "segments"
    block_cols: int = 1024
    tokens_per_step: int = 8
    vocab_rows_per_program: int = 4
    num_warps: int = 4


tuning.register("embedding", EmbeddingConfig())


@triton.jit
def _sum_run(DY, ORDER, start, end, stride_dy, cols, col_ok, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # sum of dy[order[start:end], cols] in fp32, ROWS tokens per step, then a fixed tree over ROWS
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for first in range(start, end, ROWS):
        k = first + tl.arange(0, ROWS)
        k_ok = k < end
        tok = tl.load(ORDER + k, mask=k_ok, other=0).to(tl.int64)
        acc += tl.load(DY + tok[:, None] * stride_dy + cols[None, :],
                       mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    return tl.sum(acc, axis=0)


@triton.jit
def _embedding_bwd_rows_kernel(
    DY, ORDER, BOUNDS, DW, stride_dy, n_rows, n_cols, padding_idx,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, VROWS: tl.constexpr,
    HAS_PADDING: tl.constexpr, SCALE_BY_FREQ: tl.constexpr,
):
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    for r in range(VROWS):
        v = tl.program_id(0).to(tl.int64) * VROWS + r
        if v < n_rows:
            start = tl.load(BOUNDS + v)
            end = tl.load(BOUNDS + v + 1)
            if HAS_PADDING:
                end = tl.where(v == padding_idx, start, end)  # the padding row's gradient is zero
            g = _sum_run(DY, ORDER, start, end, stride_dy, cols, col_ok, ROWS, BLOCK)
            if SCALE_BY_FREQ:
                g = g / tl.maximum(end - start, 1).to(tl.float32)
            tl.store(DW + v * n_cols + cols, g.to(DW.dtype.element_ty), mask=col_ok)


@triton.jit
def _embedding_bwd_segments_kernel(
    DY, ORDER, SORTED, ENDS, DW, stride_dy, n_cols, padding_idx,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, HAS_PADDING: tl.constexpr, SCALE_BY_FREQ: tl.constexpr,
):
    # program i: sorted position i; only the first position of a run writes (the run's row)
    i = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    v = tl.load(SORTED + i)
    prev = tl.load(SORTED + tl.maximum(i - 1, 0))
    head = (i == 0) | (prev != v)
    if HAS_PADDING:
        head = head & (v != padding_idx)  # the memset already left that row zero
    end = tl.where(head, tl.load(ENDS + i), i)
    g = _sum_run(DY, ORDER, i, end, stride_dy, cols, col_ok, ROWS, BLOCK)
    if SCALE_BY_FREQ:
        g = g / tl.maximum(end - i, 1).to(tl.float32)
    # (a column limit, not `col_ok & head`: a scalar-and-vector mask the CPU interpreter rejects)
    tl.store(DW + v.to(tl.int64) * n_cols + cols, g.to(DW.dtype.element_ty), mask=cols < tl.where(head, n_cols, 0))


_rows_kernel = Launcher(_embedding_bwd_rows_kernel)
_segments_kernel = Launcher(_embedding_bwd_segments_kernel)


def embedding_grad(
    dy: Tensor, indices: Tensor, num_embeddings: int, padding_idx: int | None = None,
    scale_grad_by_freq: bool = False, out_dtype: torch.dtype | None = None,
    *, mode: str | None = None, eager: bool = False, config: EmbeddingConfig | None = None,
) -> Tensor:
    """Deterministic gradient of an embedding lookup with respect to its weight.

    Args:
        dy: indices.shape + (H,) upstream gradient, fp32/bf16/fp16, CUDA (or CPU under
            TRITON_INTERPRET=1); rows may be strided (unit column stride).
        indices: integer tensor of token ids in [0, num_embeddings).
        padding_idx: a row left zero (negative counts from the end, as in torch).
        scale_grad_by_freq: divide each row by its token count.
        out_dtype: the gradient's dtype (default dy's; fp32 for fp32 master gradients).
        mode: "rows" (every row written by the kernel) or "segments" (memset, then the hit rows);
            None: the config's.
        eager: launch directly rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("embedding")`).
    Returns:
        (num_embeddings, H) gradient, each row summed in fp32 in the same order on every run.
    """
    cfg = config or tuning.current("embedding")
    mode = cfg.mode if mode is None else mode
    h = dy.shape[-1]
    dy2 = dy.reshape(-1, h)
    if dy2.stride(-1) != 1:
        dy2 = dy2.contiguous()
    flat = indices.reshape(-1)
    out_dtype = out_dtype or dy.dtype
    has_pad = padding_idx is not None
    pad = padding_idx % num_embeddings if has_pad else 0
    block = min(cfg.block_cols, next_power_of_2(h))
    col_blocks = triton.cdiv(h, block)
    stride = dy2.stride(0) if dy2.shape[0] > 1 else h
    sorted_idx, order = torch.sort(flat, stable=True)
    if mode == "segments":
        dw = torch.zeros(num_embeddings, h, dtype=out_dtype, device=dy.device)
        if flat.numel() == 0:
            return dw
        ends = torch.searchsorted(sorted_idx, sorted_idx, right=True)
        _segments_kernel(
            (flat.numel(), col_blocks), dy2, order, sorted_idx, ends, dw, stride, h, pad,
            BLOCK=block, ROWS=cfg.tokens_per_step, HAS_PADDING=has_pad, SCALE_BY_FREQ=scale_grad_by_freq,
            num_warps=cfg.num_warps, eager=eager,
        )
        return dw
    if mode != "rows":
        raise ValueError(f"mode must be 'rows' or 'segments', got {mode!r}")
    dw = torch.empty(num_embeddings, h, dtype=out_dtype, device=dy.device)
    if num_embeddings == 0:
        return dw
    queries = torch.arange(num_embeddings + 1, device=dy.device, dtype=sorted_idx.dtype)
    bounds = torch.searchsorted(sorted_idx, queries)
    _rows_kernel(
        (triton.cdiv(num_embeddings, cfg.vocab_rows_per_program), col_blocks), dy2, order, bounds, dw,
        stride, num_embeddings, h, pad,
        BLOCK=block, ROWS=cfg.tokens_per_step, VROWS=cfg.vocab_rows_per_program, HAS_PADDING=has_pad,
        SCALE_BY_FREQ=scale_grad_by_freq, num_warps=cfg.num_warps, eager=eager,
    )
    return dw


def embedding_fwd(indices: Tensor, weight: Tensor, padding_idx: int, scale_grad_by_freq: bool, *,
                  eager: bool = False) -> Tensor:
    """weight[indices]: torch's gather (one read and one write, at copy speed already). padding_idx
    (-1: none) and scale_grad_by_freq concern the backward only. Returns indices.shape + (H,)."""
    return torch.nn.functional.embedding(indices, weight)


def embedding_bwd(dy: Tensor, indices: Tensor, weight: Tensor, padding_idx: int, scale_grad_by_freq: bool, *,
                  eager: bool = False, config: EmbeddingConfig | None = None) -> Tensor:
    """The weight's gradient (`embedding_grad` in the config's mode): weight.shape, weight's dtype;
    padding_idx is a row in [0, V) or -1 for none."""
    pad = padding_idx if padding_idx >= 0 else None
    return embedding_grad(dy, indices, weight.shape[0], pad, scale_grad_by_freq, weight.dtype, eager=eager,
                          config=config)


def _fwd_reference(indices: Tensor, weight: Tensor, padding_idx: int, scale_grad_by_freq: bool) -> Tensor:
    return embedding(indices, weight)


def _bwd_reference(dy: Tensor, indices: Tensor, weight: Tensor, padding_idx: int, scale_grad_by_freq: bool) -> Tensor:
    pad = padding_idx if padding_idx >= 0 else None
    return embedding_backward(dy, indices, weight.shape[0], pad, scale_grad_by_freq, weight.dtype)


def _bwd_fake(dy: Tensor, indices: Tensor, weight: Tensor, padding_idx: int, scale_grad_by_freq: bool) -> Tensor:
    return torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)


# kernel_pytorch::embedding_fwd (indices, weight, padding_idx, scale_grad_by_freq) -> y and embedding_bwd
# (dy, indices, weight, padding_idx, scale_grad_by_freq) -> dweight; weight is saved for its shape and
# dtype only (no copy); embedding_eager(same arguments as embedding_fwd) -> y
embedding_fwd_op, embedding_bwd_op, embedding_eager = register_op(
    "embedding",
    Impl(embedding_fwd, _fwd_reference, "reference", outputs=("y",)),
    Impl(embedding_bwd, _bwd_reference, _bwd_fake, outputs=("dweight",)),
    differentiable=("y",),
    save=("indices", "weight"),
    keep=("padding_idx", "scale_grad_by_freq"),
    grads={"weight": "dweight"},
)


# DTensor (ops/_common/sharding.py): a batch (indices sharded on any dim, the table Replicate; its gradient a
# Partial sum, except with scale_grad_by_freq, whose counts span the batch) or the table's columns (Shard(1),
# indices Replicate). A vocabulary-sharded table (Shard(0), tensor parallelism's row-wise embedding) needs
# the ids outside a rank's rows masked before the lookup and their rows zeroed after it, in the forward and
# in the backward; a sharding rule runs the op on the local shards as they are, so that case is
# functional.embedding's (a masked lookup of the local rows returning a Partial sum).
def _fwd_rule(a: object) -> list[Strategy]:
    batch = [Strategy((shard(d),), {"indices": shard(d)}) for d in all_dims(a.indices)]
    return [*batch, Strategy((shard(a.indices.ndim),), {"weight": shard(1)})]


def _bwd_rule(a: object) -> list[Strategy]:
    batch = [] if a.scale_grad_by_freq else [Strategy((P,), {"dy": shard(d), "indices": shard(d)})
                                             for d in all_dims(a.indices)]
    return [*batch, Strategy((shard(1),), {"dy": shard(a.dy.ndim - 1), "weight": shard(1)})]


register_rules(
    "embedding", _fwd_rule, _bwd_rule,
    "the indices are sharded (a batch; not with scale_grad_by_freq) with the weight Replicate, or the weight "
    "is sharded on its columns (Shard(1)) with the indices Replicate; a vocabulary-sharded weight (Shard(0)) "
    "runs through kernel_pytorch.functional.embedding",
)
