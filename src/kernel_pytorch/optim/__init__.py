"""Optimizers whose update runs as one kernel launch: `Adam` and `AdamW`, drop-ins for torch.optim's."""

from kernel_pytorch.optim.adam import Adam, AdamW

__all__ = ["Adam", "AdamW"]
