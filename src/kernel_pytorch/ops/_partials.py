"""The second, fixed-order reduction of the backward kernels' per-program fp32 partial rows.

For parts (P, D) fp32 (one row per persistent program): out[d] = sum_p parts[p, d], cast to the
parameter's dtype. Each program owns BLOCK_D columns and adds the P rows in the same order on every
run (BLOCK_P-row chunks accumulated in turn, then a fixed tree within the chunk): no atomics, so two
runs give bitwise-equal gradients. Up to two stacked buffers go in one launch (LayerNorm's weight and
bias), which saves the separate sum and cast launches and their host time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._triton import Launcher

# Columns per program: a (BLOCK_P, BLOCK_D) fp32 tile is 8 KiB, 4 warps stream it.
_BLOCK_D = 64
_BLOCK_P = 32


@triton.jit
def _sum_partials_kernel(
    PART, OUT_A, OUT_B, n_parts, n_cols,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # grid (column blocks, buffers): program (i, k) sums columns i*BLOCK_D.. of buffer k
    k = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < n_cols
    part = PART + k.to(tl.int64) * n_parts * n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        ptrs = part + rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        acc += tl.load(ptrs, mask=(rows[:, None] < n_parts) & mask[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(OUT_A + cols, total.to(OUT_A.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT_B + cols, total.to(OUT_B.dtype.element_ty), mask=mask)


_sum_partials = Launcher(_sum_partials_kernel)


def sum_partials(parts: Tensor, dtypes: tuple[torch.dtype, ...], *, eager: bool = False) -> list[Tensor]:
    """Column sums of K = len(dtypes) (1 or 2) stacked partial buffers, in a fixed order.

    Args:
        parts: contiguous fp32 (K, P, D), or (P, D) when K is 1.
        dtypes: the dtype of each sum (the parameter's).
    Returns:
        K tensors of shape (D,).
    """
    n_parts, n_cols = parts.shape[-2:]
    outs = [torch.empty(n_cols, dtype=dt, device=parts.device) for dt in dtypes]
    _sum_partials(
        (triton.cdiv(n_cols, _BLOCK_D), len(outs)), parts, outs[0], outs[-1], n_parts, n_cols,
        BLOCK_P=_BLOCK_P, BLOCK_D=_BLOCK_D, eager=eager, num_warps=4,
    )
    return outs
