"""Pure-torch specifications of every op: fp32 math, CPU-runnable, no Triton."""

from kernel_pytorch.reference.add_rms_norm import add_rms_norm, add_rms_norm_backward
from kernel_pytorch.reference.attention import attention
from kernel_pytorch.reference.bias_act import bias_act, bias_act_backward
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions, cross_entropy, cross_entropy_backward
from kernel_pytorch.reference.embedding import embedding, embedding_backward
from kernel_pytorch.reference.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_backward,
)
from kernel_pytorch.reference.gated_act import (
    gated_act,
    gated_act_backward,
    gated_act_packed,
    gated_act_packed_backward,
    geglu,
    swiglu,
)
from kernel_pytorch.reference.gated_down import (
    gated_down,
    gated_down_backward,
    gated_down_packed,
    gated_down_packed_backward,
)
from kernel_pytorch.reference.layer_norm import layer_norm, layer_norm_backward
from kernel_pytorch.reference.mlp import gated_mlp, gated_mlp_packed, mlp
from kernel_pytorch.reference.positions import (
    alibi_bias,
    alibi_slopes,
    bloom_alibi,
    learned_positions,
    position_ids_from_attention_mask,
    seq_ids_from_position_ids,
    sinusoidal_positions,
)
from kernel_pytorch.reference.quant_matmul import (
    fp8_matmul,
    fp8_matmul_backward,
    int4_matmul,
    int4_matmul_backward,
    int8_matmul,
    int8_matmul_backward,
)
from kernel_pytorch.reference.rms_norm import rms_norm, rms_norm_backward
from kernel_pytorch.reference.rope import rope, rope_backward
from kernel_pytorch.reference.rope_tables import (
    RotaryConfig,
    cos_sin,
    cos_sin_table,
    inv_freq_and_scaling,
    rotary_config,
)

__all__ = [
    "RotaryConfig",
    "add_rms_norm",
    "add_rms_norm_backward",
    "alibi_bias",
    "attention",
    "alibi_slopes",
    "bias_act",
    "bias_act_backward",
    "bloom_alibi",
    "cos_sin",
    "cos_sin_table",
    "CrossEntropyOptions",
    "cross_entropy",
    "cross_entropy_backward",
    "embedding",
    "embedding_backward",
    "fp8_matmul",
    "fp8_matmul_backward",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_backward",
    "gated_act",
    "gated_act_backward",
    "gated_act_packed",
    "gated_act_packed_backward",
    "gated_down",
    "gated_down_backward",
    "gated_down_packed",
    "gated_down_packed_backward",
    "gated_mlp",
    "gated_mlp_packed",
    "geglu",
    "int4_matmul",
    "int4_matmul_backward",
    "int8_matmul",
    "int8_matmul_backward",
    "inv_freq_and_scaling",
    "layer_norm",
    "layer_norm_backward",
    "learned_positions",
    "mlp",
    "position_ids_from_attention_mask",
    "rms_norm",
    "rms_norm_backward",
    "rope",
    "rope_backward",
    "rotary_config",
    "seq_ids_from_position_ids",
    "sinusoidal_positions",
    "swiglu",
]
