"""Drop-in modules backed by kernel_pytorch's kernels."""

from kernel_pytorch.nn.embedding import ALiBi, Embedding, LearnedPositionalEmbedding, SinusoidalPositionalEmbedding
from kernel_pytorch.nn.norm import FusedAddRMSNorm, LayerNorm, RMSNorm
from kernel_pytorch.nn.rope import RotaryEmbedding

__all__ = [
    "ALiBi",
    "Embedding",
    "FusedAddRMSNorm",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositionalEmbedding",
]
