"""Drop-in modules backed by kernel_pytorch's kernels."""

from kernel_pytorch.nn.attention import (
    Attention,
    LoopAttention,
    MemoryEfficientAttention,
    StandardAttention,
    StaticKVCache,
)
from kernel_pytorch.nn.norm import FusedAddRMSNorm, LayerNorm, RMSNorm

__all__ = [
    "Attention",
    "FusedAddRMSNorm",
    "LayerNorm",
    "LoopAttention",
    "MemoryEfficientAttention",
    "RMSNorm",
    "StandardAttention",
    "StaticKVCache",
]
