"""Validation's drawn inputs stay valid inputs of the model: ignored labels keep their positions and
value, masks and positions are kept, ids stay in range, integers of unknown meaning are kept; and when
the original model still cannot run on drawn inputs, that seed falls back to the inputs as given."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kernel_pytorch.validation import validate_optimization
from kernel_pytorch.validation.inputs import named_inputs, redraw, role

FAST = dict(check_performance=False, check_compile=False, check_determinism=False)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 50, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    labels = ids.clone()
    labels[1, -3:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "position_ids": torch.arange(8).expand(2, 8).clone()}


def test_roles_by_name() -> None:
    assert [role(n) for n in ("input_ids", "decoder_input_ids", "idx", "labels", "shift_labels", "targets")] == [
        "ids", "ids", "ids", "labels", "labels", "labels"]
    for kept in ("attention_mask", "decoder_attention_mask", "position_ids", "token_type_ids", "cache_position",
                 "cu_seqlens", "ignore_index"):
        assert role(kept) == "kept", kept
    assert role("pixel_values") == role(None) == "free"


def test_a_padded_batch_stays_a_valid_batch() -> None:
    batch = _batch()
    drawn = redraw(batch, 7)
    ignored = batch["labels"] == -100
    assert torch.equal(drawn["labels"][ignored], batch["labels"][ignored])
    kept = drawn["labels"][~ignored]
    lo, hi = int(batch["labels"][~ignored].min()), int(batch["labels"][~ignored].max())
    assert int(kept.min()) >= lo and int(kept.max()) <= hi
    assert not torch.equal(kept, batch["labels"][~ignored])  # drawn, not copied
    assert torch.equal(drawn["attention_mask"], batch["attention_mask"])
    assert torch.equal(drawn["position_ids"], batch["position_ids"])
    assert not torch.equal(drawn["input_ids"], batch["input_ids"])
    assert int(drawn["input_ids"].min()) >= int(batch["input_ids"].min())
    assert int(drawn["input_ids"].max()) <= int(batch["input_ids"].max())
    again = redraw(batch, 7)
    assert all(torch.equal(again[k], drawn[k]) for k in batch)  # a function of the seed


def test_the_calls_ignore_index_and_float_masks() -> None:
    labels = torch.tensor([[4, 9, 0, 0], [7, 8, 9, 0]])
    mask = torch.zeros(2, 1, 4, 4).masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf"))
    drawn = redraw({"labels": labels, "ignore_index": 0, "mask": mask}, 3)
    assert torch.equal(drawn["labels"] == 0, labels == 0)
    assert torch.equal(drawn["mask"], mask)  # an additive mask is not noise to redraw


def test_positional_inputs_are_read_by_the_forward_names() -> None:
    class M(nn.Module):
        def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor, x: torch.Tensor,
                    *rest: torch.Tensor) -> torch.Tensor:
            return x

    example = (torch.randint(0, 9, (2, 5)), torch.tensor([5, 3]), torch.randint(0, 9, (3,)), torch.arange(4))
    assert [n for n, _ in named_inputs(M(), example)] == ["input_ids", "lengths", "x", None]
    drawn = redraw(example, 1, M())
    assert not torch.equal(drawn[0], example[0])
    for i in (1, 2, 3):  # a length, an integer of unknown meaning, an unnamed positional
        assert torch.equal(drawn[i], example[i])


class _ClassifierLoss(nn.Module):
    """A sequence classifier's loss: labels are class ids, -100 ignored, as HF writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(input_ids).mean(1))
        return nn.functional.cross_entropy(logits, labels)


def test_class_labels_are_drawn_among_the_classes() -> None:
    model = _ClassifierLoss()
    inputs = {"input_ids": torch.randint(0, 50, (4, 6)), "labels": torch.tensor([0, 2, -100, 1])}
    r = validate_optimization(model, copy.deepcopy(model), inputs, seeds=(0, 1, 2), **FAST)
    assert r.passed, r.summary()
    assert r.correctness_check.given_inputs_seeds == []


def test_the_default_optimize_keeps_its_swaps_on_a_padded_hf_batch() -> None:
    transformers = pytest.importorskip("transformers")
    import kernel_pytorch as kp

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 8))
    labels = ids.clone()
    labels[1, -2:] = -100
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    model, report = kp.optimize(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert report.passed, report.summary()
    assert not [c for c in report.changes if c.status == "reverted"]
    assert report.counts()["fused_linear_cross_entropy"] == 1 and report.counts()["hf_rms_norm"] == 3


class _OnlyKnownTokens(nn.Module):
    """Raises on any token id outside the two it was given: no drawn input can be valid."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not bool(((input_ids == 0) | (input_ids == 9)).all()):
            raise ValueError("unknown token")
        return self.emb(input_ids)


def test_inputs_the_original_cannot_run_fall_back_to_the_given_ones() -> None:
    model = _OnlyKnownTokens()
    ids = torch.tensor([[0, 9, 9, 0, 9, 0]])
    r = validate_optimization(model, copy.deepcopy(model), (ids,), seeds=(0, 1), **FAST)
    assert r.passed, r.summary()
    corr = r.correctness_check
    assert corr.given_inputs_seeds == [1] and set(corr.checks) == {0, 1}
    assert any("inputs as given" in n and "unknown token" in n for n in corr.notes)


def test_the_callers_own_inputs_failing_is_the_models_failure() -> None:
    model = _OnlyKnownTokens()
    bad = torch.tensor([[1, 2]])
    r = validate_optimization(model, copy.deepcopy(model), lambda seed: (bad,), seeds=(0, 1), **FAST)
    assert not r.passed and "the original failed" in r.correctness_check.errors[0]
