"""AdamW's update, as torch.optim.AdamW(fused=True) computes it: fp32 math, state in each tensor's dtype.

For a parameter p with gradient g and moments m, v (all of p's shape; any float dtypes), at step t (1 on
the first update), with learning rate lr, betas (b1, b2), eps and weight decay wd, in fp32:

    p = p - (lr * wd) * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
        where step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t)   (fp64 on the host, then fp32)

p, m and v are each rounded once to their own dtype, and the last line reads m and v before that
rounding, as torch's fused kernel does (its foreach and single-tensor paths update m and v in place, so
with a bf16 state they read m and v after it: a difference of up to one bf16 rounding of each).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def adamw_scalars(lr: float, beta1: float, beta2: float, step: float) -> tuple[float, float]:
    """(step_size, bc2_sqrt) of the update at step `step` (>= 1); the module docstring's formulas."""
    if step < 1:
        raise ValueError(f"step must be >= 1 (got {step})")
    return lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step)


def adamw_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
           lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: float) -> None:
    """One AdamW update of every tensor in place (the module docstring); all at the same `step`.

    Args:
        params, grads, exp_avgs, exp_avg_sqs: lists of equal length; the i-th of each share a shape.
        step: the update's step count, >= 1 (the state's step after this update is counted).
    """
    step_size, bc2_sqrt = adamw_scalars(lr, beta1, beta2, step)
    # the scalars as the kernel sees them: fp32 values, so the reference and the kernel round alike
    f32 = torch.float32
    lr_wd, step_size, bc2_sqrt = (torch.tensor(v, dtype=f32) for v in (lr * weight_decay, step_size, bc2_sqrt))
    b1, b2, e = (torch.tensor(v, dtype=f32) for v in (beta1, beta2, eps))
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
        p32, g32 = p.to(f32), g.to(f32)
        p32 = p32 - lr_wd * p32
        m32 = b1 * m.to(f32) + (1 - b1) * g32
        v32 = b2 * v.to(f32) + (1 - b2) * g32 * g32
        p32 = p32 - step_size * m32 / (v32.sqrt() / bc2_sqrt + e)
        p.copy_(p32)
        m.copy_(m32)
        v.copy_(v32)
