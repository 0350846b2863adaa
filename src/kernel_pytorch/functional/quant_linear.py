"""A linear layer over a weight-only quantized weight: y = x @ dequant(W).T + bias.

The weight is given as its parts (reference/quant_matmul.py's `quantize`):
    "int8"  qweight int8 (N, K), scale (N,)                     one scale per output row
    "fp8"   qweight float8_e4m3fn (N, K), scale (N,)            one scale per output row
    "int4"  qweight uint8 (N, K/2), scale (N, G), zero uint8 (N, G), G = ceil(K / group_size)
On CUDA the kernels of ops/quant_matmul read the parts and dequantize in registers (the weight is read
once, at its quantized size: what decoding is bound by); elsewhere the reference dequantizes and
multiplies in fp32. Gradients reach x and bias; the quantized weight is frozen.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch.functional._dispatch import Backend, _check_float, _check_same_device, _resolve, kernels
from kernel_pytorch.reference.quant_matmul import INT4_GROUPS, SCHEMES

_QWEIGHT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "int4": torch.uint8}


def _check_shape(name: str, t: Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} ({what}), got {tuple(t.shape)}")


def _check(x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, scheme: str, zero: Tensor | None,
           group_size: int | None) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    _check_float("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., in_features)")
    for name, t in (("qweight", qweight), ("scale", scale)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor (got {type(t).__name__})")
    if qweight.dtype != _QWEIGHT_DTYPES[scheme] or qweight.dim() != 2:
        raise TypeError(f"qweight of scheme {scheme!r} must be a 2-D {_QWEIGHT_DTYPES[scheme]} tensor, "
                        f"got {qweight.dtype} of shape {tuple(qweight.shape)}")
    _check_float("scale", scale)
    n, k = qweight.shape[0], x.shape[-1]
    if scheme == "int4":
        if group_size not in INT4_GROUPS:
            raise ValueError(f"group_size must be one of {INT4_GROUPS} for int4, got {group_size!r}")
        if not isinstance(zero, Tensor) or zero.dtype != torch.uint8:
            raise TypeError(f"zero must be a uint8 tensor for int4 (got {getattr(zero, 'dtype', zero)!r})")
        _check_shape("qweight", qweight, (n, k // 2), "two 4-bit values per byte along K")
        if k % 2:
            raise ValueError(f"int4 needs an even number of input features, x has {k}")
        groups = -(-k // group_size)
        _check_shape("scale", scale, (n, groups), f"one per group of {group_size} inputs")
        _check_shape("zero", zero, (n, groups), f"one per group of {group_size} inputs")
    else:
        if zero is not None or group_size is not None:
            raise ValueError(f"zero and group_size are int4's; scheme {scheme!r} takes neither")
        _check_shape("qweight", qweight, (n, k), "(out_features, in_features of x)")
        _check_shape("scale", scale, (n,), "one per output row")
    if bias is not None:
        _check_float("bias", bias)
        _check_shape("bias", bias, (n,), "one per output row")
        if bias.dtype != x.dtype:
            raise TypeError(f"bias must have x's dtype {x.dtype} (got {bias.dtype})")
    _check_same_device("x", x, qweight=qweight, scale=scale, zero=zero, bias=bias)


def quant_linear(
    x: Tensor,
    qweight: Tensor,
    scale: Tensor,
    bias: Tensor | None = None,
    *,
    scheme: str,
    zero: Tensor | None = None,
    group_size: int | None = None,
    backend: Backend = "auto",
) -> Tensor:
    """y = x @ dequant(W).T + bias over a quantized weight (module docstring for the parts).

    Args:
        x: (..., K) fp32/bf16/fp16 (fp64 runs the reference).
        qweight, scale: the weight's parts; zero and group_size: int4's (None for int8 and fp8).
        bias: optional (N,) of x's dtype.
        scheme: "int8", "int4" or "fp8".
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
    Returns:
        (..., N) of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check(x, qweight, scale, bias, scheme, zero, group_size)
    weight = (qweight, scale, zero, group_size) if scheme == "int4" else (qweight, scale)
    path = _resolve(backend, "quant_linear", x, compiling)
    if path == "reference":
        return getattr(reference, f"{scheme}_matmul")(x, *weight, bias)
    if path == "eager":
        return getattr(kernels(), f"{scheme}_matmul_eager")(x, *weight, bias)
    return getattr(torch.ops.kernel_pytorch, f"quant_matmul_{scheme}_fwd")(x, *weight, bias)
