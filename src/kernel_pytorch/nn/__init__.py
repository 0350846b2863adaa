"""Drop-in modules backed by kernel_pytorch's kernels."""

from kernel_pytorch.nn.loss import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from kernel_pytorch.nn.norm import FusedAddRMSNorm, LayerNorm, RMSNorm

__all__ = ["CrossEntropyLoss", "FusedAddRMSNorm", "FusedLinearCrossEntropyLoss", "LayerNorm", "RMSNorm"]
