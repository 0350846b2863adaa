"""Norm rules: torch.nn.RMSNorm / torch.nn.LayerNorm, and Hugging Face-style RMSNorm modules, to
`kernel_pytorch.nn.RMSNorm` / `LayerNorm`.

Hugging Face norms are recognised by structure and behaviour, not by class name: a leaf module whose
only parameter is a 1-D `weight`, with no buffers and an epsilon (`variance_epsilon` or `eps`), that
computes one of the two RMSNorms on a probe input:

    llama:  (x32 * rstd).to(dtype) * weight        LlamaRMSNorm, Qwen2/3, Mistral, Phi-3 ...
    gemma:  (x32 * rstd * (1 + weight32)).to(dtype)  GemmaRMSNorm (weight stored zero-centred)

The replacement holds the module's own `weight` Parameter, so `state_dict` keys (`...norm.weight`),
dtype, device and optimizer state are unchanged. The replacement rounds as the original does
(`kernel_pytorch.nn.RMSNorm`'s `casting` "llama", "gemma" with offset 1, or "torch").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernel_pytorch import nn as kp_nn
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import (
    DropInRule,
    blocked,
    build_on_meta,
    probe_input,
    run_probe,
    same_output,
)
from kernel_pytorch.reference.rms_norm import rms_norm_rstd

_EPS_ATTRS = ("variance_epsilon", "eps")


def rms_norm_options(style: str) -> dict[str, Any]:
    """Constructor arguments making `kernel_pytorch.nn.RMSNorm` compute `style` ("llama", "gemma",
    "torch")."""
    if style not in ("llama", "gemma", "torch"):
        raise ValueError(f"style must be 'llama', 'gemma' or 'torch' (got {style!r})")
    return {"casting": "gemma", "offset": 1.0} if style == "gemma" else {"casting": style}


def _rms_norm(width: int, eps: float | None, affine: bool, options: dict[str, Any], old: nn.Module) -> nn.Module:
    return _recomputing(build_on_meta(
        lambda: kp_nn.RMSNorm(width, eps=eps, elementwise_affine=affine, device="meta", **options),
        old,
        ("weight",) if affine else (),
    ))


def _recomputing(norm: kp_nn.RMSNorm) -> kp_nn.RMSNorm:
    """In an optimized model our attention and MLP, fed by the norm, keep its input instead of its output
    for their backward (nn/_recompute.py): the norm remembers how to make its output again."""
    norm.recompute_output = True
    return norm


class _TorchNormRule(DropInRule):
    """torch.nn.RMSNorm / LayerNorm -> ours, built with the module's own shape, eps and affinity."""

    family = "norm"

    def build(self, module: nn.Module) -> nn.Module:
        return self.ours(module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
                         device="meta", **self.options(module))

    def options(self, module: nn.Module) -> dict[str, Any]:
        """Constructor arguments of ours beyond the shared ones."""
        raise NotImplementedError


class TorchRMSNormRule(_TorchNormRule):
    """torch.nn.RMSNorm (or a subclass keeping its forward) -> kernel_pytorch.nn.RMSNorm."""

    name = "torch_rms_norm"
    base, ours = nn.RMSNorm, kp_nn.RMSNorm

    def options(self, module: nn.Module) -> dict[str, Any]:
        return rms_norm_options("torch")

    def finish(self, new: nn.Module) -> nn.Module:
        return _recomputing(new)


class TorchLayerNormRule(_TorchNormRule):
    """torch.nn.LayerNorm (or a subclass keeping its forward) -> kernel_pytorch.nn.LayerNorm."""

    name = "torch_layer_norm"
    base, ours = nn.LayerNorm, kp_nn.LayerNorm

    def options(self, module: nn.Module) -> dict[str, Any]:
        return {"bias": module.bias is not None}


def _hf_rms_shape(module: nn.Module) -> tuple[int, float, str] | None:
    """(width, eps, eps attribute) when `module` is shaped like an HF RMSNorm, else None."""
    if isinstance(module, (nn.RMSNorm, nn.LayerNorm)) or next(module.children(), None) is not None:
        return None
    params = dict(module.named_parameters(recurse=False))
    if set(params) != {"weight"} or params["weight"].dim() != 1 or next(module.buffers(), None) is not None:
        return None
    for attr in _EPS_ATTRS:
        eps = getattr(module, attr, None)
        if isinstance(eps, float) and not isinstance(eps, bool):
            return params["weight"].shape[0], eps, attr
    return None


def _gemma_style(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (x32 * rms_norm_rstd(x32, eps).unsqueeze(-1) * (1.0 + weight.float())).to(x.dtype)


class HFRMSNormRule:
    """A Hugging Face-style RMSNorm (any class: recognised by shape and by a probe) ->
    kernel_pytorch.nn.RMSNorm rounding as the original does."""

    name = "hf_rms_norm"
    family = "norm"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        found = _hf_rms_shape(module)
        if found is None:
            return None
        width, eps, attr = found
        if (why := blocked(module)) is not None:
            return Match(None, why)
        x = probe_input(width, module.weight)
        expected = run_probe(module, x)
        if expected is None:
            return None  # does not even take (..., D): not a norm
        kind = type(module).__name__
        new = _rms_norm(width, eps, True, rms_norm_options("llama"), module)
        if same_output(expected, run_probe(new, x)):
            return Match(new, f"{kind} (Llama-style: weight * x_hat in x's dtype, {attr}={eps:g}) "
                              "-> kernel_pytorch.nn.RMSNorm")
        if same_output(expected, _gemma_style(x, module.weight.detach(), eps)):
            options = rms_norm_options("gemma")
            new = _rms_norm(width, eps, True, options, module)
            if same_output(expected, run_probe(new, x)):
                return Match(new, f"{kind} (Gemma-style: (1 + weight), rounded once) -> kernel_pytorch.nn.RMSNorm")
            return Match(None, f"{kind} is Gemma-style but kernel_pytorch.nn.RMSNorm{options} differs on a probe")
        if "norm" in kind.lower():
            return Match(None, f"{kind} has an RMSNorm's parameters but computes neither Llama's nor "
                               "Gemma's RMSNorm on a probe input")
        return None


NORM_RULES = (TorchRMSNormRule(), TorchLayerNormRule(), HFRMSNormRule())

__all__ = ["NORM_RULES", "HFRMSNormRule", "TorchLayerNormRule", "TorchRMSNormRule", "rms_norm_options"]
