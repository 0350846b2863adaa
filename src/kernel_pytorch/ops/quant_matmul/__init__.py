"""Weight-only quantized matmuls (int8, int4 with groups, fp8 e4m3): y = x @ dequant(W).T + bias with the
weight dequantized in registers, one registered op per scheme.

    config.py   QuantMatmulConfig, the "quant_matmul" tuning family (which path for which M, tiles)
    kernels.py  the Triton kernels: the matmul (split-K and tiled), the split sum, the dequantization
    gemv.py     the M = 1 kernel: the weight read once, dequantized in a few full-rate instructions
    launch.py   plans and launchers shared by the schemes
    int8.py, int4.py, fp8.py   each scheme's launchers and its register_op

The math and the quantizers are reference/quant_matmul.py's.
"""

from kernel_pytorch.ops.quant_matmul.config import (
    GemvLaunch,
    QuantMatmulConfig,
    SchemeLaunch,
    SplitKLaunch,
    TileLaunch,
)
from kernel_pytorch.ops.quant_matmul.fp8 import fp8_matmul_bwd, fp8_matmul_eager, fp8_matmul_fwd
from kernel_pytorch.ops.quant_matmul.int4 import int4_matmul_bwd, int4_matmul_eager, int4_matmul_fwd
from kernel_pytorch.ops.quant_matmul.int8 import int8_matmul_bwd, int8_matmul_eager, int8_matmul_fwd
from kernel_pytorch.ops.quant_matmul.launch import dequantize, plan, quant_matmul

__all__ = [
    "GemvLaunch",
    "QuantMatmulConfig",
    "SchemeLaunch",
    "SplitKLaunch",
    "TileLaunch",
    "dequantize",
    "fp8_matmul_bwd",
    "fp8_matmul_eager",
    "fp8_matmul_fwd",
    "int4_matmul_bwd",
    "int4_matmul_eager",
    "int4_matmul_fwd",
    "int8_matmul_bwd",
    "int8_matmul_eager",
    "int8_matmul_fwd",
    "plan",
    "quant_matmul",
]
