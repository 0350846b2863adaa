"""fp8 (e4m3) weight-only matmul, registered as `kernel_pytorch::quant_matmul_fp8_fwd` / `_bwd`.

Math (reference/quant_matmul.py): qweight float8_e4m3fn (N, K), scale fp32 (N,), one per output row,
    y = x @ (float(qweight) * scale[:, None]).T + bias   (..., K) -> (..., N), x's dtype
The kernel (kernels.py) converts each e4m3 tile to x's dtype (exact: 4 significant bits, exponents
2^-9 .. 2^8), in hardware from compute capability 8.9, from the bytes before; multiplies in fp32 and
applies the row scale once at the end: one byte read per weight. Backward: dx and dbias.
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.ops.quant_matmul.config import QuantMatmulConfig
from kernel_pytorch.ops.quant_matmul.launch import quant_matmul, quant_matmul_backward, register_scheme
from kernel_pytorch.reference.quant_matmul import fp8_matmul, fp8_matmul_backward


def fp8_matmul_fwd(x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, *, eager: bool = False,
                   config: QuantMatmulConfig | None = None, native_fp8: bool | None = None) -> Tensor:
    """x (..., K) @ dequant(W).T + bias -> (..., N) of x's dtype; qweight float8_e4m3fn (N, K), scale fp32
    (N,). native_fp8: the hardware conversion (None: where the device has it)."""
    return quant_matmul("fp8", x, qweight, scale, None, 0, bias, eager=eager, config=config, native_fp8=native_fp8)


def fp8_matmul_bwd(dy: Tensor, qweight: Tensor, scale: Tensor, has_bias: bool, *,
                   eager: bool = False) -> tuple[Tensor, Tensor | None]:
    """(dx (..., K), dbias (N,) or None) of dy's dtype."""
    return quant_matmul_backward("fp8", dy, qweight, scale, None, 0, has_bias, eager=eager)


# kernel_pytorch::quant_matmul_fp8_fwd (x, qweight, scale, bias) -> y and _bwd (dy, qweight, scale,
# has_bias) -> (dx, dbias); fp8_matmul_eager(same arguments as _fwd) -> y
fp8_matmul_fwd_op, fp8_matmul_bwd_op, fp8_matmul_eager = register_scheme(
    "fp8", fp8_matmul_fwd, fp8_matmul_bwd, fp8_matmul, fp8_matmul_backward
)
