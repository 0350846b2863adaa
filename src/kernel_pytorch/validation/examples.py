"""Ready-made factories for trying `validate_optimization` and `kernel-pytorch validate`.

    kernel-pytorch validate kernel_pytorch.validation.examples:rms_norm_pair
    kernel-pytorch validate kernel_pytorch.validation.examples:llama_rms_norm \
        kernel_pytorch.validation.examples:our_rms_norm

Each factory builds small CPU fp32 modules; move them with `--device cuda --dtype bf16`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import nn as kpnn
from kernel_pytorch.models.llama import LlamaRMSNorm

HIDDEN = 1024
TOKENS = 64
EPS = 1e-6


def _inputs() -> tuple[Tensor]:
    return (torch.randn(TOKENS, HIDDEN),)


def _trained_weight(norm: torch.nn.Module) -> None:
    # a freshly built norm has weight = 1, which would hide a kernel that ignores the weight
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.1 * torch.randn(HIDDEN))


def llama_rms_norm() -> tuple[LlamaRMSNorm, tuple[Tensor]]:
    """Hugging Face-style LlamaRMSNorm(1024) and x of shape (64, 1024)."""
    norm = LlamaRMSNorm(HIDDEN, eps=EPS)
    _trained_weight(norm)
    return norm, _inputs()


def our_rms_norm() -> tuple[kpnn.RMSNorm, tuple[Tensor]]:
    """kernel_pytorch.nn.RMSNorm(1024) (Triton on CUDA) and x of shape (64, 1024), rounding as
    LlamaRMSNorm does (casting="llama"), since it is compared with `llama_rms_norm`."""
    norm = kpnn.RMSNorm(HIDDEN, eps=EPS, casting="llama")
    _trained_weight(norm)
    return norm, _inputs()


class _WrongEpsRMSNorm(LlamaRMSNorm):
    """A deliberately wrong "optimization": eps 1e-2 instead of 1e-6."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-2)
        return self.weight * h.to(hidden_states.dtype)


def wrong_rms_norm() -> tuple[LlamaRMSNorm, tuple[Tensor]]:
    """An RMSNorm with the wrong eps: validation must fail it (small inputs make eps matter)."""
    norm = _WrongEpsRMSNorm(HIDDEN, eps=EPS)
    _trained_weight(norm)
    return norm, (0.05 * torch.randn(TOKENS, HIDDEN),)


def rms_norm_pair() -> tuple[LlamaRMSNorm, kpnn.RMSNorm, tuple[Tensor]]:
    """(original, optimized, inputs): LlamaRMSNorm and our RMSNorm holding the same weight, with
    Llama's rounding (casting="llama")."""
    original, inputs = llama_rms_norm()
    optimized = kpnn.RMSNorm(HIDDEN, eps=EPS, casting="llama")
    optimized.load_state_dict(original.state_dict())
    return original, optimized, inputs


__all__ = ["llama_rms_norm", "our_rms_norm", "rms_norm_pair", "wrong_rms_norm"]
