"""int8 weight-only matmul, registered as `kernel_pytorch::quant_matmul_int8_fwd` / `_bwd`.

Math (reference/quant_matmul.py): qweight int8 (N, K), scale fp32 (N,), one per output row (symmetric),
    y = x @ (qweight * scale[:, None]).T + bias          (..., K) -> (..., N), x's dtype
The kernel (kernels.py) converts each int8 tile to x's dtype (exact), multiplies in fp32 and applies the
row scale once at the end: one byte read per weight. Backward: dx and dbias (the weight is frozen).
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.ops.quant_matmul.config import QuantMatmulConfig
from kernel_pytorch.ops.quant_matmul.launch import quant_matmul, quant_matmul_backward, register_scheme
from kernel_pytorch.reference.quant_matmul import int8_matmul, int8_matmul_backward


def int8_matmul_fwd(x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None, *, eager: bool = False,
                    config: QuantMatmulConfig | None = None) -> Tensor:
    """x (..., K) @ dequant(W).T + bias -> (..., N) of x's dtype; qweight int8 (N, K), scale fp32 (N,)."""
    return quant_matmul("int8", x, qweight, scale, None, 0, bias, eager=eager, config=config)


def int8_matmul_bwd(dy: Tensor, qweight: Tensor, scale: Tensor, has_bias: bool, *,
                    eager: bool = False) -> tuple[Tensor, Tensor | None]:
    """(dx (..., K), dbias (N,) or None) of dy's dtype."""
    return quant_matmul_backward("int8", dy, qweight, scale, None, 0, has_bias, eager=eager)


# kernel_pytorch::quant_matmul_int8_fwd (x, qweight, scale, bias) -> y and _bwd (dy, qweight, scale,
# has_bias) -> (dx, dbias); int8_matmul_eager(same arguments as _fwd) -> y
int8_matmul_fwd_op, int8_matmul_bwd_op, int8_matmul_eager = register_scheme(
    "int8", int8_matmul_fwd, int8_matmul_bwd, int8_matmul, int8_matmul_backward
)
