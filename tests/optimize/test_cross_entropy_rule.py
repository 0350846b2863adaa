"""The cross-entropy rule: an HF *ForCausalLM's lm_head + ForCausalLMLoss becomes one fused linear
cross-entropy through a forward on the instance: the loss is transformers' (shift, ignore_index,
num_items_in_batch, shift_labels), logits are None only in training with labels, the class is untouched.
Gemma 2/3's soft-capping and the MoE router aux loss are computed as transformers does; T5 gets its loss
over unshifted labels; BART, whose logits are not lm_head's alone, is left alone."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rules.cross_entropy import FusedLossLMHead, fused_causal_lm_loss
from kernel_pytorch.tolerances import compare, compare_reordered
from tests.optimize import models

transformers = pytest.importorskip("transformers")


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message()


@pytest.fixture(scope="module")
def tied() -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    torch.manual_seed(0)
    model, inputs = models.llama(tie_word_embeddings=True)
    reference = copy.deepcopy(model)
    _, report = optimize(model, inputs, components="cross_entropy", seeds=(0,))
    assert report.passed and report.counts() == {"fused_linear_cross_entropy": 1}
    assert "tied to the input embedding" in report.applied()[0].reason
    return model, reference, inputs


@pytest.mark.parametrize("options", [{}, {"num_items_in_batch": 7}, {"shift_labels": True}])
def test_loss_and_gradients_are_transformers(tied: tuple, options: dict) -> None:
    model, reference, inputs = tied
    labels = inputs["labels"].clone()
    labels[0, :3] = -100
    if options.get("shift_labels"):
        options = {"shift_labels": torch.roll(labels, -1, dims=1)}
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
    ours = model(input_ids=inputs["input_ids"], labels=labels, **options)
    theirs = reference(input_ids=inputs["input_ids"], labels=labels, **options)
    _close(ours.loss, theirs.loss)
    _close(ours.logits, theirs.logits)  # eval mode: the logits as transformers returns them
    ours.loss.backward()
    theirs.loss.backward()
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        result = compare_reordered(p.grad, grads[name].grad)
        assert result.passed, f"{name}: {result.message()}"


def test_training_skips_the_logits_and_inference_is_untouched(tied: tuple) -> None:
    model, reference, inputs = tied
    model.train()
    try:
        assert model(**inputs).logits is None
        model.lm_head.logits_in_training = True
        assert model(**inputs).logits is not None
    finally:
        model.lm_head.logits_in_training = False
        model.eval()
    # no labels: the class's forward runs (logits_to_keep as transformers slices it)
    _close(model(input_ids=inputs["input_ids"], logits_to_keep=1).logits,
           reference(input_ids=inputs["input_ids"], logits_to_keep=1).logits)


def _cache(output: object) -> object:
    """The output's KV cache, under either name transformers gives the field."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def test_training_with_labels_turns_the_cache_off_unless_asked(tied: tuple) -> None:
    model, reference, inputs = tied
    assert _cache(model(**inputs)) is not None  # eval: as transformers
    model.train()
    reference.train()
    try:
        assert _cache(reference(**inputs)) is not None  # what transformers does in training
        assert _cache(model(**inputs)) is None
        assert _cache(model(**inputs, use_cache=True)) is not None
    finally:
        model.eval()
        reference.eval()


def test_instance_forward_signs_as_the_class_and_detaches(tied: tuple) -> None:
    model, _, _ = tied
    assert "forward" in vars(model) and type(model).forward is type(models.llama()[0]).forward
    assert inspect.signature(model.forward) == inspect.signature(type(model).forward.__get__(model))
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    twin = copy.deepcopy(model)
    assert twin.forward.__self__ is twin
    twin.lm_head.detach(twin)
    assert "forward" not in vars(twin)


def test_optimizing_another_class_leaves_the_attached_forward_signed_as_its_own(tied: tuple) -> None:
    model = tied[0]
    other, inputs = models.qwen2_moe()  # its forward returns another output class
    _, report = optimize(other, inputs, components="cross_entropy", seeds=(0,))
    assert report.counts() == {"fused_linear_cross_entropy": 1}
    for m in (model, other):
        assert inspect.signature(m.forward) == inspect.signature(type(m).forward.__get__(m))
        assert m.forward.__qualname__ == type(m).forward.__qualname__
    assert model.forward.__func__ is not other.forward.__func__


def test_fused_causal_lm_loss_function() -> None:
    torch.manual_seed(0)
    hidden, weight, labels = torch.randn(2, 5, 8), torch.randn(11, 8), torch.randint(0, 11, (2, 5))
    labels[1, 2] = -100
    logits = (hidden @ weight.T)[:, :-1].reshape(-1, 11)
    expected = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), ignore_index=-100)
    _close(fused_causal_lm_loss(hidden, weight, None, labels), expected)


def _grads_match(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        if p.grad is None and grads[name].grad is None:
            continue
        result = compare_reordered(p.grad, grads[name].grad)
        assert result.passed, f"{name}: {result.message()}"


def _train_step(model: torch.nn.Module, reference: torch.nn.Module, inputs: dict) -> tuple:
    """One training forward and backward of both; (ours, theirs) outputs, loss and gradients compared."""
    model.train()
    reference.train()
    try:
        torch.manual_seed(0)
        ours = model(**inputs)
        torch.manual_seed(0)
        theirs = reference(**inputs)
        assert ours.logits is None and theirs.logits is not None and type(ours) is type(theirs)
        _close(ours.loss, theirs.loss)
        ours.loss.backward()
        theirs.loss.backward()
        _grads_match(model, reference)
    finally:
        model.eval()
        reference.eval()
    return ours, theirs


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_logit_softcapping_inside_the_fused_loss(family: str) -> None:
    torch.manual_seed(0)
    # the tiny model's logits are ~0.1: a cap of 0.1 bends them (Gemma 2's 30 would not, at this scale)
    model, inputs = getattr(models, family)(final_logit_softcapping=0.1)
    reference = copy.deepcopy(model)
    _, report = optimize(model, inputs, components="cross_entropy", seeds=(0,))
    assert report.passed and report.counts() == {"fused_linear_cross_entropy": 1}
    assert "soft-capped at 0.1" in report.applied()[0].reason
    labels = inputs["labels"].clone()
    labels[1, :3] = -100
    batch = {"input_ids": inputs["input_ids"], "labels": labels}
    ours, theirs = model(**batch), reference(**batch)
    assert torch.equal(ours.logits, theirs.logits)  # soft-capped as transformers rounds it
    _close(ours.loss, theirs.loss)
    hidden = reference.model(input_ids=inputs["input_ids"]).last_hidden_state
    uncapped = fused_causal_lm_loss(hidden, model.lm_head.weight, None, labels)
    assert not compare(uncapped, theirs.loss).passed  # the cap is what makes them agree
    _train_step(model, reference, batch)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_router_aux_loss_added_as_transformers(family: str) -> None:
    torch.manual_seed(0)
    model, inputs = getattr(models, family)()
    reference = copy.deepcopy(model)
    _, report = optimize(model, inputs, components="cross_entropy", seeds=(0,))
    assert report.passed and report.counts() == {"fused_linear_cross_entropy": 1}
    assert "router aux loss" in report.applied()[0].reason
    ours, theirs = _train_step(model, reference, {**inputs, "output_router_logits": True})
    _close(ours.aux_loss, theirs.aux_loss)
    assert len(ours.router_logits) == len(theirs.router_logits) >= 1  # one per sparse layer
    assert any(p.grad is not None for n, p in model.named_parameters() if n.endswith("gate.weight"))
    # the config's default decides when the call does not
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
        m.config.output_router_logits = True
    ours, _ = _train_step(model, reference, inputs)
    assert ours.aux_loss is not None
    model.zero_grad(set_to_none=True)
    model.config.output_router_logits = False
    assert model(**inputs).aux_loss is None


def test_t5_loss_over_unshifted_labels() -> None:
    torch.manual_seed(0)
    model, inputs = models.t5(tie_word_embeddings=False)  # T5 v1.1: no d_model**-0.5 on the decoder output
    assert not model.config.scale_decoder_outputs
    reference = copy.deepcopy(model)
    _, report = optimize(model, inputs, components="cross_entropy", seeds=(0,))
    assert report.passed and report.counts() == {"fused_linear_cross_entropy": 1}
    assert "cross-entropy over the labels" in report.applied()[0].reason
    labels = inputs["labels"].clone()
    labels[0, 3:] = -100
    decoder_ids = torch.randint(3, models.VOCAB, labels.shape)
    for batch in ({"input_ids": inputs["input_ids"], "labels": labels},
                  {"input_ids": inputs["input_ids"], "labels": labels, "decoder_input_ids": decoder_ids}):
        ours, theirs = model(**batch), reference(**batch)
        _close(ours.loss, theirs.loss)
        assert torch.equal(ours.logits, theirs.logits)
        assert torch.equal(ours.encoder_last_hidden_state, theirs.encoder_last_hidden_state)
        _train_step(model, reference, batch)
        for m in (model, reference):
            m.zero_grad(set_to_none=True)


def test_t5_bf16_loss_in_the_logits_dtype() -> None:
    torch.manual_seed(0)
    model, inputs = models.t5()
    model.to(torch.bfloat16)
    reference = copy.deepcopy(model)
    _, report = optimize(model, inputs, components="cross_entropy", seeds=(0,))
    assert report.passed and report.counts() == {"fused_linear_cross_entropy": 1}
    ours, theirs = model(**inputs), reference(**inputs)
    assert ours.loss.dtype == theirs.loss.dtype == torch.bfloat16  # T5's loss is in its logits' dtype
    _close(ours.loss, theirs.loss)


def test_other_encoder_decoders_left_alone() -> None:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=models.VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_position_embeddings=64)
    model = BartForConditionalGeneration(config).eval()
    ids = torch.randint(3, models.VOCAB, (2, 8))
    _, report = optimize(model, {"input_ids": ids, "labels": ids}, components="cross_entropy", seeds=(0,))
    assert report.counts() == {} and not isinstance(model.lm_head, FusedLossLMHead)
    assert "final_logits_bias beside lm_head" in report.skipped()[0].reason
    assert "forward" not in vars(model)
