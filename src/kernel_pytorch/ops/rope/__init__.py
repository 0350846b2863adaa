"""Rotary position embedding kernels, registered as `kernel_pytorch::rope_fwd` / `_bwd`: q and k rotated
in one launch.

Math (reference/rope.py is the specification): for each token's heads of q (Hq) and k (Hk), rotary
width r <= D, a pair (x1, x2) of features -- (i, i + r/2) for rotate-half, (2i, 2i + 1) interleaved --
with that pair's cos/sin entries (c1, c2), (s1, s2):

    forward:  y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2          # fp32, rounded once
    backward: dx1 = dy1 * c1 + dy2 * s2, dx2 = dy2 * c2 - dy1 * s1      # the transpose (inverse rotation)
    features r .. D - 1 pass through (copied out of place, untouched in place)

Per feature j with partner p(j) (the other member of its pair): y[j] = x[j] c[j] -+ x[p] s[j] forward,
dx[j] = dy[j] c[j] +- dy[p] s[p] backward (minus on the first member of a pair going forward).

The package:
    __init__.py  the launchers `rope_fwd` / `rope_bwd` and the registration
    config.py    RopeConfig (which kernel runs, each kernel's launch knobs), the "rope" tuning family
    plan.py      the choice of kernel for given inputs, and the eager plan cache keyed on the config
    call.py      the records a launch is planned from (options, tensors, kernel flags, sizes)
    flat.py      the flat kernel: a 1-D grid over runs of whole rows, for q/k dense in one of two orders
    tile.py      the tile kernel: [tokens, heads, r] tiles at any strides
    token.py     the per-token kernel: one program per token, all its heads, at any strides
    math.py      the @triton.jit math the tile and flat kernels share

q/k/outputs are addressed through (batch, token, head, feature) strides, so (B, H, T, D), (B, T, H, D)
and views of one fused QKV projection run without a copy. Which kernel runs is RopeConfig's choice
(config.py names the measurements): the flat kernel wherever q, k and their outputs are dense, else
the tile kernel for rotate-half pairs and the per-token kernel for interleaved ones. Traffic is q and k
read once and written once (the copy bound); an out-of-range position id gives NaN rows instead of
reading outside the table.

hf_rounding=True: each product rounded to the input dtype before the sum, cos/sin taken in it:
transformers' eager result and autograd gradient bit for bit, for parity checks (math.py's `_products`).
Saved for backward: cos, sin (and position ids), which the model keeps anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import Strategy, register_rules, shard
from kernel_pytorch.ops.rope.call import Options
from kernel_pytorch.ops.rope.config import FlatConfig, RopeConfig, TileConfig, TokenConfig, current
from kernel_pytorch.ops.rope.plan import launch
from kernel_pytorch.reference.rope import rope, rope_backward


def rope_fwd(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, interleaved: bool = False,
    unsqueeze_dim: int = 1, hf_rounding: bool = False, *, inplace: bool = False, eager: bool = False,
    config: RopeConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k in one launch (arguments checked by reference/rope_checks.check_rope_args).

    Args:
        q: (B, Hq, T, D) for unsqueeze_dim=1 or (B, T, Hq, D) for unsqueeze_dim=2, any strides,
            fp32/bf16/fp16, CUDA (or CPU under TRITON_INTERPRET=1).
        k: the same layout and dtype, Hk heads.
        cos, sin: (B or 1, T, r) or (T, r) rows; with position_ids, (P, r) tables. Any float dtype.
        position_ids: None or integer (T,), (1, T), (B, T).
        interleaved: pairs (2i, 2i + 1) instead of (i, i + r/2).
        hf_rounding: round each product to q's dtype as transformers' eager code does (bitwise its
            result) instead of fp32 math rounded once.
        inplace: write into q and k (returned) instead of new tensors.
        eager: launch directly rather than through wrap_triton.
        config: the kernels' launch config; None: the one in force (`tuning.current("rope")`).
    Returns:
        (q_embed, k_embed): q's and k's shapes and dtypes; new tensors laid out like q and k
        (torch.empty_like), or q and k themselves in place.
    """
    return launch(q, k, cos, sin, position_ids, Options(interleaved, unsqueeze_dim, hf_rounding, inplace, False),
                  eager, config or current())


def rope_bwd(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, interleaved: bool = False,
    unsqueeze_dim: int = 1, hf_rounding: bool = False, *, inplace: bool = False, eager: bool = False,
    config: RopeConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Gradients for q and k from the upstream (dq_embed, dk_embed): the inverse rotation, same
    arguments as `rope_fwd` (inplace overwrites dq and dk). Returns (dq, dk)."""
    return launch(dq, dk, cos, sin, position_ids, Options(interleaved, unsqueeze_dim, hf_rounding, inplace, True),
                  eager, config or current())


def _fwd_reference(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    qo, ko = rope(q, k, cos, sin, position_ids, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim,
                  hf_rounding=hf_rounding)
    return torch.empty_like(q).copy_(qo), torch.empty_like(k).copy_(ko)  # the launcher's layout


def _bwd_reference(
    dq_embed: Tensor, dk_embed: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    dq, dk = rope_backward(dq_embed, dk_embed, cos, sin, position_ids, interleaved=interleaved,
                           unsqueeze_dim=unsqueeze_dim, hf_rounding=hf_rounding)
    return torch.empty_like(dq_embed).copy_(dq), torch.empty_like(dk_embed).copy_(dk)


def _fake(
    a: Tensor, b: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, interleaved: bool,
    unsqueeze_dim: int, hf_rounding: bool,
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(a), torch.empty_like(b)


# kernel_pytorch::rope_fwd (q, k, cos, sin, position_ids?, interleaved, unsqueeze_dim, hf_rounding) ->
# (q_embed, k_embed) and rope_bwd (dq_embed, dk_embed, cos, sin, position_ids?, interleaved,
# unsqueeze_dim, hf_rounding) -> (dq, dk); rope_eager(same arguments as rope_fwd) -> (q_embed, k_embed).
# The in-place variant is functional/rope.py's (an op may not return its inputs).
rope_fwd_op, rope_bwd_op, rope_eager = register_op(
    "rope",
    Impl(rope_fwd, _fwd_reference, _fake, outputs=("q_embed", "k_embed")),
    Impl(rope_bwd, _bwd_reference, _fake, outputs=("dq", "dk")),
    differentiable=("q_embed", "k_embed"),
    save=("cos", "sin", "position_ids"),
    keep=("interleaved", "unsqueeze_dim", "hf_rounding"),
    grads={"q": "dq", "k": "dk"},
)



def _heads_rule(first: str, second: str):  # noqa: ANN202
    """The rotation is per head: q and k (or their gradients) sharded on the heads dim (unsqueeze_dim), the
    tables and position ids Replicate (tensor parallelism's head-sharded attention)."""

    def rule(a: object) -> list[Strategy]:
        heads = shard(a.unsqueeze_dim)
        return [Strategy((heads, heads), {first: heads, second: heads})]

    return rule


register_rules(
    "rope", _heads_rule("q", "k"), _heads_rule("dq_embed", "dk_embed"),
    "q and k are sharded on the heads dim (Shard(unsqueeze_dim)) and cos, sin and the position ids Replicate",
)

__all__ = [
    "FlatConfig",
    "RopeConfig",
    "TileConfig",
    "TokenConfig",
    "rope_bwd",
    "rope_bwd_op",
    "rope_eager",
    "rope_fwd",
    "rope_fwd_op",
]
