"""Rotary position embeddings (RoPE), transformers' `apply_rotary_pos_emb` semantics.

For q of shape (B, Hq, T, D) and k of shape (B, Hk, T, D) (or (B, T, H, D) with unsqueeze_dim=2, as in
transformers), and cos/sin of the rotary width r <= D (r even):

    y[..., :r] = x[..., :r] * cos + rot(x[..., :r]) * sin      # math in fp32, rounded once
    y[..., r:] = x[..., r:]                                      # partial rotary: the rest passes through

cos/sin come in one of two forms:
* transformers' layout, (B or 1, T, r) or (T, r): the rows for each (batch, token), as returned by
  `LlamaRotaryEmbedding.forward` (then position_ids is None);
* a table (P, r) indexed by position_ids of shape (T,), (1, T) or (B, T): row position_ids[b, t]
  (packed sequences, left padding and decoding offsets are just other position ids).

Two conventions for which coordinates form a rotated pair, both with cos/sin laid out to match:
* "rotate half" (Llama, GPT-NeoX; interleaved=False): pairs (i, i + r/2),
  rot(x) = cat(-x[r/2:], x[:r/2]);  cos = cat(c, c) for the r/2 angle cosines c;
* interleaved (GPT-J, Cohere, the original Meta code; interleaved=True): pairs (2i, 2i + 1),
  rot(x)[2i] = -x[2i + 1], rot(x)[2i + 1] = x[2i];  cos = repeat_interleave(c, 2).

The formula is applied elementwise with whatever cos/sin are given (as transformers does), so a
pair's two cos entries need not agree. The backward is the transpose: rot is antisymmetric, so

    dx[..., :r] = dy * cos - rot(dy * sin)        # the inverse rotation when cos/sin come in pairs
    dx[..., r:] = dy[..., r:]

and nothing but cos/sin (or the table and position ids) needs saving.

Rounding: transformers' eager code multiplies and adds in the input dtype (three roundings in bf16:
q*cos, rot(q)*sin, their sum). By default this reference, and the kernels, compute in fp32 and round
once: never further from the exact result than transformers (at most half an ulp of the output).
Elementwise against transformers' bf16/fp16 output the two agree within the tolerance table for
unit-scale activations; at larger magnitudes, where q*cos and rot(q)*sin nearly cancel, transformers'
rounding of the products alone can exceed the table (tests/reference/test_rope.py measures both).
`hf_rounding=True` reproduces transformers' eager rounding instead (each product, then the sum,
rounded to the input dtype; cos/sin taken in the input dtype): bitwise equal to
`apply_rotary_pos_emb`, forward and autograd backward, for parity checks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc
from kernel_pytorch.reference.rope_checks import check_rope_args


def rotate_half(x: Tensor) -> Tensor:
    """transformers' rotate_half: cat(-x2, x1) for the halves x1, x2 of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """The interleaved rotation (GPT-J's rotate_every_two): (x0, x1, x2, x3..) -> (-x1, x0, -x3, x2..)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def rotate(x: Tensor, interleaved: bool) -> Tensor:
    """rot(x) of the chosen convention over the last dim."""
    return rotate_pairs(x) if interleaved else rotate_half(x)


def cos_sin_rows(cos: Tensor, sin: Tensor, position_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """cos/sin in transformers' layout, (B or 1, T, r).

    Args:
        cos, sin: (B or 1, T, r) or (T, r) rows when position_ids is None; else (P, r) tables.
        position_ids: None, or integer (T,), (1, T) or (B, T) rows of the tables.
    """
    if position_ids is None:
        return (cos, sin) if cos.dim() == 3 else (cos.unsqueeze(0), sin.unsqueeze(0))
    pos = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
    return cos[pos], sin[pos]


def apply_rotary(
    x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, hf_rounding: bool = False
) -> Tensor:
    """Rotate the first r = cos.shape[-1] features of x; the rest pass through.

    Args:
        x: (..., D) input.
        cos, sin: broadcastable to (..., r), r <= D.
        interleaved: pairs (2i, 2i+1) rather than (i, i + r/2).
        hf_rounding: round as transformers' eager code does (see the module docstring).
    Returns:
        (..., D) tensor of x's dtype: fp32 math (fp64 for fp64 inputs), rounded once.
    """
    r = cos.shape[-1]
    if hf_rounding:
        xr = x[..., :r]
        y = xr * cos.to(x.dtype) + rotate(xr, interleaved) * sin.to(x.dtype)
        return torch.cat((y, x[..., r:]), dim=-1)
    x32 = acc(x)
    xr = x32[..., :r]
    y = xr * acc(cos) + rotate(xr, interleaved) * acc(sin)
    return torch.cat((y, x32[..., r:]), dim=-1).to(x.dtype)


def apply_rotary_backward(
    dy: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, hf_rounding: bool = False
) -> Tensor:
    """Gradient of `apply_rotary` with respect to x: dy * cos - rot(dy * sin) on the rotary part,
    dy on the rest. Shapes as in `apply_rotary`; returns dy's dtype, fp32 math rounded once (with
    hf_rounding, each product and the difference rounded to dy's dtype, as eager autograd does)."""
    r = cos.shape[-1]
    if hf_rounding:
        g = dy[..., :r]
        dx = g * cos.to(dy.dtype) - rotate(g * sin.to(dy.dtype), interleaved)
        return torch.cat((dx, dy[..., r:]), dim=-1)
    dy32 = acc(dy)
    g = dy32[..., :r]
    dx = g * acc(cos) - rotate(g * acc(sin), interleaved)
    return torch.cat((dx, dy32[..., r:]), dim=-1).to(dy.dtype)


def rope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
    *, interleaved: bool = False, unsqueeze_dim: int = 1, hf_rounding: bool = False,
) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k (the op the kernels implement).

    Args:
        q: (B, Hq, T, D) for unsqueeze_dim=1, (B, T, Hq, D) for unsqueeze_dim=2; any strides.
        k: the same layout with Hk heads (GQA: Hk may differ from Hq).
        cos, sin: transformers' rows (B or 1, T, r) / (T, r), or (P, r) tables with position_ids.
        position_ids: None or integer (T,), (1, T), (B, T).
        interleaved: the GPT-J pairing instead of rotate-half.
        unsqueeze_dim: where the head dim is, as in transformers' apply_rotary_pos_emb.
        hf_rounding: transformers' eager rounding instead of fp32 math rounded once.
    Returns:
        (q_embed, k_embed) of q's and k's shapes and dtypes.
    Raises:
        ValueError/TypeError naming the argument (see reference/rope_checks.py).
    """
    check_rope_args(q, k, cos, sin, position_ids, unsqueeze_dim)
    c, s = cos_sin_rows(cos, sin, position_ids)
    c, s = c.unsqueeze(unsqueeze_dim), s.unsqueeze(unsqueeze_dim)
    return apply_rotary(q, c, s, interleaved, hf_rounding), apply_rotary(k, c, s, interleaved, hf_rounding)


def rope_backward(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None,
    *, interleaved: bool = False, unsqueeze_dim: int = 1, hf_rounding: bool = False,
) -> tuple[Tensor, Tensor]:
    """Gradients of `rope` for q and k given the upstream (dq_embed, dk_embed); same arguments as
    `rope`. Returns (dq, dk) of dq's and dk's shapes and dtypes."""
    check_rope_args(dq, dk, cos, sin, position_ids, unsqueeze_dim, names=("dq", "dk"))
    c, s = cos_sin_rows(cos, sin, position_ids)
    c, s = c.unsqueeze(unsqueeze_dim), s.unsqueeze(unsqueeze_dim)
    return (
        apply_rotary_backward(dq, c, s, interleaved, hf_rounding),
        apply_rotary_backward(dk, c, s, interleaved, hf_rounding),
    )
