"""Triton kernels registered as torch ops under the `kernel_pytorch::` namespace.

Importing this package imports Triton and registers every op; call them as
`torch.ops.kernel_pytorch.<name>`. `import kernel_pytorch` leaves it out (kernel_pytorch.functional
imports it on first use of a kernel), so the pure-torch reference runs where Triton is missing.
"""

from kernel_pytorch.ops import (  # noqa: F401  (registration)
    adam,
    add_rms_norm,
    bias_act,
    cross_entropy,
    embedding,
    gated_act,
    gated_act_packed,
    gated_down,
    gated_down_packed,
    layer_norm,
    quant_matmul,
    rms_norm,
    rope,
)
from kernel_pytorch.ops.add_rms_norm import add_rms_norm_eager
from kernel_pytorch.ops.bias_act import bias_act_bwd, bias_act_eager, bias_act_fwd
from kernel_pytorch.ops.cross_entropy import cross_entropy_eager, fused_linear_cross_entropy_eager
from kernel_pytorch.ops.cross_entropy import fused_linear as fused_linear_cross_entropy
from kernel_pytorch.ops.embedding import embedding_eager
from kernel_pytorch.ops.gated_act import (
    gated_act_bwd,
    gated_act_eager,
    gated_act_fwd,
    gated_act_packed_bwd,
    gated_act_packed_fwd,
)
from kernel_pytorch.ops.gated_act_packed import gated_act_packed_eager
from kernel_pytorch.ops.gated_down import gated_down_eager
from kernel_pytorch.ops.gated_down_packed import gated_down_packed_eager
from kernel_pytorch.ops.layer_norm import layer_norm_eager
from kernel_pytorch.ops.quant_matmul import fp8_matmul_eager, int4_matmul_eager, int8_matmul_eager
from kernel_pytorch.ops.rms_norm import rms_norm_eager
from kernel_pytorch.ops.rope import rope_eager

__all__ = [
    "adam",
    "add_rms_norm",
    "add_rms_norm_eager",
    "bias_act",
    "bias_act_bwd",
    "bias_act_eager",
    "bias_act_fwd",
    "cross_entropy",
    "cross_entropy_eager",
    "embedding",
    "embedding_eager",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_eager",
    "gated_act",
    "gated_act_bwd",
    "gated_act_eager",
    "gated_act_fwd",
    "gated_act_packed",
    "gated_act_packed_bwd",
    "gated_act_packed_eager",
    "gated_act_packed_fwd",
    "gated_down",
    "gated_down_eager",
    "gated_down_packed",
    "gated_down_packed_eager",
    "fp8_matmul_eager",
    "int4_matmul_eager",
    "int8_matmul_eager",
    "layer_norm",
    "layer_norm_eager",
    "quant_matmul",
    "rms_norm",
    "rms_norm_eager",
    "rope",
    "rope_eager",
]
