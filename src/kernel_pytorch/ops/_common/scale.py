"""Scaling a precomputed gradient by the upstream gradient: one factor, or one per row.

Losses that compute their gradient in the forward (cross-entropy, fused linear cross-entropy) return
it in the backward multiplied by the upstream gradient g: a 0-d tensor for "mean"/"sum", one value per
row for cross-entropy's "none". Almost always g == 1 (`loss.backward()`, or `loss_rows.sum()`); reading
g on the host would cost a sync, and multiplying anyway a pass over the gradient (for cross-entropy,
as many bytes as the whole forward). `scale_grad_` reads g on the device and touches no row whose
factor is 1 (one launch and no memory traffic when g is a single 1). A persistent grid of
SCALE_PROGRAMS_PER_SM programs per SM walks (row, column block) tiles, computing g * grad in fp32 and
rounding once. `scaled_grad` writes g * grad into a new tensor (a registered op may not write into
its inputs). Traced (compile, AOTInductor) it is the same math as torch ops instead of the kernel: the
saved gradient is then a buffer AOTAutograd donates to the backward, and Inductor writes the product
over it, where the kernel's new tensor would hold a second copy of the gradient (V x H for the fused
linear cross-entropy's grad_W) alive beside the saved one. The pass itself stays: g's value is not
known when the graph is traced.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._common.launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._common.row_view import Rows, contiguous_rows, row_view

SCALE_BLOCK, SCALE_WARPS, SCALE_PROGRAMS_PER_SM = 4096, 8, 4


@triton.jit
def _scale_kernel(
    G, OUT, S, n_rows, n_cols, inner, s0, s1, o_inner, o_s0, o_s1, stride_s,
    BLOCK: tl.constexpr, IN_PLACE: tl.constexpr,
):
    # stride_s 0: one factor for every row. IN_PLACE: OUT is G, and rows whose factor is 1 are skipped
    active = 1
    if IN_PLACE:
        if stride_s == 0:
            if tl.load(S).to(tl.float32) == 1.0:
                active = 0
    if active != 0:
        col_blocks = tl.cdiv(n_cols, BLOCK)
        offs = tl.arange(0, BLOCK)
        for tile in range(tl.program_id(0), n_rows * col_blocks, tl.num_programs(0)):
            row = tl.cast(tile // col_blocks, tl.int64)
            cols = (tile % col_blocks) * BLOCK + offs
            mask = cols < n_cols
            s = tl.load(S + row * stride_s).to(tl.float32)
            ptrs = G + (row // inner) * s0 + (row % inner) * s1 + cols
            if IN_PLACE:
                if s != 1.0:
                    g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
                    tl.store(ptrs, (g * s).to(G.dtype.element_ty), mask=mask)
            else:
                g = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
                out = OUT + (row // o_inner) * o_s0 + (row % o_inner) * o_s1 + cols
                tl.store(out, (g * s).to(OUT.dtype.element_ty), mask=mask)


_kernel = Launcher(_scale_kernel)


def _factors(dloss: Tensor, n_rows: int) -> tuple[Tensor, int]:
    """(the factors as a contiguous tensor, their row stride: 0 for one factor)."""
    if dloss.numel() == 1:
        return dloss.reshape(1), 0
    if dloss.numel() != n_rows:
        raise ValueError(f"dloss has {dloss.numel()} elements for a gradient of {n_rows} rows (need 1 or {n_rows})")
    return dloss.reshape(-1).contiguous(), 1


def _launch(grad: Rows, out: Rows, dloss: Tensor, n_cols: int, in_place: bool, eager: bool) -> None:
    n = grad.n_rows
    factors, stride = _factors(dloss, n)
    block = min(SCALE_BLOCK, next_power_of_2(n_cols))
    programs = max(1, min(n * triton.cdiv(n_cols, block), device_programs(factors.device, SCALE_PROGRAMS_PER_SM)))
    _kernel((programs,), grad.tensor, out.tensor, factors, n, n_cols, *grad.args, *out.args, stride, BLOCK=block,
            IN_PLACE=in_place, num_warps=max(1, min(SCALE_WARPS, block // 256)), eager=eager)


def _rows(grad: Tensor) -> Rows:
    return row_view(grad if grad.dim() > 1 else grad.unsqueeze(0))


def scale_grad_(grad: Tensor, dloss: Tensor, *, eager: bool = False) -> Tensor:
    """grad *= dloss in place, row by row; rows whose factor is 1 are not touched, no host sync.

    Args:
        grad: a gradient of any shape whose rows `row_view` addresses in place (unit last-dim stride).
        dloss: one element (every row), or one per row of grad (its leading dims flattened), on grad's
            device.
        eager: launch directly rather than through wrap_triton.
    Returns:
        grad.
    """
    if grad.numel() == 0:
        return grad
    rows = _rows(grad)
    if not rows.same_storage(grad):
        raise ValueError("scale_grad_ needs a gradient with a unit last-dim stride (it scales in place)")
    _launch(rows, rows, dloss, grad.shape[-1], True, eager)
    return grad


def _traced(t: Tensor) -> bool:
    """Whether `t` is a tracer's stand-in (a fake tensor, possibly wrapped for functionalization)."""
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # a torch without it: the kernel, which is correct, only not reused in place
        return False
    return is_fake(t)


def scaled_grad(grad: Tensor, dloss: Tensor, *, eager: bool = False) -> Tensor:
    """dloss * grad into a new contiguous tensor of grad's shape and dtype (one rounding).

    Args:
        grad: any shape; dloss: one element, or one per row of grad.
    """
    if not eager and _traced(grad):  # torch ops Inductor can write over a donated grad (docstring)
        rows = grad.shape[:-1] if grad.dim() > 1 else (1,)
        factors, stride = _factors(dloss, math.prod(rows))
        factors = factors.float().reshape(*rows, 1) if stride else factors.float().reshape(())
        return (grad.float() * factors).to(grad.dtype).contiguous()
    out = torch.empty_like(grad, memory_format=torch.contiguous_format)
    if grad.numel():
        _launch(_rows(grad), contiguous_rows(out if out.dim() > 1 else out.unsqueeze(0)), dloss, grad.shape[-1],
                False, eager)
    return out


__all__ = ["scale_grad_", "scaled_grad"]
