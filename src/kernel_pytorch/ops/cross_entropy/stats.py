"""The cross-entropy means' denominators and the class-weight total, on the device.

For targets t (N,), class weights w (V,) (1 where absent) and ignore_index: (sum of w[t_i] over rows
with t_i != ignore_index, the number of such rows, sum of w), a (3,) fp32 tensor. The forward and
backward kernels read it (launch.py); the fused linear cross-entropy computes it once for
all its chunks. One program adds in a fixed order: deterministic, and no host sync. Out-of-range
targets count as valid rows (their loss is NaN) but add no weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher


@triton.jit
def _ce_stats_kernel(T, W, STATS, n_rows, n_cols, ignore_index, HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    # one program, fixed order: deterministic
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    w_valid = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + offs
        t = tl.load(T + rows, mask=rows < n_rows, other=0).to(tl.int64)
        valid = (rows < n_rows) & (t != ignore_index)
        count += valid.to(tl.int32)
        if HAS_WEIGHT:
            w_valid += tl.load(W + t, mask=valid & (t >= 0) & (t < n_cols), other=0.0).to(tl.float32)
    n_valid = tl.sum(count, axis=0).to(tl.float32)
    if HAS_WEIGHT:
        w_all = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + offs
            w_all += tl.load(W + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(STATS, tl.sum(w_valid, axis=0))
        tl.store(STATS + 2, tl.sum(w_all, axis=0))
    else:
        tl.store(STATS, n_valid)
        tl.store(STATS + 2, n_cols * 1.0)
    tl.store(STATS + 1, n_valid)


_stats_kernel = Launcher(_ce_stats_kernel)


def cross_entropy_stats(target: Tensor, weight: Tensor | None, n_classes: int, ignore_index: int,
                        *, eager: bool = False) -> Tensor:
    """(sum of w[t] over valid rows, number of valid rows, sum of w), a (3,) fp32 tensor computed on
    target's device (no host sync); w = 1 without weights.

    Args:
        target: any shape, integer class indices; weight: (n_classes,) or None.
    """
    t = target.reshape(-1).contiguous()
    stats = torch.empty(3, dtype=torch.float32, device=t.device)
    w = weight.contiguous() if weight is not None else stats
    _stats_kernel((1,), t, w, stats, t.numel(), n_classes, ignore_index, HAS_WEIGHT=weight is not None,
                  BLOCK=tuning.current("cross_entropy").stats_block, num_warps=4, eager=eager)
    return stats
