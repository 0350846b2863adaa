"""Absolute position encodings and ALiBi against transformers' DistilBERT, Marian, OPT and BLOOM; document
ids of packed rows against transformers' masking_utils."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.reference.positions import (
    alibi_bias,
    alibi_slopes,
    bloom_alibi,
    learned_positions,
    position_ids_from_attention_mask,
    seq_ids_from_position_ids,
    sinusoidal_positions,
)
from kernel_pytorch.tolerances import compare
from tests.grid import randn

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import find_packed_sequence_indices  # noqa: E402
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.distilbert.modeling_distilbert import _create_sinusoidal_embeddings  # noqa: E402
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding  # noqa: E402
from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding  # noqa: E402


@pytest.mark.parametrize("dim", [16, 7])
def test_sinusoidal_interleaved_matches_distilbert(dim: int) -> None:
    out = torch.empty(50, dim)
    _create_sinusoidal_embeddings(50, dim, out)
    ours = sinusoidal_positions(50, dim)
    assert compare(ours, out).passed, compare(ours, out).message("sinusoidal")


@pytest.mark.parametrize("dim", [16, 7])
def test_sinusoidal_concat_matches_marian(dim: int) -> None:
    marian = MarianSinusoidalPositionalEmbedding(50, dim).create_weight()
    ours = sinusoidal_positions(50, dim, interleaved=False)
    assert compare(ours, marian).passed, compare(ours, marian).message("sinusoidal")


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 8, 12, 16, 24, 30, 40])
def test_alibi_slopes_match_bloom(n_heads: int) -> None:
    ours = alibi_slopes(n_heads)
    # BLOOM's slopes are the bias at position 1 (position 0 is 0); its slope helper is private and not in
    # every transformers 5.x, build_alibi_tensor is
    bloom = build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)[:, 0, 1]
    assert ours.shape == (n_heads,) and torch.equal(ours, bloom)


def test_alibi_slopes_power_of_two_are_the_papers() -> None:
    """8 heads: 1/2, 1/4, ..., 1/256 (Press et al.)."""
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


def test_bloom_alibi_matches_and_gives_the_same_attention_as_the_bias() -> None:
    """build_alibi_tensor bitwise; and on causal rows without padding, softmax(scores + BLOOM's alibi)
    equals softmax(scores + alibi_bias) (the two differ by a constant per row)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    assert torch.equal(bloom_alibi(mask, 6, torch.bfloat16), build_alibi_tensor(mask, 6, torch.bfloat16))
    heads, t = 6, 5
    scores = randn(heads, t, t)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    full = torch.ones(1, t, dtype=torch.long)
    bloom = bloom_alibi(full, heads, torch.float32).reshape(heads, 1, t)
    a = torch.softmax((scores + bloom).masked_fill(~causal, float("-inf")), -1)
    b = torch.softmax((scores + alibi_bias(alibi_slopes(heads), t, t)).masked_fill(~causal, float("-inf")), -1)
    assert compare(a, b).passed


def test_alibi_bias_aligns_queries_to_the_end() -> None:
    """Decoding: 2 queries over 5 keys; the bias is 0 at each query's own key, -slope per step back."""
    bias = alibi_bias(torch.tensor([0.5]), 2, 5)
    assert torch.equal(bias[0], torch.tensor([[-1.5, -1.0, -0.5, 0.0, 0.5], [-2.0, -1.5, -1.0, -0.5, 0.0]]))


def test_learned_positions_match_opt() -> None:
    opt = OPTLearnedPositionalEmbedding(10, 8)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = opt(mask)
    ids = position_ids_from_attention_mask(mask, pad_value=-1)
    assert torch.equal(learned_positions(opt.weight, ids, offset=2), expected)


def test_position_ids_from_left_padded_mask() -> None:
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert torch.equal(position_ids_from_attention_mask(mask), torch.tensor([[1, 1, 0, 1], [0, 1, 2, 3]]))


def test_seq_ids_read_packing_as_transformers_does() -> None:
    """Documents of 5, 3, 8 and of 10, 2, 4 tokens, the last starting at position 3: a new document
    wherever a position does not follow the one before it."""
    positions = torch.tensor([[*range(5), *range(3), *range(8)], [*range(10), *range(2), *range(3, 7)]])
    ids = seq_ids_from_position_ids(positions)
    assert ids.tolist() == [[0] * 5 + [1] * 3 + [2] * 8, [0] * 10 + [1] * 2 + [2] * 4]
    assert torch.equal(ids, find_packed_sequence_indices(positions))
    assert seq_ids_from_position_ids(torch.arange(7)[None] + 4).tolist() == [[0] * 7]  # one document
    with pytest.raises(ValueError, match="position_ids must be"):
        seq_ids_from_position_ids(torch.arange(7))
