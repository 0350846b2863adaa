"""Norm family rewrites: a hand-written RMSNorm over the last dim -> `kernel_pytorch.functional.rms_norm`.

    y = weight * (x32 * rsqrt(mean(x32^2, -1) + eps)).to(x.dtype)     x32 = x.float()   (Hugging Face)
    y = x * rsqrt(mean(x^2, -1) + eps) * weight                         (no casts)

x: (..., D), weight: (D,). The spellings covered: the square as `x.pow(2)`, `x ** 2` or `x * x`; the mean
as `.mean(-1, keepdim=True)`, `.mean(dim=-1, keepdim=True)` or `torch.mean(x, dim=-1, keepdim=True)`; the
root as `* torch.rsqrt(...)` or `/ torch.sqrt(...)`; the weight on either side; and the casts of Hugging
Face's LlamaRMSNorm (`x.to(torch.float32)` or `x.float()`, back with `.to(x.dtype)`) or none. With the
casts, the replacement rounds as Llama does (casting="llama"); without, the products stay in x's dtype
(casting="none"). For fp32 x every spelling computes the same function; validation judges the rest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch.optimize.rewrite.pattern import Pattern


def kp_rms_norm_llama(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Our RMSNorm, Llama's rounding (one node in a rewritten graph)."""
    return kp_functional.rms_norm(x, weight, float(eps), casting="llama")


def kp_rms_norm_none(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Our RMSNorm, products in x's dtype (one node in a rewritten graph)."""
    return kp_functional.rms_norm(x, weight, float(eps), casting="none")


torch.fx.wrap("kp_rms_norm_llama")
torch.fx.wrap("kp_rms_norm_none")


def _llama(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return kp_rms_norm_llama(x, weight, eps)


def _none(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return kp_rms_norm_none(x, weight, eps)


_SQUARES: dict[str, Callable[[Tensor], Tensor]] = {
    "pow": lambda h: h.pow(2),
    "starstar": lambda h: h ** 2,
    "mul": lambda h: h * h,
}
_MEANS: dict[str, Callable[[Tensor], Tensor]] = {
    "mean": lambda s: s.mean(-1, keepdim=True),
    "mean_dim": lambda s: s.mean(dim=-1, keepdim=True),
    "torch_mean": lambda s: torch.mean(s, dim=-1, keepdim=True),
}
_ROOTS: dict[str, Callable[[Tensor, Tensor, Any], Tensor]] = {
    "rsqrt": lambda h, v, eps: h * torch.rsqrt(v + eps),
    "sqrt": lambda h, v, eps: h / torch.sqrt(v + eps),
}
_CASTS_IN: dict[str, Callable[[Tensor], Tensor] | None] = {
    "none": None,
    "to": lambda x: x.to(torch.float32),
    "float": lambda x: x.float(),
}


def _search(square: Callable, mean: Callable, root: Callable, cast: Callable | None, left: bool) -> Callable:
    """The search function of one spelling."""
    if cast is None:
        def search(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
            y = root(x, mean(square(x)), eps)
            return weight * y if left else y * weight
    else:
        def search(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
            dtype = x.dtype
            h = cast(x)
            y = root(h, mean(square(h)), eps).to(dtype)
            return weight * y if left else y * weight
    return search


def _patterns() -> tuple[Pattern, ...]:
    out = []
    for (sq, square), (mn, mean), (rt, root), (cs, cast), left in itertools.product(
        _SQUARES.items(), _MEANS.items(), _ROOTS.items(), _CASTS_IN.items(), (True, False)
    ):
        casting = "none" if cast is None else "llama"
        side = "weight_left" if left else "weight_right"
        out.append(Pattern(
            name=f"rms_norm.{cs}.{sq}.{mn}.{rt}.{side}",
            kind="rms-norm",
            family="norm",
            search=_search(square, mean, root, cast, left),
            replace=_none if cast is None else _llama,
            anchor="mean",
            what=f"kernel_pytorch.functional.rms_norm(casting={casting!r})",
            weight="weight",
        ))
    return tuple(out)


NORM_PATTERNS = _patterns()

__all__ = ["NORM_PATTERNS", "kp_rms_norm_llama", "kp_rms_norm_none"]
