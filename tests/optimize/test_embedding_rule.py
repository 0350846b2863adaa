"""The scaled-embedding rule: transformers' scaled word embeddings (Gemma's 0-d buffer cast to the
table's dtype, BART's float) become kernel_pytorch.nn.ScaledEmbedding holding the same table and scale
object, bit for bit the original's output in fp32 and bf16; other subclasses with a forward of their own
are left alone, with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import kernel_pytorch as kp
from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rules.embedding import HFScaledEmbeddingRule
from kernel_pytorch.tolerances import compare_reordered
from tests.optimize import models

transformers = pytest.importorskip("transformers")


class FloatScaled(nn.Embedding):
    """BART's form: a float scale."""

    def __init__(self, n: int, h: int, embed_scale: float) -> None:
        super().__init__(n, h, padding_idx=1)
        self.embed_scale = embed_scale

    def forward(self, input_ids: Tensor) -> Tensor:
        return super().forward(input_ids) * self.embed_scale


class Shifted(FloatScaled):
    """Has an embed_scale, computes something else."""

    def forward(self, input_ids: Tensor) -> Tensor:
        return super().forward(input_ids) + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_scaled_embedding_is_the_same_lookup_and_gradient(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model, inputs = models.gemma()
    table = model.model.embed_tokens.to(dtype)
    match = HFScaledEmbeddingRule().match(table, "model.embed_tokens", model)
    new = match.replacement
    assert type(new) is kp.nn.ScaledEmbedding and new.weight is table.weight
    assert new.embed_scale is table.embed_scale and "embed_scale" not in new.state_dict()
    assert list(new.state_dict()) == list(table.state_dict())
    assert new.scalar_embed_scale == table.scalar_embed_scale
    ids = inputs["input_ids"]
    ours, theirs = new(ids), table(ids)
    assert ours.dtype == dtype and torch.equal(ours, theirs)  # the scale rounded to the table's dtype first
    dy = torch.randn_like(ours)
    ours.backward(dy)
    grad, table.weight.grad = table.weight.grad, None
    theirs.backward(dy)
    result = compare_reordered(grad, table.weight.grad)
    assert result.passed, result.message()


def test_float_scale_and_other_forwards() -> None:
    rule = HFScaledEmbeddingRule()
    table = FloatScaled(11, 4, 2.5)
    new = rule.match(table, "e", table).replacement
    assert type(new) is kp.nn.ScaledEmbedding and new.embed_scale == 2.5 and new.padding_idx == 1
    ids = torch.tensor([[1, 3, 10]])
    assert torch.equal(new(ids), table(ids))
    shifted = rule.match(Shifted(11, 4, 2.5), "e", table)
    assert shifted.replacement is None and "does not compute lookup * embed_scale" in shifted.reason
    assert rule.match(nn.Embedding(5, 2), "e", table) is None  # no scale: torch_embedding's
    assert rule.match(kp.nn.ScaledEmbedding(5, 2, embed_scale=2.0), "e", table) is None  # already ours


def test_optimize_swaps_gemma_embedding_and_keeps_it_tied() -> None:
    torch.manual_seed(0)
    model, inputs = models.gemma()
    keys = list(model.state_dict())
    _, report = optimize(model, inputs, components="embedding", seeds=(0,))
    assert report.passed and report.counts() == {"hf_scaled_embedding": 1}
    assert type(model.model.embed_tokens) is kp.nn.ScaledEmbedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict()) == keys
