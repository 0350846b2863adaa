"""Cross-entropy over class indices: `torch.nn.functional.cross_entropy` semantics, plus z-loss and
logit soft-capping.

For logits x of shape (..., V) (the class dim last; leading dims are rows), targets t of shape (...),
optional class weights w of shape (V,) (1 where absent), optional token scales u of t's shape (1
where absent), label smoothing eps, z-loss scale s and soft-cap c, per row i, all in fp32 (fp64 for
fp64 logits):

    z_ij  = c * tanh(x_ij / c)            (soft-capping, Gemma-2; z = x without a cap)
    lse_i = log sum_j exp(z_ij)
    valid_i = t_i != ignore_index
    ce_i = (1 - eps) * w[t_i] * (lse_i - z_i,t_i) + eps / V * sum_j w_j * (lse_i - z_ij)
    zl_i = s * lse_i^2
    (ce_i = zl_i = 0 where not valid_i)

reduction "none": u_i (ce_i + zl_i), of t's shape; "sum": sum_i u_i (ce_i + zl_i); "mean":
sum_i u_i ce_i / sum_i valid_i * w[t_i]  +  sum_i u_i zl_i / sum_i valid_i. The first term is torch's
weighted mean, label smoothing included (torch divides its smoothing term by the same weight sum); the
z-loss is not class-weighted, so it is averaged over the valid rows. The token scales multiply each
row's terms and leave the denominators alone (a constant: no gradient reaches u). A mean over no
valid row is 0/0 = NaN, as in torch (whose gradient is then 0, as is ours).

Gradient with respect to the logits, with p_ij = exp(z_ij - lse_i), W = sum_j w_j:

    dce_i/dz_ij = ((1 - eps) w[t_i] + eps W / V) p_ij - (1 - eps) w[t_i] [j == t_i] - eps / V w_j
    dzl_i/dz_ij = 2 s lse_i p_ij
    dz/dx       = 1 - (z / c)^2
    dx_ij = (r_i dce_i/dz_ij + q_i dzl_i/dz_ij) dz_ij/dx_ij     (0 on rows that are not valid)

with (r_i, q_i) = u_i (g_i, g_i) for "none" (g the upstream gradient of the row), u_i (g, g) for "sum"
and u_i (g / sum valid w[t], g / sum valid) for "mean".

Rounding: the loss stays in fp32 (fp64 for fp64): exactly Hugging Face's causal-LM loss, which upcasts
the logits with `.float()` before `F.cross_entropy` (torch's own bf16 op rounds its log-probabilities
and loss to bf16). The gradient is computed in fp32 and rounded once to the logits' dtype, as the
backward of that `.float()` does. Soft-capping is applied to the fp32 logits; Hugging Face's Gemma-2
applies it in the logits' dtype (three roundings) before the loss: ours is the unrounded value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc, acc_dtype

REDUCTIONS = ("mean", "sum", "none")


@dataclass(frozen=True)
class CrossEntropyOptions:
    """Every option of a cross-entropy call, written once: the reference, the ops, functional and nn
    all take this object (functional's keyword arguments build it at the boundary).

    ignore_index: the target value of rows to skip; reduction: one of REDUCTIONS; label_smoothing: eps
    in [0, 1]; lse_square_scale: the z-loss scale s; softcap: c, or None for no cap (module docstring).
    return_z_loss, return_token_accuracy, return_predicted_tokens: what a call returns beside the loss
    (Liger-Kernel's names; reference/cross_entropy_extras.py gives their values).
    """

    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None
    return_z_loss: bool = False
    return_token_accuracy: bool = False
    return_predicted_tokens: bool = False

    # The options as the registered ops take them, in this order (an op schema takes plain values:
    # softcap 0.0 stands for no cap; the return_* flags stay with the caller, which asks for `argmax`).
    FLAT: ClassVar[tuple[tuple[str, type], ...]] = (
        ("ignore_index", int), ("reduction", str), ("label_smoothing", float), ("lse_square_scale", float),
        ("softcap", float),
    )

    def flat(self) -> tuple[int, str, float, float, float]:
        """The options in FLAT's order, as the ops take them."""
        return (int(self.ignore_index), self.reduction, float(self.label_smoothing), float(self.lse_square_scale),
                float(self.softcap or 0.0))

    @classmethod
    def from_flat(cls, ignore_index: int, reduction: str, label_smoothing: float, lse_square_scale: float,
                  softcap: float) -> CrossEntropyOptions:
        """`flat`'s inverse (the return_* flags at their defaults)."""
        return cls(ignore_index, reduction, label_smoothing, lse_square_scale, softcap or None)

    @classmethod
    def from_keywords(cls, caller: str, options: Mapping[str, Any]) -> CrossEntropyOptions:
        """The options a public function takes as keyword arguments (`**options`), as one object; a
        TypeError naming `caller` and the first keyword that is no option."""
        names = cls.__match_args__  # the fields, in order (dataclass makes it; torch.compile reads it, not fields())
        for key in options:
            if key not in names:
                raise TypeError(f"{caller}() got an unexpected keyword argument {key!r} (its options: "
                                f"{', '.join(names)})")
        return cls(**options)

    @property
    def extras(self) -> bool:
        """Whether anything beside the loss is asked for (a call then returns a LossOutput)."""
        return self.return_z_loss or self.return_token_accuracy or self.return_predicted_tokens

    @property
    def argmax(self) -> bool:
        """Whether the loss's pass must find each row's argmax (for the accuracy or the tokens)."""
        return self.return_token_accuracy or self.return_predicted_tokens


DEFAULT_OPTIONS = CrossEntropyOptions()


def apply_softcap(x: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(x / cap), or x when cap is None."""
    return x if cap is None else cap * torch.tanh(x / cap)


def class_weights(weight: Tensor | None, n_classes: int, like: Tensor) -> Tensor:
    """The class weights in `like`'s dtype and device; ones where no weight is given."""
    if weight is None:
        return torch.ones(n_classes, dtype=like.dtype, device=like.device)
    return weight.to(like.dtype)


def token_scales(token_scale: Tensor | None, n: int, like: Tensor) -> Tensor:
    """The (N,) token scales in `like`'s dtype and device, detached (a constant of the loss); ones where
    none are given."""
    if token_scale is None:
        return torch.ones(n, dtype=like.dtype, device=like.device)
    return token_scale.detach().reshape(-1).to(like.dtype)


def cross_entropy_rows(
    logits: Tensor, target: Tensor, weight: Tensor | None = None, options: CrossEntropyOptions = DEFAULT_OPTIONS,
) -> tuple[Tensor, Tensor, Tensor]:
    """Unreduced per-row terms, rows flattened (the reduction is not read).

    Args:
        logits: (..., V) float tensor.
        target: (...) integer class indices (options.ignore_index marks rows to skip).
        weight: (V,) class weights or None.
    Returns:
        ce (N,), zl (N,) and lse (N,) in the accumulation dtype (0 for ce and zl on ignored rows).
    """
    v, eps = logits.shape[-1], options.label_smoothing
    z = apply_softcap(acc(logits).reshape(-1, v), options.softcap)
    t = target.reshape(-1).long()
    valid = t != options.ignore_index
    t_safe = torch.where(valid, t, 0)
    w = class_weights(weight, v, z)
    lse = torch.logsumexp(z, dim=-1)
    logp = z - lse.unsqueeze(-1)
    nll = -logp.gather(1, t_safe.unsqueeze(1)).squeeze(1) * w[t_safe]
    ce = (1.0 - eps) * nll
    if eps:
        ce = ce + eps / v * -(logp * w).sum(-1)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    ce = torch.where(valid, ce, zero)
    zl = torch.where(valid, options.lse_square_scale * lse * lse, zero)
    return ce, zl, lse


def cross_entropy_denominators(
    target: Tensor, weight: Tensor | None, ignore_index: int, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """The means' divisors: (sum of w[t] over valid rows, number of valid rows), 0-d tensors of `dtype`."""
    t = target.reshape(-1).long()
    valid = t != ignore_index
    count = valid.sum().to(dtype)
    if weight is None:
        return count, count
    w = weight.to(dtype)
    return (w[torch.where(valid, t, 0)] * valid).sum(), count


def cross_entropy(
    logits: Tensor, target: Tensor, weight: Tensor | None = None, options: CrossEntropyOptions = DEFAULT_OPTIONS,
    token_scale: Tensor | None = None,
) -> Tensor:
    """The loss (module docstring), in fp32 (fp64 for fp64 logits); the return_* options are not read.

    Args:
        logits: (..., V) float tensor; target: (...) integer class indices; weight: (V,) or None.
        token_scale: (...) of target's shape, u: each row's factor, or None.
    Returns:
        0-d tensor for "mean" / "sum", target's shape for "none".
    """
    reduction = options.reduction
    ce, zl, _ = cross_entropy_rows(logits, target, weight, options)
    if token_scale is not None:
        u = token_scales(token_scale, ce.numel(), ce)
        ce, zl = ce * u, zl * u
    if reduction == "none":
        return (ce + zl).reshape(target.shape)
    if reduction == "sum":
        return ce.sum() + zl.sum()
    if reduction != "mean":
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {reduction!r})")
    wden, count = cross_entropy_denominators(target, weight, options.ignore_index, ce.dtype)
    return ce.sum() / wden + zl.sum() / count


def row_scales(
    dloss: Tensor, target: Tensor, weight: Tensor | None, options: CrossEntropyOptions, dtype: torch.dtype,
    token_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(r, q) of the module docstring for every row, each (N,) of `dtype`: how the upstream gradient
    reaches the cross-entropy and the z-loss terms of each row."""
    n = target.numel()
    g = acc(dloss).to(dtype)
    g = g.reshape(-1).expand(n) if options.reduction == "none" else g.reshape(()).expand(n)
    if token_scale is not None:
        g = g * token_scales(token_scale, n, g)
    if options.reduction != "mean":
        return g, g
    wden, count = cross_entropy_denominators(target, weight, options.ignore_index, dtype)
    return g / wden, g / count


def cross_entropy_backward(
    dloss: Tensor, logits: Tensor, target: Tensor, weight: Tensor | None = None,
    options: CrossEntropyOptions = DEFAULT_OPTIONS, token_scale: Tensor | None = None,
) -> Tensor:
    """The gradient of `cross_entropy` with respect to the logits (the formula the kernels implement).

    Args:
        dloss: the upstream gradient: 0-d for "mean" / "sum", target's shape for "none".
        (the rest as in `cross_entropy`)
    Returns:
        logits' shape and dtype; zero rows where the target is ignore_index.
    """
    v, softcap = logits.shape[-1], options.softcap
    x = acc(logits).reshape(-1, v)
    z = apply_softcap(x, softcap)
    t = target.reshape(-1).long()
    valid = t != options.ignore_index
    t_safe = torch.where(valid, t, 0)
    w = class_weights(weight, v, z)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    r, q = row_scales(dloss, target, weight, options, z.dtype, token_scale)
    eps = options.label_smoothing
    w_t = w[t_safe].unsqueeze(1)
    dce = ((1.0 - eps) * w_t + eps * w.sum() / v) * p - eps / v * w
    dce = dce - torch.nn.functional.one_hot(t_safe, v).to(z.dtype) * (1.0 - eps) * w_t
    grad = r.unsqueeze(1) * dce + q.unsqueeze(1) * (2.0 * options.lse_square_scale) * lse * p
    if softcap is not None:
        grad = grad * (1.0 - (z / softcap) ** 2)
    grad = torch.where(valid.unsqueeze(1), grad, torch.zeros((), dtype=z.dtype, device=z.device))
    return grad.to(logits.dtype).reshape(logits.shape)


def loss_dtype(logits_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the loss for logits of `logits_dtype`: fp32, or fp64 for fp64 logits."""
    return acc_dtype(logits_dtype)
