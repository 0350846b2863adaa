"""Pure-torch specifications of every op: fp32 math, CPU-runnable, no Triton."""

from kernel_pytorch.reference.add_rms_norm import add_rms_norm, add_rms_norm_backward
from kernel_pytorch.reference.cross_entropy import cross_entropy, cross_entropy_backward
from kernel_pytorch.reference.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_backward,
)
from kernel_pytorch.reference.layer_norm import layer_norm, layer_norm_backward
from kernel_pytorch.reference.rms_norm import rms_norm, rms_norm_backward

__all__ = [
    "add_rms_norm",
    "add_rms_norm_backward",
    "cross_entropy",
    "cross_entropy_backward",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_backward",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
]
