"""Cross-entropy of logits over a 32k vocabulary against labels (log-softmax and a gather)."""

import torch
from torch import nn


class Model(nn.Module):
    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, labels)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2048, 32000), torch.randint(0, 32000, (2048,))]


def get_init_inputs() -> list:
    return []
