"""What a training loop logs beside the cross-entropy, from quantities the loss's own pass produces:
the z-loss term, the predicted tokens and the token accuracy. The kernels return each row's lse and
argmax; these functions turn them into the values below, for every backend alike.

For logits x (N, V) (rows flattened), targets t, valid_i = t_i != ignore_index, lse_i of the (capped)
logits, token scales u (1 where absent) and z-loss scale s:

    z_loss           s * sum_i valid_i u_i lse_i^2, over sum_i valid_i for "mean"; per row for "none".
                     The term the loss already includes (reference/cross_entropy.py), detached: for
                     logging, no gradient flows through it.
    predicted_tokens argmax_j x_ij (int64, the first index among equal maxima), -1 on ignored rows.
                     Taken over the logits before the soft-cap, which is monotone and so leaves the
                     argmax alone, but whose rounding could make distinct logits equal.
    token_accuracy   the fraction of valid rows whose predicted token is the target ("mean" and "sum";
                     NaN when no row is valid, as the mean loss); per row 1.0 / 0.0 (0 on ignored rows)
                     for "none". Neither class weights nor token scales weigh it.

Shapes: per-row values have the target's shape; reductions are 0-d fp32 (fp64 for fp64 logits).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions, token_scales


class LossOutput(NamedTuple):
    """A loss with what was asked for beside it (None where not asked for). A NamedTuple: a pytree that
    torch.compile and torch.export return as they return a tuple."""

    loss: Tensor
    z_loss: Tensor | None = None
    token_accuracy: Tensor | None = None
    predicted_tokens: Tensor | None = None


def predicted_tokens(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """argmax over the class dim of logits (..., V), -1 where target (...) is ignore_index: target's shape."""
    pred = logits.detach().argmax(-1).reshape(target.shape)
    return torch.where(target != ignore_index, pred, -1)


def z_loss(lse: Tensor, target: Tensor, options: CrossEntropyOptions, token_scale: Tensor | None = None) -> Tensor:
    """The z-loss term of the loss from each row's lse (N,) (module docstring), detached."""
    lse = lse.detach().reshape(-1)
    valid = target.reshape(-1) != options.ignore_index
    zero = torch.zeros((), dtype=lse.dtype, device=lse.device)
    u = token_scales(token_scale, lse.numel(), lse)
    rows = torch.where(valid, options.lse_square_scale * lse * lse * u, zero)
    if options.reduction == "none":
        return rows.reshape(target.shape)
    if options.reduction == "sum":
        return rows.sum()
    return rows.sum() / valid.sum().to(rows.dtype)


def token_accuracy(pred: Tensor, target: Tensor, ignore_index: int, reduction: str,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """Whether each valid row's predicted token (target's shape) is its target, per row ("none") or as
    the fraction of valid rows (module docstring), in `dtype`."""
    valid = target != ignore_index
    hit = ((pred == target) & valid).to(dtype)
    if reduction == "none":
        return hit
    return hit.sum() / valid.sum().to(dtype)


def loss_output(loss: Tensor, lse: Tensor | None, pred: Tensor | None, target: Tensor,
                options: CrossEntropyOptions, token_scale: Tensor | None = None) -> LossOutput:
    """LossOutput from the loss, its rows' lse (N,) (with options.return_z_loss) and their predicted
    tokens (target's shape or (N,), -1 on ignored rows; with options.argmax)."""
    zl = acc = None
    if options.return_z_loss:
        zl = z_loss(lse, target, options, token_scale)
    if pred is not None:
        pred = pred.reshape(target.shape)
    if options.return_token_accuracy:
        acc = token_accuracy(pred, target, options.ignore_index, options.reduction, loss.dtype)
    return LossOutput(loss, zl, acc, pred if options.return_predicted_tokens else None)
