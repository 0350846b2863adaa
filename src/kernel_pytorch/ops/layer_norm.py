"""LayerNorm forward and backward kernels, registered as `kernel_pytorch::layer_norm_fwd` / `_bwd`.

Math (see reference/layer_norm.py), for x (rows, D), optional weight and bias (D,):
    mean = mean(x);  rstd = 1/sqrt(mean((x - mean)^2) + eps);  x_hat = (x - mean) * rstd
    y = x_hat * weight + bias
    dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)),  g = dy * weight
    dweight = sum_rows dy * x_hat;  dbias = sum_rows dy

Forward: one program per row; the variance is taken around the mean (two passes over the row, in
registers when it fits) so large offsets do not cancel. mean and rstd (fp32) are saved.
Backward: row mode or split mode, as in ops/rms_norm.py (the split statistics pass writes both row
sums); dweight and dbias partials are summed in a fixed order afterwards (ops/_common/partials.py): no float
atomics, bitwise-reproducible. Row mode runs two programs per SM, which share partial rows in pairs
(ops/_partials.store_partials), so the partials stay at one fp32 row per SM per parameter.
Launch choices: the "norm" tuning config, ops/norm_config.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher, next_power_of_2
from kernel_pytorch.ops._common.partials import partial_slots, store_partials, sum_partials
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.rows import as_rows, row_launch, row_schedule, row_stride, split_schedule
from kernel_pytorch.ops._common.sharding import register_rules, rowwise
from kernel_pytorch.ops._common.tiles import chunk_dy_x, chunk_sums, first_loads, row_step, split_block, split_step
from kernel_pytorch.ops.norm_config import NormConfig
from kernel_pytorch.reference._math import acc_dtype
from kernel_pytorch.reference.layer_norm import layer_norm_backward, layer_norm_from_stats, layer_norm_stats


@triton.jit
def _layer_norm_fwd_kernel(
    X, W, B, Y, MEAN, RSTD,
    stride_x, stride_y, n_cols, eps,
    BLOCK: tl.constexpr, SINGLE_PASS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        # parameters loaded with x, so their latency hides behind x's rather than following the sums
        if HAS_W:
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        y = xc * rstd
        if HAS_W:
            y = y * w
        if HAS_B:
            y = y + b
        tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # wide rows: mean, then centred variance, then normalise (three passes; the row is re-read)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / n_cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, x - mean, 0.0)
            acc += xc * xc
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _add_pair(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _layer_norm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DX, PART, TICKETS,
    stride_dy, stride_x, stride_dx, n_rows, n_cols,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    PREFETCH: tl.constexpr, EVEN: tl.constexpr, PAIRED: tl.constexpr,
):
    # Row mode, as in ops/rms_norm.py: program pid walks tiles pid, pid + G, ... of ROWS rows.
    # PART is (HAS_W + HAS_B, slots, n_cols): the weight's partial rows first, then the bias's; with
    # PAIRED, two programs share a slot (ops/_partials.store_partials)
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    col_ok = cols < n_cols
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    dy_next, x_next = first_loads(DY, X, pid * ROWS, n_rows, stride_dy, stride_x, cols, col_ok, ROWS, PREFETCH)
    for tile in range(pid, tl.cdiv(n_rows, ROWS), n_progs):
        rows, row_ok, dy, x, dy_next, x_next = row_step(
            DY, X, tile, n_progs, n_rows, dy_next, x_next, stride_dy, stride_x, cols, col_ok, ROWS, PREFETCH,
        )
        mean = tl.load(MEAN + rows)[:, None]
        rstd = tl.load(RSTD + rows)[:, None]
        # EVEN (BLOCK == n_cols): no padding columns whose x_hat would have to be zeroed
        x_hat = (x - mean) * rstd if EVEN else tl.where(col_ok[None, :], (x - mean) * rstd, 0.0)
        real = row_ok[:, None]
        # a repeated tail row contributes nothing to the parameter gradients, and its dx is not stored
        dy = tl.where(real, dy, 0.0)
        if HAS_W:
            dw_acc += dy * x_hat
            g = dy * w[None, :]
        else:
            g = dy
        if HAS_B:
            db_acc += dy
        # both row sums in one reduction: one shared-memory exchange and barrier instead of two
        s1, s2 = tl.reduce((g * x_hat, g), 1, _add_pair)
        dx = (g - s2[:, None] / n_cols - x_hat * (s1[:, None] / n_cols)) * rstd
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=real & col_ok[None, :])
    store_partials(
        PART, TICKETS, n_cols, cols, col_ok, tl.sum(dw_acc, axis=0), tl.sum(db_acc, axis=0),
        HAS_W, HAS_B, PAIRED,
    )


@triton.jit
def _layer_norm_bwd_stats_kernel(
    DY, X, W, MEAN, RSTD, STATS, stride_dy, stride_x, n_rows, n_cols, n_chunks,
    BLOCK: tl.constexpr, HAS_W: tl.constexpr,
):
    # Split mode, first pass: STATS[0, row, chunk] = sum of g * x_hat, STATS[1, row, chunk] = sum of g
    # over the chunk's columns
    row, cols, ok, g, x = chunk_dy_x(DY, X, stride_dy, stride_x, n_cols, BLOCK)
    if HAS_W:
        g = g * tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    x_hat = tl.where(ok, (x - tl.load(MEAN + row)) * tl.load(RSTD + row), 0.0)
    s1, s2 = tl.reduce((g * x_hat, g), 0, _add_pair)
    out = STATS + row * n_chunks + tl.program_id(1)
    tl.store(out, s1)
    tl.store(out + n_rows * n_chunks, s2)


@triton.jit
def _layer_norm_bwd_cols_kernel(
    DY, X, W, MEAN, RSTD, STATS, DX, PART,
    stride_dy, stride_x, stride_dx, n_rows, n_cols, n_chunks, rows_per_group,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, CHUNKS: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
):
    # Split mode, second pass, as in ops/rms_norm.py; PART is (HAS_W + HAS_B, groups, n_cols)
    cols, col_ok, start, end = split_block(n_rows, n_cols, rows_per_group, BLOCK)
    if HAS_W:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    dy_next, x_next = first_loads(DY, X, start, end, stride_dy, stride_x, cols, col_ok, ROWS, True)
    for first in range(start, end, ROWS):
        rows, row_ok, dy, x, dy_next, x_next = split_step(
            DY, X, first, end, dy_next, x_next, stride_dy, stride_x, cols, col_ok, ROWS,
        )
        mean = tl.load(MEAN + rows)[:, None]
        rstd = tl.load(RSTD + rows)[:, None]
        # each row's two sums from its chunks
        c1 = chunk_sums(STATS, rows, n_chunks, CHUNKS) / n_cols
        c2 = chunk_sums(STATS + n_rows * n_chunks, rows, n_chunks, CHUNKS)
        x_hat = (x - mean) * rstd
        real = row_ok[:, None]
        if HAS_W:
            dw_acc += tl.where(real, dy * x_hat, 0.0)
            g = dy * w[None, :]
        else:
            g = dy
        if HAS_B:
            db_acc += tl.where(real, dy, 0.0)
        dx = (g - c2 / n_cols - x_hat * c1) * rstd
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=real & col_ok[None, :])
    part = PART + tl.program_id(1).to(tl.int64) * n_cols + cols
    if HAS_W:
        tl.store(part, tl.sum(dw_acc, axis=0), mask=col_ok)
        part += tl.num_programs(1).to(tl.int64) * n_cols
    if HAS_B:
        tl.store(part, tl.sum(db_acc, axis=0), mask=col_ok)


_fwd_kernel = Launcher(_layer_norm_fwd_kernel)
_bwd_kernel = Launcher(_layer_norm_bwd_kernel)
_bwd_stats_kernel = Launcher(_layer_norm_bwd_stats_kernel)
_bwd_cols_kernel = Launcher(_layer_norm_bwd_cols_kernel)


def layer_norm_fwd(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, *, eager: bool = False,
    config: NormConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the forward kernel.

    Args:
        x: (..., D) CUDA tensor (or CPU under TRITON_INTERPRET=1), fp32/bf16/fp16, any strides.
        weight, bias: (D,) tensors on x's device, or None.
        eager: launch directly (the eager autograd.Function) rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("norm")`).
    Returns:
        y of x's shape and dtype (contiguous), mean and rstd fp32 of shape x.shape[:-1].
    """
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = torch.empty(x.shape[:-1], dtype=acc_dtype(x.dtype), device=x.device)
    rstd = torch.empty_like(mean)
    if n_rows == 0:
        return y, mean, rstd
    w = weight.contiguous() if weight is not None else x2  # placeholder pointer, never read
    b = bias.contiguous() if bias is not None else x2
    cfg = config or tuning.current("norm")
    launch = row_launch(n_cols, x.element_size(), cfg.layer_norm.fwd_elements_per_thread, cfg.rows,
                        cfg.layer_norm.fwd_max_fused_cols)
    _fwd_kernel(
        (n_rows,), x2, w, b, y, mean, rstd,
        row_stride(x2), n_cols, n_cols, eps,
        BLOCK=launch.block, SINGLE_PASS=launch.single_pass,
        HAS_W=weight is not None, HAS_B=bias is not None, num_warps=launch.num_warps, eager=eager,
    )
    return y, mean, rstd


def _parts(n_bufs: int, n_rows: int, n_cols: int, like: Tensor) -> Tensor:
    """The (n_bufs, n_rows, n_cols) fp32 partial buffer; with no parameters, `like` stands in (never
    written: a zero-size tensor's null pointer is not a valid kernel argument)."""
    if n_bufs == 0:
        return like
    return torch.empty((n_bufs, n_rows, n_cols), dtype=torch.float32, device=like.device)


def layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, has_bias: bool,
    *, eager: bool = False, config: NormConfig | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Launch the backward kernel and reduce the per-program partials.

    Args:
        dy, x: (..., D); weight: (D,) or None; mean, rstd: fp32 x.shape[:-1]; has_bias: whether to
        return a bias gradient; eager: launch directly rather than through wrap_triton; config: the
        launch config (None: the one in force, `tuning.current("norm")`).
    Returns:
        dx (x's shape and dtype), dweight (weight's dtype) or None, dbias or None (weight's dtype when
        there is a weight, else x's).
    """
    x2 = as_rows(x)
    dy2 = as_rows(dy)
    n_rows, n_cols = x2.shape
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    param_dtype = weight.dtype if weight is not None else x.dtype
    if n_rows == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        db = torch.zeros(n_cols, dtype=param_dtype, device=x.device) if has_bias else None
        return dx, dw, db
    cfg = config or tuning.current("norm")
    launch = row_launch(n_cols, x.element_size(), cfg.layer_norm.bwd_elements_per_thread, cfg.rows,
                        cfg.layer_norm.bwd_max_fused_cols)
    w = weight.contiguous() if weight is not None else rstd  # rstd: never-read stand-in
    mean, rstd = mean.contiguous(), rstd.contiguous()
    strides = (row_stride(dy2), row_stride(x2), n_cols)
    flags = dict(HAS_W=weight is not None, HAS_B=has_bias)
    # the weight's and the bias's partial rows in one buffer, reduced by one launch
    n_bufs = (weight is not None) + has_bias
    if launch.single_pass:
        plan = row_schedule(n_rows, x.device, launch, cfg.layer_norm.tiling(launch.block), cfg.rows)
        pairs = n_bufs and cfg.layer_norm.paired_partials
        slots, paired = partial_slots(plan.programs, x.device) if pairs else (plan.programs, False)
        parts = _parts(n_bufs, slots, n_cols, rstd)
        # the pairs' tickets (ops/_partials.store_partials); unpaired, rstd stands in, never read
        tickets = torch.zeros(slots, dtype=torch.int32, device=x.device) if paired else rstd
        _bwd_kernel(
            (plan.programs,), dy2, x2, w, mean, rstd, dx, parts, tickets, *strides, n_rows, n_cols,
            BLOCK=launch.block, ROWS=plan.tile, PREFETCH=plan.prefetch, EVEN=launch.block == n_cols,
            PAIRED=paired, num_warps=launch.num_warps, eager=eager, **flags,
        )
    else:
        split = split_schedule(n_rows, n_cols, x.device, launch, cfg.rows)
        stats = torch.empty((2, n_rows, split.chunks), dtype=torch.float32, device=x.device)
        _bwd_stats_kernel(
            (n_rows, split.chunks), dy2, x2, w, mean, rstd, stats, strides[0], strides[1], n_rows, n_cols,
            split.chunks, BLOCK=launch.block, HAS_W=weight is not None, num_warps=launch.num_warps,
            eager=eager,
        )
        parts = _parts(n_bufs, split.groups, n_cols, rstd)
        _bwd_cols_kernel(
            (split.col_blocks, split.groups), dy2, x2, w, mean, rstd, stats, dx, parts, *strides,
            n_rows, n_cols, split.chunks, split.rows_per_group,
            BLOCK=split.col_block, ROWS=split.tile, CHUNKS=next_power_of_2(split.chunks),
            num_warps=split.num_warps, eager=eager, **flags,
        )
    if n_bufs == 0:
        return dx, None, None
    # second reduction over a fixed number of partials in a fixed order: deterministic
    sums = sum_partials(parts, (param_dtype,) * n_bufs, eager=eager)
    dw = sums[0] if weight is not None else None
    db = sums[-1] if has_bias else None
    return dx, dw, db


def _fwd_reference(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    mean, rstd = layer_norm_stats(x, eps)
    return layer_norm_from_stats(x, weight, bias, mean, rstd).contiguous(), mean, rstd


def _bwd_reference(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor, has_bias: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    dx, dw, db = layer_norm_backward(dy, x, weight, mean, rstd, has_bias)
    return dx.contiguous(), dw, db


# kernel_pytorch::layer_norm_fwd (x, weight?, bias?, eps) -> (y, mean, rstd) and layer_norm_bwd (dy, x,
# weight?, mean, rstd, has_bias) -> (dx, dweight, dbias), an absent parameter's gradient an empty tensor
# (op schemas cannot return None; autograd gets None); layer_norm_eager(x, weight, bias, eps) -> y
layer_norm_fwd_op, layer_norm_bwd_op, layer_norm_eager = register_op(
    "layer_norm",
    Impl(layer_norm_fwd, _fwd_reference, "reference", outputs=("y", "mean", "rstd")),
    Impl(layer_norm_bwd, _bwd_reference, "reference", outputs=("dx", "dweight", "dbias")),
    differentiable=("y",),
    save=("x", "weight", "mean", "rstd"),
    present=("bias",),
    grads={"x": "dx", "weight": "dweight", "bias": "dbias"},
)
# DTensor: rms_norm's rule (rows sharded, weight and bias Replicate, their gradients Partial sums)
register_rules(
    "layer_norm",
    rowwise(("x",), ("rows", "rows", "rows")),
    rowwise(("dy", "x", "mean", "rstd"), ("rows", "sum", "sum")),
    "x is sharded on a dim other than the last (Shard(d), d < x.ndim - 1) and the weight and bias Replicate",
)
