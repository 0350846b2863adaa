"""int4 weight-only matmul with group scales and zero points, registered as
`kernel_pytorch::quant_matmul_int4_fwd` / `_bwd`.

Math (reference/quant_matmul.py): qweight uint8 (N, K/2) holding two 4-bit values per byte along K
(byte j of row n = q[n, 2j] | q[n, 2j + 1] << 4), scale (N, G) and zero uint8 (N, G) per group of
group_size (32, 64 or 128) columns, G = ceil(K / group_size):
    W[n, k] = (q[n, k] - zero[n, k // group_size]) * scale[n, k // group_size]
    y = x @ W.T + bias                                     (..., K) -> (..., N), x's dtype
The tl.dot kernel (kernels.py) reads a tile of K as BLOCK_K / 2 contiguous bytes per row, splits the
nibbles (tl.join puts each byte's pair back side by side), subtracts the zero point (q - zero is an
exact integer in x's dtype) and scales each tile's fp32 sum by its group's scale (a tile never spans
two groups there); the gemv kernel (gemv.py, M = 1) keeps the low and high nibbles as the even and odd
columns of K and scales each run of a group once. Half a byte per weight plus the group's scale and
zero point.
Backward: dx and dbias.
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.ops.quant_matmul.config import QuantMatmulConfig
from kernel_pytorch.ops.quant_matmul.launch import quant_matmul, quant_matmul_backward, register_scheme
from kernel_pytorch.reference.quant_matmul import int4_matmul, int4_matmul_backward


def int4_matmul_fwd(x: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor, group_size: int, bias: Tensor | None,
                    *, eager: bool = False, config: QuantMatmulConfig | None = None) -> Tensor:
    """x (..., K) @ dequant(W).T + bias -> (..., N) of x's dtype; qweight uint8 (N, K/2), scale (N, G),
    zero uint8 (N, G)."""
    return quant_matmul("int4", x, qweight, scale, zero, group_size, bias, eager=eager, config=config)


def int4_matmul_bwd(dy: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor, group_size: int, has_bias: bool, *,
                    eager: bool = False) -> tuple[Tensor, Tensor | None]:
    """(dx (..., K), dbias (N,) or None) of dy's dtype."""
    return quant_matmul_backward("int4", dy, qweight, scale, zero, group_size, has_bias, eager=eager)


# kernel_pytorch::quant_matmul_int4_fwd (x, qweight, scale, zero, group_size, bias) -> y and _bwd (dy,
# qweight, scale, zero, group_size, has_bias) -> (dx, dbias); int4_matmul_eager(as _fwd) -> y
int4_matmul_fwd_op, int4_matmul_bwd_op, int4_matmul_eager = register_scheme(
    "int4", int4_matmul_fwd, int4_matmul_bwd, int4_matmul, int4_matmul_backward,
    weight=("qweight", "scale", "zero"), keep=("group_size",),
)
