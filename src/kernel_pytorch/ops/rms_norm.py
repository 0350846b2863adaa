"""RMSNorm forward and backward kernels, registered as `kernel_pytorch::rms_norm_fwd` / `_bwd`.

Math (see reference/rms_norm.py, the specification), for x (rows, D) and weight (D,):
    rstd = 1/sqrt(mean(x^2) + eps);  x_hat = x * rstd;  y = x_hat * (offset + weight)
    dx = rstd * (g - x_hat * mean(g * x_hat)),  g = dy * (offset + weight)
    dweight = sum_rows dy * x_hat
casting="llama" rounds x_hat to x's dtype before the weight (and dweight sees it so rounded);
"gemma" and "torch" round y once at the end; "none" rounds rstd, x_hat, offset + w and y to x's dtype
(the constexpr IN_DTYPE). The kernels take it as the constexpr ROUND_NORMED, which
changes nothing else: the llama kernels are the ones measured in docs/performance.md.

Forward: one program per row; rstd (fp32, one per row) is saved for the backward.
Backward, row mode (the row fits in registers): a persistent grid of one program per SM walks
tiles of rows; each program keeps its dweight partial in fp32 registers and writes it once.
Backward, split mode (wider rows): a statistics pass writes each row's sum of g * x_hat per column
chunk, then a column pass gives each program a column block of a group of rows, so the partials are
one row per group. Either way the partials are summed in a second, fixed-order reduction
(ops/_common/partials.py): no atomics, bitwise-reproducible.
Launch choices (elements per thread, backward tilings, the row schedules' limits): the "norm" tuning
config, ops/norm_config.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops._common.partials import sum_partials
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.rows import as_rows, row_launch, row_schedule, row_stride, split_schedule
from kernel_pytorch.ops._common.sharding import register_rules, rowwise
from kernel_pytorch.ops._common.tiles import (
    chunk_dy_x,
    chunk_sums,
    first_loads,
    load_rows,
    row_step,
    split_block,
    split_step,
)
from kernel_pytorch.ops.norm_config import NormConfig
from kernel_pytorch.reference._math import acc_dtype
from kernel_pytorch.reference.rms_norm import rms_norm_backward, rms_norm_from_rstd, rms_norm_rstd, rounds_normed


@triton.jit
def _normed(x, w, rstd, DTYPE: tl.constexpr, ROUND_NORMED: tl.constexpr, IN_DTYPE: tl.constexpr):
    """(x_hat, offset + w) as the casting multiplies them (fp32 values, rounded to DTYPE where it rounds)."""
    if IN_DTYPE:
        x_hat = (x * rstd.to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
        w = w.to(DTYPE).to(tl.float32)
    elif ROUND_NORMED:
        x_hat = (x * rstd).to(DTYPE).to(tl.float32)
    else:
        x_hat = x * rstd
    return x_hat, w


@triton.jit
def _dw_normed(x, x_hat, rstd, DTYPE: tl.constexpr, ROUND_NORMED: tl.constexpr, IN_DTYPE: tl.constexpr):
    """The x_hat the forward multiplied by the weight, which dweight sums (fp32 values)."""
    if IN_DTYPE:
        return (x * rstd.to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    elif ROUND_NORMED:
        return x_hat.to(DTYPE).to(tl.float32)
    else:
        return x_hat


@triton.jit
def _rms_norm_fwd_kernel(
    X, R, H, W, Y, RSTD,
    stride_x, stride_r, stride_y, n_cols, eps, offset,
    BLOCK: tl.constexpr, SINGLE_PASS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROUND_NORMED: tl.constexpr = True,
    IN_DTYPE: tl.constexpr = False,
):
    # HAS_RESIDUAL: normalise h = (x + r) rounded to x's dtype, and write h (contiguous, like Y)
    # ROUND_NORMED (casting="llama"): round x_hat to Y's dtype before the weight, as HF Llama does;
    # IN_DTYPE (casting="none"): rstd, x * rstd, offset + w and y each rounded to Y's dtype;
    # otherwise (torch, Gemma) y is rounded once, at the store
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        # issue the weight load with x's, not after the reduction: its latency then hides behind x's
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
        if HAS_RESIDUAL:
            r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            x = (x + r.to(tl.float32)).to(H.dtype.element_ty)
            tl.store(H + row * stride_y + cols, x, mask=mask)
            x = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        x_hat, w = _normed(x, w, rstd, Y.dtype.element_ty, ROUND_NORMED, IN_DTYPE)
        tl.store(y_row + cols, (x_hat * w).to(Y.dtype.element_ty), mask=mask)
    else:
        # the row does not fit in registers: one pass for the sum of squares, one to normalise
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
                x = (x + r.to(tl.float32)).to(H.dtype.element_ty)
                tl.store(H + row * stride_y + cols, x, mask=mask)
                x = x.to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        if HAS_RESIDUAL:
            # the second pass reads the sum back instead of adding again; the barrier orders the
            # first pass's stores before those loads across the program's threads
            tl.debug_barrier()
            x_row = H + row * stride_y
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + offset
            x_hat, w = _normed(x, w, rstd, Y.dtype.element_ty, ROUND_NORMED, IN_DTYPE)
            tl.store(y_row + cols, (x_hat * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    DY, X, W, RSTD, DRES, DX, DW_PART,
    stride_dy, stride_x, stride_dres, stride_dx, n_rows, n_cols, offset,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, HAS_DRES: tl.constexpr, PREFETCH: tl.constexpr,
    ROUND_NORMED: tl.constexpr = True, IN_DTYPE: tl.constexpr = False,
):
    # Row mode: the whole row fits in BLOCK. Program pid walks tiles pid, pid + G, ... of ROWS rows.
    # HAS_DRES: dx += dres, the gradient reaching the residual stream directly (fused add+norm)
    # ROUND_NORMED (casting="llama"): dweight takes x_hat rounded to X's dtype, as that forward used it
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    # software pipelining by hand (PREFETCH): ops/_common/tiles.py's walk
    dy_next, x_next = first_loads(DY, X, pid * ROWS, n_rows, stride_dy, stride_x, cols, col_ok, ROWS, PREFETCH)
    for tile in range(pid, tl.cdiv(n_rows, ROWS), n_progs):
        rows, row_ok, dy, x, dy_next, x_next = row_step(
            DY, X, tile, n_progs, n_rows, dy_next, x_next, stride_dy, stride_x, cols, col_ok, ROWS, PREFETCH,
        )
        rstd = tl.load(RSTD + rows)[:, None]
        if HAS_DRES:  # issued before the reduction so its latency overlaps the math
            dres = load_rows(DRES, rows, stride_dres, cols, col_ok).to(tl.float32)
        x_hat = x * rstd
        x_w = _dw_normed(x, x_hat, rstd, X.dtype.element_ty, ROUND_NORMED, IN_DTYPE)
        dw_acc += tl.where(row_ok[:, None], dy * x_w, 0.0)
        g = dy * w[None, :]
        c = tl.sum(g * x_hat, axis=1)[:, None] / n_cols
        dx = (g - x_hat * c) * rstd
        if HAS_DRES:
            dx += dres
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
    tl.store(DW_PART + pid.to(tl.int64) * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


@triton.jit
def _rms_norm_bwd_stats_kernel(
    DY, X, W, RSTD, STATS, stride_dy, stride_x, n_cols, n_chunks, offset, BLOCK: tl.constexpr,
):
    # Split mode, first pass: STATS[row, chunk] = sum over the chunk's columns of g * x_hat
    row, cols, ok, dy, x = chunk_dy_x(DY, X, stride_dy, stride_x, n_cols, BLOCK)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32) + offset
    tl.store(STATS + row * n_chunks + tl.program_id(1), tl.sum(dy * w * x, axis=0) * tl.load(RSTD + row))


@triton.jit
def _rms_norm_bwd_cols_kernel(
    DY, X, W, RSTD, STATS, DRES, DX, DW_PART,
    stride_dy, stride_x, stride_dres, stride_dx, n_rows, n_cols, n_chunks, rows_per_group, offset,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, CHUNKS: tl.constexpr, HAS_DRES: tl.constexpr,
    ROUND_NORMED: tl.constexpr = True, IN_DTYPE: tl.constexpr = False,
):
    # Split mode, second pass: program (i, k) owns columns i*BLOCK.. of rows k*rows_per_group..,
    # walks them in tiles of ROWS rows (prefetching the next tile) and writes its weight-gradient
    # partial row k once at the end; ROUND_NORMED as in the row-mode kernel
    cols, col_ok, start, end = split_block(n_rows, n_cols, rows_per_group, BLOCK)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    dy_next, x_next = first_loads(DY, X, start, end, stride_dy, stride_x, cols, col_ok, ROWS, True)
    for first in range(start, end, ROWS):
        rows, row_ok, dy, x, dy_next, x_next = split_step(
            DY, X, first, end, dy_next, x_next, stride_dy, stride_x, cols, col_ok, ROWS,
        )
        rstd = tl.load(RSTD + rows)[:, None]
        c = chunk_sums(STATS, rows, n_chunks, CHUNKS) / n_cols  # the row's sum from its chunks
        x_hat = x * rstd
        x_w = _dw_normed(x, x_hat, rstd, X.dtype.element_ty, ROUND_NORMED, IN_DTYPE)
        dw_acc += tl.where(row_ok[:, None], dy * x_w, 0.0)
        dx = (dy * w[None, :] - x_hat * c) * rstd
        if HAS_DRES:
            dx += load_rows(DRES, rows, stride_dres, cols, col_ok).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
    tl.store(DW_PART + tl.program_id(1).to(tl.int64) * n_cols + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


_fwd_kernel = Launcher(_rms_norm_fwd_kernel)
_bwd_kernel = Launcher(_rms_norm_bwd_kernel)
_bwd_stats_kernel = Launcher(_rms_norm_bwd_stats_kernel)
_bwd_cols_kernel = Launcher(_rms_norm_bwd_cols_kernel)


def rms_norm_fwd(
    x: Tensor, weight: Tensor, eps: float, offset: float, casting: str = "llama",
    residual: Tensor | None = None, *, eager: bool = False, config: NormConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the forward kernel.

    Args:
        x: (..., D) CUDA tensor (or CPU under TRITON_INTERPRET=1), fp32/bf16/fp16, any strides.
        weight: (D,) tensor on x's device.
        casting: where y rounds to x's dtype: "llama", "gemma", "torch" or "none" (reference/rms_norm.py).
        residual: optional (..., D) tensor added to x first (fused add + norm).
        eager: launch directly (the eager autograd.Function) rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("norm")`).
    Returns:
        y of x's shape and dtype (contiguous), rstd fp32 of shape x.shape[:-1], and h = x + residual
        (contiguous) when a residual is given, else None.
    """
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = torch.empty(x.shape[:-1], dtype=acc_dtype(x.dtype), device=x.device)
    h = torch.empty_like(y) if residual is not None else None
    round_normed = rounds_normed(casting)
    if n_rows == 0:
        return y, rstd, h
    r2 = as_rows(residual) if residual is not None else x2
    weight = weight.contiguous()
    cfg = config or tuning.current("norm")
    launch = row_launch(n_cols, x.element_size(), cfg.rms_norm.fwd_elements_per_thread, cfg.rows)
    _fwd_kernel(
        (n_rows,), x2, r2, h if h is not None else y, weight, y, rstd,
        row_stride(x2), row_stride(r2), n_cols, n_cols, eps, offset,
        BLOCK=launch.block, SINGLE_PASS=launch.single_pass, HAS_RESIDUAL=residual is not None,
        ROUND_NORMED=round_normed, IN_DTYPE=casting == "none", num_warps=launch.num_warps, eager=eager,
    )
    return y, rstd, h


def rms_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting: str = "llama",
    dres: Tensor | None = None, *, eager: bool = False, config: NormConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Launch the backward kernel and reduce the per-program weight-gradient partials.

    Args:
        dy: (..., D) upstream gradient; x: (..., D) the normalised input; weight: (D,);
        rstd: x.shape[:-1]; casting: the forward's (it decides the x_hat that dweight sums);
        dres: optional (..., D) gradient added to dx (the residual stream's).
        eager: launch directly rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("norm")`).
    Returns:
        dx of x's shape and dtype, dweight of weight's shape and dtype.
    """
    x2 = as_rows(x)
    dy2 = as_rows(dy)
    dres2 = as_rows(dres) if dres is not None else dy2
    n_rows, n_cols = x2.shape
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    round_normed = rounds_normed(casting)
    if n_rows == 0:
        return dx, torch.zeros_like(weight)
    weight, rstd = weight.contiguous(), rstd.contiguous()
    cfg = config or tuning.current("norm")
    launch = row_launch(n_cols, x.element_size(), cfg.rms_norm.bwd_elements_per_thread, cfg.rows)
    strides = (row_stride(dy2), row_stride(x2), row_stride(dres2), n_cols)
    if launch.single_pass:
        plan = row_schedule(n_rows, x.device, launch, cfg.rms_norm.tiling(launch.block), cfg.rows)
        dw_part = torch.empty((plan.programs, n_cols), dtype=torch.float32, device=x.device)
        _bwd_kernel(
            (plan.programs,), dy2, x2, weight, rstd, dres2, dx, dw_part, *strides, n_rows, n_cols, offset,
            BLOCK=launch.block, ROWS=plan.tile, HAS_DRES=dres is not None, PREFETCH=plan.prefetch,
            ROUND_NORMED=round_normed, IN_DTYPE=casting == "none", num_warps=launch.num_warps, eager=eager,
        )
    else:
        split = split_schedule(n_rows, n_cols, x.device, launch, cfg.rows)
        stats = torch.empty((n_rows, split.chunks), dtype=torch.float32, device=x.device)
        _bwd_stats_kernel(
            (n_rows, split.chunks), dy2, x2, weight, rstd, stats, strides[0], strides[1], n_cols,
            split.chunks, offset, BLOCK=launch.block, num_warps=launch.num_warps, eager=eager,
        )
        dw_part = torch.empty((split.groups, n_cols), dtype=torch.float32, device=x.device)
        _bwd_cols_kernel(
            (split.col_blocks, split.groups), dy2, x2, weight, rstd, stats, dres2, dx, dw_part, *strides,
            n_rows, n_cols, split.chunks, split.rows_per_group, offset,
            BLOCK=split.col_block, ROWS=split.tile, CHUNKS=next_power_of_2(split.chunks),
            HAS_DRES=dres is not None, ROUND_NORMED=round_normed, IN_DTYPE=casting == "none",
            num_warps=split.num_warps, eager=eager,
        )
    # second reduction over a fixed number of partials in a fixed order: deterministic
    return dx, sum_partials(dw_part, (weight.dtype,), eager=eager)[0]


def _fwd_reference(
    x: Tensor, weight: Tensor, eps: float, offset: float, casting: str = "llama"
) -> tuple[Tensor, Tensor]:
    rstd = rms_norm_rstd(x, eps)
    return rms_norm_from_rstd(x, weight, rstd, offset, casting).contiguous(), rstd


def _bwd_reference(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting: str = "llama"
) -> tuple[Tensor, Tensor]:
    dx, dw = rms_norm_backward(dy, x, weight, rstd, offset, casting)
    return dx.contiguous(), dw


# kernel_pytorch::rms_norm_fwd (x, weight, eps, offset, casting="llama") -> (y, rstd) and rms_norm_bwd
# (dy, x, weight, rstd, offset, casting="llama") -> (dx, dweight); rms_norm_eager(x, weight, eps, offset,
# casting="llama") -> y, differentiable. casting defaults to "llama", the rounding before it existed.
rms_norm_fwd_op, rms_norm_bwd_op, rms_norm_eager = register_op(
    "rms_norm",
    Impl(rms_norm_fwd, _fwd_reference, "reference", outputs=("y", "rstd")),
    Impl(rms_norm_bwd, _bwd_reference, "reference", outputs=("dx", "dweight")),
    differentiable=("y",),
    save=("x", "weight", "rstd"),
    keep=("offset", "casting"),
    grads={"x": "dx", "weight": "dweight"},
)

# DTensor (ops/_common/sharding.py): rows are independent, so x may be sharded on any dim but the last (sequence
# parallelism: Shard(1) of (B, T, D)) with the weight Replicate; the weight's gradient is then a sum over the
# ranks' rows (Partial)
register_rules("rms_norm", rowwise(("x",), ("rows", "rows")), rowwise(("dy", "x", "rstd"), ("rows", "sum")),
               "x is sharded on a dim other than the last (Shard(d), d < x.ndim - 1) and the weight Replicate")
