"""Norm family rewrites, the residual form: a residual add whose sum feeds a hand-written RMSNorm ->
`kernel_pytorch.functional.add_rms_norm`, which adds, writes the new residual stream and normalises in
one pass instead of the norm reading the sum back.

    h = x + residual;  y = rms_norm(h) * weight      ->  y, h = add_rms_norm(x, residual, weight, eps)

x, residual: (..., D) of one shape and dtype; weight: (D,). The norm's spellings are `norm.py`'s (fewer:
the square as `pow(2)` or `h * h`, the mean as a method), the add in either order. Tried before the
plain norm's patterns, so a norm after a residual add becomes the fused pair.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch.optimize.rewrite import norm
from kernel_pytorch.optimize.rewrite.pattern import Pattern


def kp_add_rms_norm_llama(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Our add + RMSNorm, Llama's rounding (one node in a rewritten graph): (y, x + residual)."""
    return kp_functional.add_rms_norm(x, residual, weight, float(eps), casting="llama")


def kp_add_rms_norm_none(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Our add + RMSNorm, products in x's dtype (one node in a rewritten graph): (y, x + residual)."""
    return kp_functional.add_rms_norm(x, residual, weight, float(eps), casting="none")


torch.fx.wrap("kp_add_rms_norm_llama")
torch.fx.wrap("kp_add_rms_norm_none")


def _call(casting: str, x: Tensor, residual: Tensor, weight: Tensor, eps: Any) -> tuple[Tensor, Tensor]:
    # by their global names, which torch.fx.wrap patches while a replacement is traced
    if casting == "llama":
        out = kp_add_rms_norm_llama(x, residual, weight, eps)
    else:
        out = kp_add_rms_norm_none(x, residual, weight, eps)
    return out[0], out[1]


def _replace(casting: str, with_dtype: bool) -> Callable[..., tuple[Tensor, Tensor]]:
    def replace(x: Tensor, residual: Tensor, weight: Tensor, eps: Any, dtype: Any) -> tuple[Tensor, Tensor]:
        return _call(casting, x, residual, weight, eps)

    def replace4(x: Tensor, residual: Tensor, weight: Tensor, eps: Any) -> tuple[Tensor, Tensor]:
        return _call(casting, x, residual, weight, eps)
    return replace if with_dtype else replace4


def _op(casting: str, with_dtype: bool) -> Callable[..., tuple[Tensor, Tensor]]:
    def op(x: Tensor, residual: Tensor, weight: Tensor, eps: Any, dtype: Any) -> tuple[Tensor, Tensor]:
        out = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, residual, weight, eps, 0.0, casting)
        return out[0], out[1]

    def op4(x: Tensor, residual: Tensor, weight: Tensor, eps: Any) -> tuple[Tensor, Tensor]:
        out = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, residual, weight, eps, 0.0, casting)
        return out[0], out[1]
    return op if with_dtype else op4


def fits(values: Mapping[str, Any]) -> bool:
    """`norm.fits` for the sum's operands: x and residual of one shape, dtype and device."""
    x, residual = values.get("x"), values.get("residual")
    return (isinstance(x, Tensor) and isinstance(residual, Tensor) and x.shape == residual.shape
            and x.dtype == residual.dtype and x.device == residual.device and norm.fits(values))


def _search(normed: Callable, literal: bool, x_first: bool) -> Callable:
    """The residual add, in either order, feeding `normed` (one of norm.spellings' search functions)."""
    if literal:
        def search(x: Tensor, residual: Tensor, weight: Tensor, eps: Any, dtype: Any) -> tuple[Tensor, Tensor]:
            h = x + residual if x_first else residual + x
            return normed(h, weight, eps, dtype), h
    else:
        def search(x: Tensor, residual: Tensor, weight: Tensor, eps: Any) -> tuple[Tensor, Tensor]:
            h = x + residual if x_first else residual + x
            return normed(h, weight, eps), h
    return search


def _patterns() -> tuple[Pattern, ...]:
    squares = {k: norm.SQUARES[k] for k in ("pow", "mul")}
    means = {k: norm.MEANS[k] for k in ("mean", "mean_dim")}
    return tuple(
        Pattern(
            name=f"add_rms_norm.{s.name}.{'x_first' if x_first else 'residual_first'}",
            kind="residual-norm",
            family="norm",
            search=_search(s.search, s.literal, x_first),
            replace=_replace(s.casting, s.literal),
            op=_op(s.casting, s.literal),
            anchor="add",  # the residual add: the first node of the search, as the analyser's finding names it
            what=f"kernel_pytorch.functional.add_rms_norm(casting={s.casting!r})",
            fits=fits,
            weight="weight",
            dtype="dtype" if s.literal else None,
        )
        for s in norm.spellings(squares, means)
        for x_first in (True, False)
    )


RESIDUAL_NORM_PATTERNS = _patterns()

__all__ = ["RESIDUAL_NORM_PATTERNS", "fits", "kp_add_rms_norm_llama", "kp_add_rms_norm_none"]
