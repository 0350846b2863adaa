"""The records a rotary launch is planned from: the call's options, its tensors, the kernels' flags and
the sizes the per-token and tile kernels are shaped by (plan.py builds them; flat.py, tile.py and
token.py read them)."""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor


class Options(NamedTuple):
    """A call's options, as `rope_fwd` takes them, and whether it is the backward (the inverse rotation)."""

    interleaved: bool
    unsqueeze_dim: int
    hf_rounding: bool
    inplace: bool
    backward: bool


class Operands(NamedTuple):
    """A call's tensors: q and k, their outputs qo and ko (q and k themselves in place), cos and sin with a
    unit last stride, and the position ids (None: cos and sin are rows, not tables)."""

    q: Tensor
    k: Tensor
    qo: Tensor
    ko: Tensor
    cos: Tensor
    sin: Tensor
    pos: Tensor | None


class Flags(NamedTuple):
    """The kernels' compile-time flags."""

    interleaved: bool
    has_pos: bool
    copy_pass: bool
    backward: bool
    hf_rounding: bool

    def meta(self) -> dict[str, Any]:
        """The flags as the kernels' constexpr keywords."""
        return dict(INTERLEAVED=self.interleaved, HAS_POS=self.has_pos, COPY_PASS=self.copy_pass,
                    BACKWARD=self.backward, HF_ROUNDING=self.hf_rounding)


class Sizes(NamedTuple):
    """What the per-token and tile kernels are shaped by: the batch, tokens, q's and k's heads, the rotary
    pairs per row (`half`), the features passed through unrotated (`n_pass`) and the table's positions
    (0 without position ids)."""

    batch: int
    seq_len: int
    heads_q: int
    heads_k: int
    half: int
    n_pass: int
    n_positions: int
