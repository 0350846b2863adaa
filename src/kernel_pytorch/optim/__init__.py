"""Optimizers whose update runs as one kernel launch: `AdamW`, a drop-in for torch.optim.AdamW."""

from kernel_pytorch.optim.adamw import AdamW

__all__ = ["AdamW"]
