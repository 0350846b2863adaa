"""Drop-in modules backed by kernel_pytorch's kernels."""

from kernel_pytorch.nn.mlp import MLP, GatedMLP
from kernel_pytorch.nn.norm import FusedAddRMSNorm, LayerNorm, RMSNorm

__all__ = ["MLP", "FusedAddRMSNorm", "GatedMLP", "LayerNorm", "RMSNorm"]
