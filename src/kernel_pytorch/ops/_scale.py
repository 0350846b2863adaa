"""Scaling a precomputed gradient by the upstream gradient of a scalar loss, in place.

Losses that compute their gradient in the forward (cross-entropy "mean"/"sum", fused linear
cross-entropy) return it in the backward multiplied by the upstream gradient g, a 0-d tensor on the
device. Almost always g == 1 (`loss.backward()`); reading g on the host would cost a sync, and
multiplying anyway a pass over the gradient (for cross-entropy, as many bytes as the whole forward).
The kernel reads g on the device and returns at once when it is 1: one launch, no sync, no memory
traffic. A persistent grid of SCALE_PROGRAMS_PER_SM programs per SM walks (row, column block) tiles
otherwise, computing g * grad in fp32 and rounding once.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._row_view import row_view

SCALE_BLOCK, SCALE_WARPS, SCALE_PROGRAMS_PER_SM = 4096, 8, 4


@triton.jit
def _scale_unless_one_kernel(G, S, n_rows, n_cols, inner, s0, s1, BLOCK: tl.constexpr):
    s = tl.load(S).to(tl.float32)
    if s != 1.0:
        col_blocks = tl.cdiv(n_cols, BLOCK)
        offs = tl.arange(0, BLOCK)
        for tile in range(tl.program_id(0), n_rows * col_blocks, tl.num_programs(0)):
            row = tl.cast(tile // col_blocks, tl.int64)
            cols = (tile % col_blocks) * BLOCK + offs
            ptrs = G + (row // inner) * s0 + (row % inner) * s1 + cols
            g = tl.load(ptrs, mask=cols < n_cols, other=0.0).to(tl.float32)
            tl.store(ptrs, (g * s).to(G.dtype.element_ty), mask=cols < n_cols)


_scale_kernel = Launcher(_scale_unless_one_kernel)


def scale_grad_(grad: Tensor, dloss: Tensor, *, eager: bool = False) -> Tensor:
    """grad *= dloss in place; no memory is touched when dloss == 1, and no host sync either way.

    Args:
        grad: a gradient of any shape whose rows `row_view` addresses in place (unit last-dim stride).
        dloss: one-element tensor on grad's device (the upstream gradient of a scalar loss).
        eager: launch directly rather than through wrap_triton.
    Returns:
        grad.
    """
    if grad.numel() == 0:
        return grad
    rows = row_view(grad if grad.dim() > 1 else grad.unsqueeze(0))
    if not rows.same_storage(grad):
        raise ValueError("scale_grad_ needs a gradient with a unit last-dim stride (it scales in place)")
    n, d = rows.n_rows, grad.shape[-1]
    block = min(SCALE_BLOCK, next_power_of_2(d))
    programs = max(1, min(n * triton.cdiv(d, block), device_programs(grad.device, SCALE_PROGRAMS_PER_SM)))
    _scale_kernel((programs,), rows.tensor, dloss.reshape(1), n, d, *rows.args, BLOCK=block,
                  num_warps=max(1, min(SCALE_WARPS, block // 256)), eager=eager)
    return grad
