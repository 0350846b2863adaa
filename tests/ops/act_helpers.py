"""Shared pieces of the activation-family kernel tests (gated activations, bias + activation)."""

from __future__ import annotations

import torch
from transformers.activations import ACT2FN

ACTS = ("silu", "gelu", "gelu_tanh", "relu")
# transformers' ACT2FN name of each of ours
HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}

def hf_act(name: str):
    """transformers' activation module for our activation name."""
    return ACT2FN[HF_ACT[name]]


def gate_input(*shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Gate values over the activations' interesting range (both tails, the bend near 0), never 0."""
    return (torch.randn(*shape, device=device) * 3.0 + 0.25).to(dtype)


def bitwise_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements of a and b that are bitwise equal."""
    return (a == b).float().mean().item() if a.numel() else 1.0
