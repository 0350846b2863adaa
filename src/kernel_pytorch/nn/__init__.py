"""Drop-in modules backed by kernel_pytorch's kernels."""

from kernel_pytorch.nn._recompute import recompute_norm_outputs
from kernel_pytorch.nn.attention import (
    Attention,
    LoopAttention,
    MemoryEfficientAttention,
    StandardAttention,
    StaticKVCache,
)
from kernel_pytorch.nn.cross_entropy import (
    CrossEntropyLoss,
    FusedLinearCrossEntropyLoss,
    VocabParallelLinearCrossEntropyLoss,
)
from kernel_pytorch.nn.embedding import (
    ALiBi,
    Embedding,
    LearnedPositionalEmbedding,
    ScaledEmbedding,
    SinusoidalPositionalEmbedding,
)
from kernel_pytorch.nn.mlp import MLP, GatedMLP
from kernel_pytorch.nn.norm import FusedAddRMSNorm, LayerNorm, RMSNorm
from kernel_pytorch.nn.quant_linear import QuantizedLinear
from kernel_pytorch.nn.rope import RotaryEmbedding

__all__ = [
    "MLP",
    "ALiBi",
    "Attention",
    "CrossEntropyLoss",
    "Embedding",
    "FusedAddRMSNorm",
    "FusedLinearCrossEntropyLoss",
    "GatedMLP",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "LoopAttention",
    "MemoryEfficientAttention",
    "QuantizedLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "ScaledEmbedding",
    "SinusoidalPositionalEmbedding",
    "StandardAttention",
    "StaticKVCache",
    "VocabParallelLinearCrossEntropyLoss",
    "recompute_norm_outputs",
]
