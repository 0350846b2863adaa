"""Rope family rewrites: a rotate-half rotary embedding written out for q and k ->
`kernel_pytorch.functional.apply_rotary`, which rotates both in one kernel.

    cos, sin = cos.unsqueeze(d), sin.unsqueeze(d)            d = 1: q (B, H, T, D); d = 2: q (B, T, H, D)
    q_embed = q * cos + rotate_half(q) * sin                  rotate_half(x) = cat(-x2, x1), x1, x2 its halves
    k_embed = k * cos + rotate_half(k) * sin                  cos, sin: (B or 1, T, D), q's dtype

transformers' `apply_rotary_pos_emb` written inline. The halves are proven by the graph or the shapes:
split at `x.shape[-1] // 2` of the same x (as transformers' rotate_half writes it) or by `x.chunk(2,
dim=-1)`, or, where Dynamo has folded the split point to a literal, at a point the example shapes show
is D/2 (so that spelling matches only in a compiled graph; an odd D, which `chunk` splits unequally,
is left to the written code at run time). The negated half first, concatenated on the last dim; q and
k rotated by the same cos/sin. Other orders, an interleaved pairing, or cos and sin that differ between
q and k do not match. With a partial rotary width (transformers' `q[..., :r]` rotated, the rest passed
through) the rotated slice is this computation on that slice, and is rewritten as such. The
replacement rounds as the written code does (`hf_rounding=True`: each product and the sum in q's
dtype), so it computes the same function; where, at run time, the tensors are not of that form (cos
of another shape or dtype), the written formula runs and a log line says so once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch._env import log_once
from kernel_pytorch.functional._dispatch import KERNEL_DTYPES
from kernel_pytorch.optimize.rewrite.pattern import Pattern


def rope_ok(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> bool:
    """Whether our op computes the written formula on these values: q, k 4-D of one kernel dtype and
    device, heads at `unsqueeze_dim` (1 or 2), and cos, sin (B or 1, T, D) of q's dtype."""
    if not all(isinstance(t, Tensor) for t in (q, k, cos, sin)) or unsqueeze_dim not in (1, 2):
        return False
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return False
    t_dim = 3 - unsqueeze_dim
    batch, tokens, d = q.shape[0], q.shape[t_dim], q.shape[-1]
    return (k.shape[0] == batch and k.shape[t_dim] == tokens and k.shape[-1] == d and d % 2 == 0
            and cos.shape[0] in (1, batch) and cos.shape[1] == tokens and cos.shape[2] == d
            and q.dtype == k.dtype == cos.dtype == sin.dtype and q.dtype in KERNEL_DTYPES
            and q.device == k.device == cos.device == sin.device and q.device.type in ("cuda", "cpu"))


def _written(x: Tensor, cos: Tensor, sin: Tensor, chunked: bool) -> Tensor:
    if chunked:  # unequal halves for an odd D, as `chunk` splits
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def kp_rotate_half_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, chunked: bool = False
                        ) -> tuple[Tensor, Tensor]:
    """Our rotary embedding of q and k, rounded as the written code (one node in a rewritten graph);
    `chunked`: the halves were written with `chunk` (what the written code does where our op cannot)."""
    if not rope_ok(q, k, cos, sin, unsqueeze_dim):
        log_once("kernel_pytorch rewrite: a rotary embedding's tensors are not of the form our op takes "
                 "(q, k 4-D with an even head dim; cos, sin (B or 1, T, D) of q's dtype); the written formula runs")
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return _written(q, c, s, chunked), _written(k, c, s, chunked)
    return kp_functional.apply_rotary(q, k, cos, sin, unsqueeze_dim=int(unsqueeze_dim), hf_rounding=True)


torch.fx.wrap("kp_rotate_half_rope")


def _halves_by_shape(x: Tensor, half: Any) -> tuple[Tensor, Tensor]:
    # transformers' rotate_half: each half's bound computed from x.shape where it is used
    return x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]


def _halves_by_literal(x: Tensor, half: Any) -> tuple[Tensor, Tensor]:
    return x[..., :half], x[..., half:]


def _halves_by_chunk(x: Tensor, half: Any) -> tuple[Tensor, Tensor]:
    x1, x2 = x.chunk(2, dim=-1)
    return x1, x2


# spelling -> (the halves of x, whether the split point is a literal the shapes must prove)
HALVES: dict[str, tuple[Callable[[Tensor, Any], tuple[Tensor, Tensor]], bool]] = {
    "shape_half": (_halves_by_shape, False),
    "chunk": (_halves_by_chunk, False),
    "literal_half": (_halves_by_literal, True),
}


def _search(halves: Callable[[Tensor, Any], tuple[Tensor, Tensor]], literal: bool
            ) -> Callable[..., tuple[Tensor, Tensor]]:
    def rotate_half(x: Tensor, half: Any) -> Tensor:
        x1, x2 = halves(x, half)
        return torch.cat((-x2, x1), dim=-1)

    def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any, half: Any
             ) -> tuple[Tensor, Tensor]:
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = (q * cos) + (rotate_half(q, half) * sin)
        k_embed = (k * cos) + (rotate_half(k, half) * sin)
        return q_embed, k_embed

    def search(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any) -> tuple[Tensor, Tensor]:
        return rope(q, k, cos, sin, unsqueeze_dim, None)

    def search_literal(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any, half: Any
                       ) -> tuple[Tensor, Tensor]:
        return rope(q, k, cos, sin, unsqueeze_dim, half)
    return search_literal if literal else search


def _replace(literal: bool, chunked: bool) -> Callable[..., tuple[Tensor, Tensor]]:
    # by its global name, which torch.fx.wrap patches while a replacement is traced
    def replace(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any) -> tuple[Tensor, Tensor]:
        out = kp_rotate_half_rope(q, k, cos, sin, unsqueeze_dim, chunked)
        return out[0], out[1]

    def replace_literal(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any, half: Any
                        ) -> tuple[Tensor, Tensor]:
        out = kp_rotate_half_rope(q, k, cos, sin, unsqueeze_dim)
        return out[0], out[1]
    return replace_literal if literal else replace


def _op(literal: bool) -> Callable[..., tuple[Tensor, Tensor]]:
    """The replacement as the registered op (Pattern.op): no position ids, rotate-half, hf_rounding."""
    def op(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any) -> tuple[Tensor, Tensor]:
        out = torch.ops.kernel_pytorch.rope_fwd(q, k, cos, sin, None, False, unsqueeze_dim, True)
        return out[0], out[1]

    def op_literal(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: Any, half: Any
                   ) -> tuple[Tensor, Tensor]:
        out = torch.ops.kernel_pytorch.rope_fwd(q, k, cos, sin, None, False, unsqueeze_dim, True)
        return out[0], out[1]
    return op_literal if literal else op


def fits(values: Mapping[str, Any]) -> bool:
    """`rope_ok` on the example values."""
    return rope_ok(values.get("q"), values.get("k"), values.get("cos"), values.get("sin"), values.get("unsqueeze_dim"))


def half_proven(values: Mapping[str, Any]) -> bool:
    """A literal split point is D/2 of q's example value (none in a graph without shapes: not proven)."""
    q, half = values.get("q"), values.get("half")
    return isinstance(q, Tensor) and isinstance(half, int) and q.dim() >= 1 and 2 * half == q.shape[-1]


ROPE_PATTERNS = tuple(
    Pattern(
        name=f"rope.rotate_half.{spelling}",
        kind="rope",
        family="rope",
        search=_search(halves, literal),
        replace=_replace(literal, spelling == "chunk"),
        op=_op(literal),
        anchor="add",  # q's `q * cos + rotate_half(q) * sin`, the line the analyser's finding names
        what="kernel_pytorch.functional.apply_rotary(hf_rounding=True)",
        fits=fits,
        proof=half_proven if literal else None,
        slices=spelling != "chunk",
    )
    for spelling, (halves, literal) in HALVES.items()
)

__all__ = ["HALVES", "ROPE_PATTERNS", "fits", "half_proven", "kp_rotate_half_rope", "rope_ok"]
