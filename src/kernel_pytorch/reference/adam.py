"""Adam's and AdamW's update, as torch.optim.Adam / AdamW(fused=True) compute it: fp32 math, state in
each tensor's dtype.

For a parameter p with gradient g and moments m, v (all of p's shape; any float dtypes), at step t (1 on
the first update), with learning rate lr, betas (b1, b2), eps and weight decay wd, in fp32:

    g = -g                                   with maximize
    p = p - (lr * wd) * p                    AdamW (decoupled weight decay)
    g = g + wd * p                           Adam (L2: the decay through the gradient)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    v_max = max(v_max, v)                    with amsgrad (v_max, a third moment, replaces v below)
    p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
        where step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)   (fp64 on the host, then fp32)

p, m, v (and v_max) are each rounded once to their own dtype, and the last line reads them before that
rounding, as torch's fused kernel does (its foreach and single-tensor paths update the moments in place,
so with a bf16 state they read them after it: a difference of up to one bf16 rounding of each).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def adam_scalars(lr: float, beta1: float, beta2: float, step: float) -> tuple[float, float]:
    """(step_size, bc2_sqrt) of the update at step `step` (>= 1); the module docstring's formulas."""
    if step < 1:
        raise ValueError(f"step must be >= 1 (got {step})")
    return lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step)


def adam_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
          max_exp_avg_sqs: list[Tensor] | None, lr: float, beta1: float, beta2: float, eps: float,
          weight_decay: float, step: float, decoupled: bool = True, maximize: bool = False) -> None:
    """One Adam (decoupled=False) or AdamW update of every tensor in place (the module docstring); all at
    the same `step`.

    Args:
        params, grads, exp_avgs, exp_avg_sqs: lists of equal length; the i-th of each share a shape.
        max_exp_avg_sqs: the same, for amsgrad; None without it.
        step: the update's step count, >= 1 (the state's step after this update is counted).
    """
    step_size, bc2_sqrt = adam_scalars(lr, beta1, beta2, step)
    # the scalars as the kernel sees them: fp32 values, so the reference and the kernel round alike
    f32 = torch.float32
    lr_wd, wd, step_size, bc2_sqrt = (torch.tensor(v, dtype=f32) for v in (lr * weight_decay, weight_decay,
                                                                            step_size, bc2_sqrt))
    b1, b2, e = (torch.tensor(v, dtype=f32) for v in (beta1, beta2, eps))
    maxes = max_exp_avg_sqs if max_exp_avg_sqs is not None else [None] * len(params)
    for p, g, m, v, v_max in zip(params, grads, exp_avgs, exp_avg_sqs, maxes, strict=True):
        p32, g32 = p.to(f32), g.to(f32)
        if maximize:
            g32 = -g32
        if decoupled:
            p32 = p32 - lr_wd * p32
        else:
            g32 = g32 + wd * p32
        m32 = b1 * m.to(f32) + (1 - b1) * g32
        v32 = b2 * v.to(f32) + (1 - b2) * g32 * g32
        denom = v32
        if v_max is not None:
            denom = torch.maximum(v_max.to(f32), v32)
            v_max.copy_(denom)
        p32 = p32 - step_size * m32 / (denom.sqrt() / bc2_sqrt + e)
        p.copy_(p32)
        m.copy_(m32)
        v.copy_(v32)
