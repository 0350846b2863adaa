"""Pure-torch specifications of every op: fp32 math, CPU-runnable, no Triton."""

from kernel_pytorch.reference.add_rms_norm import add_rms_norm, add_rms_norm_backward
from kernel_pytorch.reference.bias_act import bias_act, bias_act_backward
from kernel_pytorch.reference.gated_act import (
    gated_act,
    gated_act_backward,
    gated_act_packed,
    gated_act_packed_backward,
    geglu,
    swiglu,
)
from kernel_pytorch.reference.layer_norm import layer_norm, layer_norm_backward
from kernel_pytorch.reference.rms_norm import rms_norm, rms_norm_backward

__all__ = [
    "add_rms_norm",
    "add_rms_norm_backward",
    "bias_act",
    "bias_act_backward",
    "gated_act",
    "gated_act_backward",
    "gated_act_packed",
    "gated_act_packed_backward",
    "geglu",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "swiglu",
]
