"""Triton kernels registered as torch ops under the `kernel_pytorch::` namespace.

Importing this package imports Triton and registers every op; call them as
`torch.ops.kernel_pytorch.<name>`. `import kernel_pytorch` leaves it out (kernel_pytorch.functional
imports it on first use of a kernel), so the pure-torch reference runs where Triton is missing.
"""

from kernel_pytorch.ops import (  # noqa: F401  (registration)
    add_rms_norm,
    cross_entropy,
    fused_linear_cross_entropy,
    layer_norm,
    rms_norm,
)
from kernel_pytorch.ops.add_rms_norm import add_rms_norm_eager
from kernel_pytorch.ops.cross_entropy import cross_entropy_eager
from kernel_pytorch.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_eager
from kernel_pytorch.ops.layer_norm import layer_norm_eager
from kernel_pytorch.ops.rms_norm import rms_norm_eager

__all__ = [
    "add_rms_norm", "add_rms_norm_eager", "cross_entropy", "cross_entropy_eager", "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_eager", "layer_norm", "layer_norm_eager", "rms_norm", "rms_norm_eager",
]
