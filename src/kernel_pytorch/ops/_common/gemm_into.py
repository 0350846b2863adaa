"""A GEMM written into an existing buffer: out = a @ b, or out += a @ b, as a registered op that mutates
`out` (`kernel_pytorch::gemm_into_`).

Shapes: out (M, N) (or a view of rows of a larger buffer), a (M, K), b (K, N); out of a's dtype, or fp32
for a low-precision a and b (the accumulator of fused_linear_cross_entropy's grad_w_fp32 mode).

Why an op and not `torch.addmm(out, a, b, out=out)`: under torch.compile a Triton op's body is traced
functionally, and an `out=` accumulation becomes an out-of-place addmm into a new buffer, which ATen
starts by copying `out` into it (addmm whose result is not `self` copies `self` first). For the fused
linear cross-entropy's grad_W that is one copy of the (V, H) accumulator per chunk after the first (525 MB
each for a 128256 x 2048 bf16 head, 7 per 8-chunk step) and a second accumulator alive during each.
An op that declares its mutation is put back in place by Inductor's reinplace pass when nothing reads
the old value, as here. Eager callers use `gemm_into` with eager=True: the same math, no dispatcher.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@functools.cache
def fp32_accumulate_in_place(device: torch.device) -> bool:
    """Whether this torch adds a product of low-precision matrices into an fp32 matrix in place on
    `device` (addmm with out_dtype=float32 and an fp32 `self`; some releases take only a `self` of the
    operands' dtype, and CPUs have no mixed-dtype product). Tried once on a 1 x 1 product."""
    try:
        acc = torch.zeros(1, 1, device=device)
        one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
        torch.addmm(acc, one, one, out_dtype=torch.float32, out=acc)
        return bool(acc.item() == 1.0)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _gemm_into(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """out (+)= a @ b in place: written without reading out (accumulate False), or added to it."""
    beta = 1.0 if accumulate else 0.0
    if out.dtype == a.dtype:
        if accumulate:
            torch.addmm(out, a, b, out=out)
        else:
            torch.mm(a, b, out=out)
    elif fp32_accumulate_in_place(out.device):  # cuBLAS reads and writes the fp32 accumulator itself
        torch.addmm(out, a, b, beta=beta, out_dtype=torch.float32, out=out)
    elif out.is_cuda:  # an fp32 product, then added: an (M, N) fp32 temporary
        product = torch.mm(a, b, out_dtype=torch.float32)
        if accumulate:
            out.add_(product)
        else:
            out.copy_(product)
    else:  # upcast operands (bf16 and fp16 products are exact in fp32)
        torch.addmm(out, a.float(), b.float(), beta=beta, out=out)


@torch.library.custom_op("kernel_pytorch::gemm_into_", mutates_args=("out",))
def gemm_into_op(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """Registered kernel_pytorch::gemm_into_: out (+)= a @ b in place (module docstring)."""
    _gemm_into(out, a, b, accumulate)


@gemm_into_op.register_fake
def _gemm_into_fake(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    return None


def gemm_into(out: Tensor, a: Tensor, b: Tensor, accumulate: bool, *, eager: bool = False) -> Tensor:
    """out = a @ b (accumulate False: out is written, not read) or out += a @ b, in place.

    Args:
        out: (M, N), a's dtype or fp32; a: (M, K); b: (K, N).
        accumulate: add to out rather than overwrite it.
        eager: call the GEMM directly rather than through the registered op (which compile keeps in
            place; module docstring).
    Returns:
        out.
    """
    if eager:
        _gemm_into(out, a, b, accumulate)
    else:
        gemm_into_op(out, a, b, accumulate)
    return out


__all__ = ["fp32_accumulate_in_place", "gemm_into"]
