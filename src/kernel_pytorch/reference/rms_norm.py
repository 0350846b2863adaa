"""RMSNorm, with the rounding of the model whose module it replaces.

For x of shape (..., D) and weight of shape (D,), math in x's accumulation dtype (fp32; fp64 for fp64
x, reference/_math.py; an fp64 weight promotes the product to fp64), y of x's shape and dtype:

    rstd = 1 / sqrt(mean(x^2, -1) + eps)
    x_hat = x * rstd
    y = x_hat * (offset + weight)          # offset=1 gives Gemma's (1 + weight)

`casting` says where the result is rounded to x's dtype (the modes differ only for bf16/fp16 x):

    "llama"  HF LlamaRMSNorm: x_hat is rounded to x's dtype, then multiplied by (offset + weight) in
             fp32 and rounded again: y = (x_hat.to(dtype) * (offset + weight)).to(dtype). Two roundings.
             (HF multiplies in torch's promotion of the two dtypes: for a weight of x's dtype that is
             this fp32 product rounded once, the same bits; for an fp32 weight HF returns fp32, we x's
             dtype.)
    "gemma"  HF GemmaRMSNorm (Gemma 1-3): x_hat * (1.0 + weight.float()) in fp32, rounded once at the
             end: y = (x_hat * (offset + weight)).to(dtype). Use with offset=1.0.
    "torch"  torch.nn.RMSNorm / F.rms_norm (torch 2.6-2.13: the CPU composite and its decomposition
             upcast x, multiply x * rstd * weight in fp32 and round once with type_as(x); the CUDA
             kernel does the same in its fp32 accumulation type). The same rounding as "gemma".
    "none"   Liger-Kernel's casting_mode="none": the statistic in fp32, the products in x's dtype, as
             torch computes `x * rstd.to(dtype) * (offset + weight).to(dtype)` on bf16/fp16 tensors:
             rstd and offset + weight are rounded to x's dtype, x * rstd is rounded, y is rounded. Four
             roundings: the least accurate mode, for a model trained with it.

"gemma" and "torch" are one computation under two names, so a call site says which model it matches.
(Corners where the models themselves part: torch multiplies an fp64 weight in fp64, Gemma rounds it to
fp32 with weight.float(), this reference follows torch; Gemma also runs fp64 x in fp32, this reference
in fp64.)

The backward, the same in every mode, treats the rounding of x_hat as the identity:

    g = dy * (offset + weight)
    dx = rstd * (g - x_hat * mean(g * x_hat, -1))     # x_hat unrounded here
    dweight = sum over rows of dy * x_hat               # x_hat rounded to x's dtype under "llama",
                                                        # x * rstd.to(dtype) rounded under "none",
                                                        # as in those forwards; unrounded otherwise
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc

Casting = Literal["llama", "gemma", "torch", "none"]
CASTINGS: tuple[Casting, ...] = ("llama", "gemma", "torch", "none")


def rounds_normed(casting: str) -> bool:
    """Whether `casting` rounds x_hat to x's dtype before an fp32 product with the weight ("llama"; not
    "gemma", "torch", nor "none", whose product is in x's dtype: `_normed_in_dtype`).

    Raises:
        ValueError: for a name not in CASTINGS.
    """
    if casting == "llama":
        return True
    if casting in ("gemma", "torch", "none"):
        return False
    raise ValueError(f"casting must be one of {CASTINGS} (got {casting!r})")


def _normed_in_dtype(x: Tensor, rstd: Tensor) -> Tensor:
    """casting="none"'s x_hat: x * rstd in x's dtype (rstd rounded to it first), rstd x.shape[:-1]."""
    return x * rstd.unsqueeze(-1).to(x.dtype)


def rms_norm_rstd(x: Tensor, eps: float) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) over the last dim in the accumulation dtype, shape x.shape[:-1]."""
    x32 = acc(x)
    return torch.rsqrt(x32.pow(2).mean(-1) + eps)


def rms_norm(
    x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0, casting: Casting = "llama"
) -> Tensor:
    """y = x * rstd * (offset + weight), rounded to x.dtype where `casting` says (module docstring).

    Args:
        x: (..., D) input.
        weight: (D,) scale.
        eps: added to the mean square.
        offset: added to the weight (1.0 for Gemma-style norms).
        casting: "llama" (HF Llama, the default), "gemma" (HF Gemma), "torch" (torch.nn.RMSNorm) or
            "none" (Liger's math in x's dtype).
    Returns:
        (..., D) tensor of x.dtype.
    """
    return rms_norm_from_rstd(x, weight, rms_norm_rstd(x, eps), offset, casting)


def rms_norm_from_rstd(
    x: Tensor, weight: Tensor, rstd: Tensor, offset: float = 0.0, casting: Casting = "llama"
) -> Tensor:
    """`rms_norm` given its statistic `rstd` (x.shape[:-1], from `rms_norm_rstd`): callers that also
    keep rstd compute it once."""
    if casting == "none":
        return _normed_in_dtype(x, rstd) * (acc(weight) + offset).to(x.dtype)
    x_hat = acc(x) * rstd.unsqueeze(-1)
    if rounds_normed(casting):
        x_hat = acc(x_hat.to(x.dtype))
    return (x_hat * (acc(weight) + offset)).to(x.dtype)


def rms_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float = 0.0, casting: Casting = "llama"
) -> tuple[Tensor, Tensor]:
    """Gradients of `rms_norm` given the saved fp32 `rstd` (shape x.shape[:-1]).

    Returns:
        dx of x's shape and dtype, dweight of weight's shape and dtype (summed in fp32).
    """
    x32 = acc(x)
    r = rstd.unsqueeze(-1)
    x_hat = x32 * r
    dy32 = acc(dy)
    g = dy32 * (acc(weight) + offset)
    dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    x_hat_w = acc(x_hat.to(x.dtype)) if rounds_normed(casting) else x_hat
    if casting == "none":
        x_hat_w = acc(_normed_in_dtype(x, rstd))
    dw = (dy32 * x_hat_w).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)
