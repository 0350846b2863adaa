"""Chapter 4's exercise: squared ReLU, relu(x)^2, as Triton kernels and a registered op."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

BLOCK = 1024


@triton.jit
def _sq_relu_fwd(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(X + offs, mask=mask).to(tl.float32), 0.0)
    tl.store(Y + offs, (r * r).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _sq_relu_bwd(DY, X, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(X + offs, mask=mask).to(tl.float32), 0.0)
    dy = tl.load(DY + offs, mask=mask).to(tl.float32)
    tl.store(DX + offs, (2.0 * r * dy).to(DX.dtype.element_ty), mask=mask)


def squared_relu_fwd(x: Tensor) -> Tensor:
    """x: any shape -> relu(x)^2, x's shape and dtype, contiguous."""
    x = x.contiguous()
    y = torch.empty_like(x)
    wrap_triton(_sq_relu_fwd)[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def squared_relu_bwd(dy: Tensor, x: Tensor) -> Tensor:
    """dy, x: the same shape -> 2 relu(x) dy, contiguous."""
    dy, x = dy.contiguous(), x.contiguous()
    dx = torch.empty_like(x)
    wrap_triton(_sq_relu_bwd)[(triton.cdiv(x.numel(), BLOCK),)](dy, x, dx, x.numel(), BLOCK=BLOCK)
    return dx


@triton_op("guide_solutions::squared_relu", mutates_args=())
def squared_relu(x: Tensor) -> Tensor:
    if x.is_cuda:
        return squared_relu_fwd(x)
    return torch.relu(x.float()).square().to(x.dtype).contiguous()


@triton_op("guide_solutions::squared_relu_bwd", mutates_args=())
def squared_relu_backward(dy: Tensor, x: Tensor) -> Tensor:
    if x.is_cuda:
        return squared_relu_bwd(dy, x)
    return (2 * torch.relu(x.float()) * dy.float()).to(x.dtype).contiguous()


@squared_relu.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@squared_relu_backward.register_fake
def _(dy: Tensor, x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dy: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return torch.ops.guide_solutions.squared_relu_bwd(dy, x)


squared_relu.register_autograd(_backward, setup_context=_setup)

SOLUTION = (squared_relu_fwd, squared_relu_bwd, torch.ops.guide_solutions.squared_relu.default)
