"""Token and absolute position embeddings, and ALiBi.

`Embedding` subclasses torch.nn.Embedding and overrides `forward` only (constructor, `weight`,
state_dict keys and repr are torch's); its backward is the deterministic sorted-segment sum of
functional.embedding. `ScaledEmbedding` multiplies the rows by a constant after the lookup, rounding as
transformers' scaled word embeddings do (Gemma 1/2/3, BART, ...). The position modules wrap
reference/positions.py: sinusoidal tables (DistilBERT/XLM interleaved, Marian concatenated), a learned
table with OPT's offset, and ALiBi slopes with the bias tensor and a FlexAttention score_mod.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernel_pytorch import functional as F
from kernel_pytorch.functional import Backend
from kernel_pytorch.reference.positions import alibi_bias, alibi_slopes, sinusoidal_positions


class Embedding(torch.nn.Embedding):
    """torch.nn.Embedding with a deterministic weight gradient (Triton on CUDA).

    Same arguments as torch.nn.Embedding. forward: integer indices (any shape) -> indices.shape + (H,).
    `deterministic` and `backend` may be set on an instance; max_norm (which renormalises weight rows
    in place) and sparse gradients run torch's own embedding.
    """

    backend: Backend = "auto"
    deterministic: bool = True

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (torch's parameter name)
        if self.max_norm is not None or self.sparse:
            return super().forward(input)
        return F.embedding(input, self.weight, self.padding_idx, scale_grad_by_freq=self.scale_grad_by_freq,
                           deterministic=self.deterministic, backend=self.backend)


class ScaledEmbedding(Embedding):
    """`Embedding` whose rows are multiplied by `embed_scale` after the lookup (Gemma's sqrt(H), BART's
    `scale_embedding`).

    Same arguments as Embedding, plus `embed_scale`, kept as given because the two forms round
    differently in low precision:
      - a 0-d tensor (transformers' Gemma): a non-persistent buffer `embed_scale`, cast to the table's
        dtype before the multiply (in bf16 Gemma-2B's sqrt(2048) = 45.2548 becomes 45.25);
      - a float (BART-like): the multiply takes it as a Python scalar, as torch does.
    forward: integer indices (any shape) -> indices.shape + (H,) in the table's dtype.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, *,
                 embed_scale: float | Tensor = 1.0, **kwargs) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx, **kwargs)
        if isinstance(embed_scale, Tensor):
            self.register_buffer("embed_scale", embed_scale, persistent=False)
        else:
            self.embed_scale = float(embed_scale)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (torch's parameter name)
        scale = self.embed_scale
        return super().forward(input) * (scale.to(self.weight.dtype) if isinstance(scale, Tensor) else scale)


class LearnedPositionalEmbedding(Embedding):
    """A learned (num_positions + offset, H) table read at position_ids + offset (OPT keeps offset 2).

    forward(position_ids): integer (B, T) or (T,) -> position_ids.shape + (H,).
    """

    def __init__(self, num_positions: int, embedding_dim: int, offset: int = 0, **kwargs) -> None:
        super().__init__(num_positions + offset, embedding_dim, **kwargs)
        self.offset = offset

    def forward(self, position_ids: Tensor) -> Tensor:
        return super().forward(position_ids + self.offset if self.offset else position_ids)


class SinusoidalPositionalEmbedding(torch.nn.Module):
    """The fixed sinusoidal table of "Attention is all you need" (computed in fp64, stored fp32).

    Args:
        num_positions, embedding_dim: the table's shape.
        base: the wavelength base.
        interleaved: sin/cos alternate (DistilBERT, XLM); False: sines first (Marian).
    forward(position_ids): integer (any shape) -> position_ids.shape + (embedding_dim,) fp32.
    Buffer `weight` is not in the state dict (it is a function of the arguments).
    """

    def __init__(self, num_positions: int, embedding_dim: int, base: float = 10000.0, interleaved: bool = True,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        table = sinusoidal_positions(num_positions, embedding_dim, base, interleaved)
        self.register_buffer("weight", table.to(device), persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return torch.nn.functional.embedding(position_ids, self.weight)


class ALiBi(torch.nn.Module):
    """Attention with linear biases: per-head slopes (BLOOM's, for any head count).

    forward(q_len, kv_len): the (H, q_len, kv_len) fp32 bias slopes[h] * (j - i - (kv_len - q_len)),
    queries aligned to the end of the keys; apply the causal mask separately.
    `score_mod(kv_len - q_len)` gives the same bias as a FlexAttention score_mod.
    """

    def __init__(self, num_heads: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads, device), persistent=False)

    def forward(self, q_len: int, kv_len: int) -> Tensor:
        return alibi_bias(self.slopes, q_len, kv_len)

    def score_mod(self, offset: int = 0) -> Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
        """score_mod(score, b, h, q_idx, kv_idx) adding slopes[h] * (kv_idx - q_idx - offset); offset:
        kv_len - q_len when the queries are the last q_len positions (decoding)."""
        slopes = self.slopes

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + slopes[h] * (kv_idx - q_idx - offset)

        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.slopes.shape[0]}"
