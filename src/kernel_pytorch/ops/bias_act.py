"""Bias + activation kernels: y = act((x + bias).to(dtype)), for Linear -> activation stacks with a bias.

Math (see reference/bias_act.py, the specification), for x (rows, D) and bias (D,) or none:
    z = (x + bias).to(dtype);  y = act(z).to(dtype)
    dz = dy * act'(z);  dx = dz.to(dtype);  dbias = sum_rows dz (fp32, cast to bias's dtype)

Forward: a memory-bound stream (x in, y out; the bias is one row, read from L2), one program per
[BLOCK_R, BLOCK_C] tile as in ops/gated_act.py.
Backward: dy and x in, dx out, plus the bias gradient, a reduction over rows. A 2-D grid: program
(i, k) owns column block i of row group k, walks the group's rows in tiles (prefetching the next
tile's loads before this tile's math, so two tiles of traffic are in flight), and writes one fp32
partial row of dbias for its group. The partials (groups x D, a few MiB at most) are then summed in a
fixed order by ops/_partials.sum_partials: no float atomics, bitwise-reproducible. Groups are chosen
so that column blocks x groups fill the device (the "mlp" tuning config's `bias_bwd_programs_per_sm`,
ops/_activations.MlpConfig). Only x is saved for the backward
(z is recomputed from x and bias), as eager saves its pre-activation.

Registered as `kernel_pytorch::bias_act_fwd` (x, bias?, act) -> y and `bias_act_bwd` (dy, x, bias?,
act) -> (dx, dbias), out of place; without a bias, dbias is an empty tensor in the op and None in
autograd. Host cost per eager call: forward one allocation and one launch; backward, with a bias, the
kernel and the partials' sum (two launches, three allocations: dx, the partials, dbias), without one a
single launch and dx.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._activations import (
    MlpConfig,
    act_fwd,
    act_fwd_grad,
    as_2d,
    as_2d_out,
    precise_math,
    strides,
    tiles,
)
from kernel_pytorch.ops._common.launch import Launcher, device_programs
from kernel_pytorch.ops._common.partials import sum_partials
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import P, R, Strategy, register_rules, row_dims, shard
from kernel_pytorch.reference.bias_act import bias_act, bias_act_backward


@triton.jit
def _pre_activation(x, b, X_TY: tl.constexpr, HAS_BIAS: tl.constexpr):
    """z in fp32: (x + bias) rounded to x's dtype, as the Linear's output would be."""
    if HAS_BIAS:
        return (x + b).to(X_TY).to(tl.float32)
    return x


@triton.jit
def _bias_act_fwd_kernel(
    X, B, Y, n_rows, n_cols, col_tiles, sx_r, sx_c, sy_r, sy_c,
    ACT: tl.constexpr, PRECISE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % col_tiles).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    mask = (rows[:, None] < n_rows) & col_ok[None, :]
    x = tl.load(X + rows[:, None] * sx_r + cols[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    z = _pre_activation(x, b, X.dtype.element_ty, HAS_BIAS)
    y = act_fwd(z, ACT, PRECISE).to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * sy_r + cols[None, :] * sy_c, y, mask=mask)


@triton.jit
def _load_tile(DY, X, first, end, cols, col_ok, sdy_r, sdy_c, sx_r, sx_c, ROWS: tl.constexpr):
    """dy and x of rows first .. first + ROWS - 1 (masked at `end`), as stored."""
    rows = tl.cast(first, tl.int64) + tl.arange(0, ROWS)
    mask = (rows[:, None] < end) & col_ok[None, :]
    dy = tl.load(DY + rows[:, None] * sdy_r + cols[None, :] * sdy_c, mask=mask, other=0.0)
    x = tl.load(X + rows[:, None] * sx_r + cols[None, :] * sx_c, mask=mask, other=0.0)
    return dy, x


@triton.jit
def _bias_act_bwd_kernel(
    DY, X, B, DX, PART, n_rows, n_cols, rows_per_group,
    sdy_r, sdy_c, sx_r, sx_c, sdx_r, sdx_c,
    ACT: tl.constexpr, PRECISE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # program (i, k): columns i*BLOCK_C.. of rows k*rows_per_group.. (the last group fewer)
    cols = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    group = tl.program_id(1)
    start = group * rows_per_group
    end = tl.minimum(start + rows_per_group, n_rows)
    b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :] if HAS_BIAS else 0.0
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    dy_next, x_next = _load_tile(DY, X, start, end, cols, col_ok, sdy_r, sdy_c, sx_r, sx_c, BLOCK_R)
    for first in range(start, end, BLOCK_R):
        dy, x = dy_next.to(tl.float32), x_next.to(tl.float32)
        # the next tile's loads go out before this tile's math (fully masked past the group's end)
        dy_next, x_next = _load_tile(DY, X, first + BLOCK_R, end, cols, col_ok, sdy_r, sdy_c, sx_r, sx_c, BLOCK_R)
        rows = tl.cast(first, tl.int64) + tl.arange(0, BLOCK_R)
        mask = (rows[:, None] < end) & col_ok[None, :]
        _, da = act_fwd_grad(_pre_activation(x, b, X.dtype.element_ty, HAS_BIAS), ACT, PRECISE)
        dz = dy * da  # masked elements: dy is 0 there, so they add nothing to the partial
        acc += dz
        tl.store(DX + rows[:, None] * sdx_r + cols[None, :] * sdx_c, dz.to(DX.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        tl.store(PART + group.to(tl.int64) * n_cols + cols, tl.sum(acc, axis=0), mask=col_ok)


_fwd_kernel = Launcher(_bias_act_fwd_kernel)
_bwd_kernel = Launcher(_bias_act_bwd_kernel)


def bias_act_fwd(
    x: Tensor, bias: Tensor | None, act: str, *, out: Tensor | None = None, eager: bool = False,
    config: MlpConfig | None = None,
) -> Tensor:
    """Launch the forward kernel.

    Args:
        x: (..., D) CUDA tensor (or CPU under TRITON_INTERPRET=1), fp32/bf16/fp16, any strides.
        bias: (D,) tensor of x's dtype on x's device, or None (the activation alone).
        act: "silu", "gelu", "gelu_tanh" or "relu".
        out: optional (..., D) buffer for y (may be x itself: each element is read before written).
        eager: launch directly (the eager autograd.Function) rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("mlp")`).
    Returns:
        y of x's shape and dtype (contiguous unless `out` is given).
    """
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    x2, y2 = as_2d(x), as_2d_out(y, "out")
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return y
    b = bias.contiguous() if bias is not None else x2  # stand-in pointer, never read
    t = tiles(n_rows, n_cols, config)
    _fwd_kernel(
        (t.row_tiles * t.col_tiles,), x2, b, y2, n_rows, n_cols, t.col_tiles, *strides(x2), *strides(y2),
        ACT=act, PRECISE=precise_math(x2), HAS_BIAS=bias is not None, BLOCK_R=t.block_r, BLOCK_C=t.block_c,
        num_warps=t.num_warps, eager=eager,
    )
    return y


def bias_act_bwd(
    dy: Tensor, x: Tensor, bias: Tensor | None, act: str, *, out: Tensor | None = None, eager: bool = False,
    config: MlpConfig | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Launch the backward kernel and sum the bias-gradient partials in a fixed order.

    Args:
        dy, x: (..., D), one dtype, any strides; bias: (D,) or None.
        out: optional (..., D) buffer for dx (may be dy or x: each element is read before written).
        eager: launch directly rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("mlp")`).
    Returns:
        dx of x's shape and dtype; dbias (D,) of bias's dtype, or None without a bias.
    """
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    dy2, x2, dx2 = as_2d(dy), as_2d(x), as_2d_out(dx, "out")
    n_rows, n_cols = x2.shape
    if n_rows == 0 or n_cols == 0:
        return dx, (torch.zeros_like(bias) if bias is not None else None)
    cfg = config or tuning.current("mlp")
    t = tiles(n_rows, n_cols, cfg, cfg.bias_bwd_tile_elements)
    # row groups: enough programs to fill the device, each at least one tile of rows
    programs = device_programs(x.device, cfg.bias_bwd_programs_per_sm)
    groups = max(1, min(t.row_tiles, triton.cdiv(programs, t.col_tiles)))
    rows_per_group = triton.cdiv(t.row_tiles, groups) * t.block_r
    groups = triton.cdiv(n_rows, rows_per_group)
    parts = torch.empty((groups, n_cols), dtype=torch.float32, device=x.device) if bias is not None else dx2
    _bwd_kernel(
        (t.col_tiles, groups), dy2, x2, bias.contiguous() if bias is not None else x2, dx2, parts, n_rows, n_cols,
        rows_per_group, *strides(dy2), *strides(x2), *strides(dx2),
        ACT=act, PRECISE=precise_math(x2), HAS_BIAS=bias is not None, BLOCK_R=t.block_r, BLOCK_C=t.block_c,
        num_warps=t.num_warps, eager=eager,
    )
    if bias is None:
        return dx, None
    # second reduction over a fixed number of partials in a fixed order: deterministic
    return dx, sum_partials(parts, (bias.dtype,), eager=eager)[0]


def _fwd_reference(x: Tensor, bias: Tensor | None, act: str) -> Tensor:
    return bias_act(x, bias, act).contiguous()


def _bwd_reference(dy: Tensor, x: Tensor, bias: Tensor | None, act: str) -> tuple[Tensor, Tensor | None]:
    dx, dbias = bias_act_backward(dy, x, bias, act)
    return dx.contiguous(), dbias


# kernel_pytorch::bias_act_fwd (x, bias?, act) -> y and bias_act_bwd (dy, x, bias?, act) -> (dx, dbias);
# bias_act_eager(x, bias, act) -> y, differentiable, saving x and bias
bias_act_fwd_op, bias_act_bwd_op, bias_act_eager = register_op(
    "bias_act",
    Impl(bias_act_fwd, _fwd_reference, "reference", outputs=("y",)),
    Impl(bias_act_bwd, _bwd_reference, "reference", outputs=("dx", "dbias")),
    differentiable=("y",),
    save=("x", "bias"),
    keep=("act",),
    grads={"x": "dx", "bias": "dbias"},
)


# DTensor (ops/_common/sharding.py): rows sharded (bias Replicate, its gradient a Partial sum), or columns:
# x Shard(-1) with the bias Shard(0), a column-parallel Linear's output and bias
def _fwd_rule(a: object) -> list[Strategy]:
    cols = shard(a.x.ndim - 1)
    rows = [Strategy((shard(d),), {"x": shard(d)}) for d in row_dims(a.x)]
    return [*rows, Strategy((cols,), {"x": cols, "bias": shard(0)})]


def _bwd_rule(a: object) -> list[Strategy]:
    cols = shard(a.x.ndim - 1)
    rows = [Strategy((shard(d), P), {"dy": shard(d), "x": shard(d)}) for d in row_dims(a.x)]
    dbias = shard(0) if a.bias is not None else R
    return [*rows, Strategy((cols, dbias), {"dy": cols, "x": cols, "bias": shard(0)})]


register_rules(
    "bias_act", _fwd_rule, _bwd_rule,
    "x is sharded on a dim other than the last with the bias Replicate, or on its last dim (Shard(-1)) with "
    "the bias Shard(0)",
)
