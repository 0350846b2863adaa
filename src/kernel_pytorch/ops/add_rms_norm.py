"""Fused residual add + RMSNorm, registered as `kernel_pytorch::add_rms_norm_fwd` / `_bwd`.

Math (see reference/add_rms_norm.py), for x, residual (rows, D) and weight (D,):
    h = (x + residual).to(dtype);  y = rms_norm(h)          -> returns (y, h, rstd)
    d_sum = rms_norm_backward(dy on h) + dh;  dx = dresidual = d_sum

The kernels are RMSNorm's (ops/rms_norm.py) with their residual flags on: the forward reads x and
residual once and writes y and h; the backward adds dh while it writes the gradient, so the add
costs no extra pass over memory in either direction.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import triton_op

from kernel_pytorch.ops.rms_norm import rms_norm_bwd, rms_norm_fwd
from kernel_pytorch.reference._math import acc_dtype
from kernel_pytorch.reference.add_rms_norm import add_residual, add_rms_norm_backward
from kernel_pytorch.reference.rms_norm import rms_norm_from_rstd, rms_norm_rstd


def add_rms_norm_fwd(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, *, eager: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the fused forward. Returns y, h (both x's shape and dtype, contiguous), rstd (fp32)."""
    y, rstd, h = rms_norm_fwd(x, weight, eps, offset, residual=residual, eager=eager)
    assert h is not None
    return y, h, rstd


def add_rms_norm_bwd(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float, *, eager: bool = False
) -> tuple[Tensor, Tensor]:
    """Launch the fused backward. Returns d_sum (h's shape and dtype) and dweight."""
    return rms_norm_bwd(dy, h, weight, rstd, offset, dres=dh, eager=eager)


def _fwd_reference(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor, Tensor]:
    h = add_residual(x, residual)
    rstd = rms_norm_rstd(h, eps)
    return rms_norm_from_rstd(h, weight, rstd, offset).contiguous(), h.contiguous(), rstd


def _bwd_reference(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float
) -> tuple[Tensor, Tensor]:
    d_sum, dw = add_rms_norm_backward(dy, dh, h, weight, rstd, offset)
    return d_sum.contiguous(), dw


@triton_op("kernel_pytorch::add_rms_norm_fwd", mutates_args=())
def add_rms_norm_fwd_op(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Registered forward: (y, h, rstd). Triton on CUDA, the reference elsewhere."""
    # compile/export trace this body for every device, so the CPU branch must live here too
    if x.device.type != "cuda":
        return _fwd_reference(x, residual, weight, eps, offset)
    return add_rms_norm_fwd(x, residual, weight, eps, offset)


@triton_op("kernel_pytorch::add_rms_norm_bwd", mutates_args=())
def add_rms_norm_bwd_op(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float
) -> tuple[Tensor, Tensor]:
    """Registered backward: (d_sum, dweight); d_sum is the gradient of both x and residual."""
    if h.device.type != "cuda":
        return _bwd_reference(dy, dh, h, weight, rstd, offset)
    return add_rms_norm_bwd(dy, dh, h, weight, rstd, offset)


add_rms_norm_fwd_op.register_kernel("cpu")(_fwd_reference)
add_rms_norm_bwd_op.register_kernel("cpu")(_bwd_reference)


@add_rms_norm_fwd_op.register_fake
def _(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor, Tensor]:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return y, torch.empty_like(y), x.new_empty(x.shape[:-1], dtype=acc_dtype(x.dtype))


@add_rms_norm_bwd_op.register_fake
def _(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float
) -> tuple[Tensor, Tensor]:
    return torch.empty(h.shape, dtype=h.dtype, device=h.device), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    _x, _residual, weight, _eps, offset = inputs
    _y, h, rstd = output
    ctx.save_for_backward(h, weight, rstd)
    ctx.offset = offset


def _backward(ctx, dy: Tensor, dh: Tensor, _drstd: Tensor | None):
    h, weight, rstd = ctx.saved_tensors
    d_sum, dw = torch.ops.kernel_pytorch.add_rms_norm_bwd(dy, dh, h, weight, rstd, ctx.offset)
    return d_sum, d_sum, dw, None, None


add_rms_norm_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _AddRMSNormEager(torch.autograd.Function):
    """Eager CUDA path: the fused launchers without the op-dispatch layers (see ops/rms_norm.py)."""

    @staticmethod
    def forward(ctx, x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float):
        y, h, rstd = add_rms_norm_fwd(x, residual, weight, eps, offset, eager=True)
        ctx.save_for_backward(h, weight, rstd)
        ctx.offset = offset
        return y, h

    @staticmethod
    def backward(ctx, dy: Tensor, dh: Tensor):
        h, weight, rstd = ctx.saved_tensors
        d_sum, dw = add_rms_norm_bwd(dy, dh, h, weight, rstd, ctx.offset, eager=True)
        return d_sum, d_sum, dw, None, None


def add_rms_norm_eager(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float
) -> tuple[Tensor, Tensor]:
    """Fused add + RMSNorm on CUDA tensors in eager mode, differentiable. Returns (y, h)."""
    return _AddRMSNormEager.apply(x, residual, weight, eps, offset)
