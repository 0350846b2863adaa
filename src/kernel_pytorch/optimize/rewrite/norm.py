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
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.fx
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch.functional._dispatch import KERNEL_DTYPES
from kernel_pytorch.optimize.rewrite.pattern import Pattern


def kp_rms_norm_llama(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Our RMSNorm, Llama's rounding (one node in a rewritten graph)."""
    return kp_functional.rms_norm(x, weight, float(eps), casting="llama")


def kp_rms_norm_none(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Our RMSNorm, products in x's dtype (one node in a rewritten graph)."""
    return kp_functional.rms_norm(x, weight, float(eps), casting="none")


torch.fx.wrap("kp_rms_norm_llama")
torch.fx.wrap("kp_rms_norm_none")


def _call(casting: str, x: Tensor, weight: Tensor, eps: Any) -> Tensor:
    # by their global names, which torch.fx.wrap patches while a replacement is traced
    if casting == "llama":
        return kp_rms_norm_llama(x, weight, eps)
    return kp_rms_norm_none(x, weight, eps)


def _replace(casting: str, with_dtype: bool) -> Callable[..., Tensor]:
    """The replacement taking the search's arguments (a dtype literal among them or not)."""
    def replace(x: Tensor, weight: Tensor, eps: Any, dtype: Any) -> Tensor:
        return _call(casting, x, weight, eps)

    def replace3(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
        return _call(casting, x, weight, eps)
    return replace if with_dtype else replace3


def _op(casting: str, with_dtype: bool) -> Callable[..., Tensor]:
    """The replacement as the registered op (Pattern.op)."""
    def op(x: Tensor, weight: Tensor, eps: Any, dtype: Any) -> Tensor:
        return torch.ops.kernel_pytorch.rms_norm_fwd(x, weight, eps, 0.0, casting)[0]

    def op3(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
        return torch.ops.kernel_pytorch.rms_norm_fwd(x, weight, eps, 0.0, casting)[0]
    return op if with_dtype else op3


def fits(values: Mapping[str, Any]) -> bool:
    """Whether our op takes these example values: x (..., D) of a kernel dtype, weight (D,), eps a number."""
    x, weight, eps = values.get("x"), values.get("weight"), values.get("eps")
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor) and isinstance(eps, (int, float))):
        return False
    return (x.dim() >= 1 and x.dtype in KERNEL_DTYPES and x.device.type in ("cuda", "cpu")
            and weight.dim() == 1 and weight.shape[0] == x.shape[-1] and weight.device == x.device)


SQUARES: dict[str, Callable[[Tensor], Tensor]] = {
    "pow": lambda h: h.pow(2),
    "starstar": lambda h: h ** 2,
    "mul": lambda h: h * h,
}
MEANS: dict[str, Callable[[Tensor], Tensor]] = {
    "mean": lambda s: s.mean(-1, keepdim=True),
    "mean_dim": lambda s: s.mean(dim=-1, keepdim=True),
    "torch_mean": lambda s: torch.mean(s, dim=-1, keepdim=True),
}
ROOTS: dict[str, Callable[[Tensor, Tensor, Any], Tensor]] = {
    "rsqrt": lambda h, v, eps: h * torch.rsqrt(v + eps),
    "sqrt": lambda h, v, eps: h / torch.sqrt(v + eps),
}
# (cast in, cast back): back to x.dtype as written, or to a dtype literal (Dynamo folds x.dtype)
CASTS: dict[str, tuple[Callable[[Tensor], Tensor], bool] | None] = {
    "none": None,
    "to": (lambda x: x.to(torch.float32), False),
    "float": (lambda x: x.float(), False),
    "to.literal": (lambda x: x.to(torch.float32), True),
    "float.literal": (lambda x: x.float(), True),
}


def search_function(square: Callable, mean: Callable, root: Callable, cast: Callable | None, literal: bool,
            left: bool) -> Callable:
    """The search function of one spelling: (x, weight, eps[, dtype]) -> y."""
    if cast is None:
        def search(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
            y = root(x, mean(square(x)), eps)
            return weight * y if left else y * weight
    elif literal:
        def search(x: Tensor, weight: Tensor, eps: Any, dtype: Any) -> Tensor:
            h = cast(x)
            y = root(h, mean(square(h)), eps).to(dtype)
            return weight * y if left else y * weight
    else:
        def search(x: Tensor, weight: Tensor, eps: Any) -> Tensor:
            dtype = x.dtype
            h = cast(x)
            y = root(h, mean(square(h)), eps).to(dtype)
            return weight * y if left else y * weight
    return search


class Spelling(NamedTuple):
    """One spelling of the norm: its name (cast.square.mean.root.side), its search function
    (`search_function`), the casting that rounds as it does, and whether it casts back to a dtype literal."""

    name: str
    search: Callable
    casting: str
    literal: bool


def spellings(squares: Mapping[str, Callable] = SQUARES, means: Mapping[str, Callable] = MEANS) -> list[Spelling]:
    """Every spelling over these squares and means, and all of ROOTS, CASTS and the weight's sides."""
    out = []
    for (sq, square), (mn, mean), (rt, root), (cs, cast), left in itertools.product(
        squares.items(), means.items(), ROOTS.items(), CASTS.items(), (True, False)
    ):
        literal = cast is not None and cast[1]
        side = "weight_left" if left else "weight_right"
        out.append(Spelling(f"{cs}.{sq}.{mn}.{rt}.{side}",
                            search_function(square, mean, root, cast[0] if cast else None, literal, left),
                            "none" if cast is None else "llama", literal))
    return out


def _patterns() -> tuple[Pattern, ...]:
    return tuple(
        Pattern(
            name=f"rms_norm.{s.name}",
            kind="rms-norm",
            family="norm",
            search=s.search,
            replace=_replace(s.casting, s.literal),
            op=_op(s.casting, s.literal),
            anchor="mean",
            what=f"kernel_pytorch.functional.rms_norm(casting={s.casting!r})",
            fits=fits,
            weight="weight",
            dtype="dtype" if s.literal else None,
        )
        for s in spellings()
    )


NORM_PATTERNS = _patterns()

__all__ = ["CASTS", "MEANS", "NORM_PATTERNS", "ROOTS", "SQUARES", "Spelling", "fits", "kp_rms_norm_llama",
           "kp_rms_norm_none", "search_function", "spellings"]
