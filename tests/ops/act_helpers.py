"""Shared pieces of the activation-family kernel tests (gated activations, bias + activation)."""

from __future__ import annotations

import torch
from transformers.activations import ACT2FN

from kernel_pytorch.tolerances import fp64_budget

ACTS = ("silu", "gelu", "gelu_tanh", "relu")
# transformers' ACT2FN name of each of ours
HF_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}

def hf_act(name: str):
    """transformers' activation module for our activation name."""
    return ACT2FN[HF_ACT[name]]


def gate_input(*shape: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """Gate values over the activations' interesting range (both tails, the bend near 0), never 0."""
    return (torch.randn(*shape, device=device) * 3.0 + 0.25).to(dtype)


def assert_matches_eager(ours: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """`ours` is bitwise eager's result (fp32 math, rounded once) where eager computes that way. torch's
    CPU fp16 GELU kernel does not on some x86 CPUs (AVX2 EPYC: up to 5 fp16 ulps from fp32-and-round-once),
    so there, and only for fp16 on the CPU, `ours` is judged against `exact` (the fp64 result) by the
    fp64 budget: no further from it than eager is, up to the budget's factor."""
    if torch.equal(ours, eager):
        return
    assert ours.dtype == torch.float16 and ours.device.type == "cpu", f"{what}: not bitwise eager's"
    result = fp64_budget(ours, eager, exact)
    assert result.passed, result.message(what)


def bitwise_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements of a and b that are bitwise equal."""
    return (a == b).float().mean().item() if a.numel() else 1.0
