"""`deploy.quant_accuracy`: a model against itself agrees everywhere (agreement 1, KL 0, no perplexity
change, no divergence), a perturbed copy does not; quantized linear layers' bytes against bf16's;
bad arguments named. No torchao needed (our own backend)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from kernel_pytorch.deploy import QuantAgreement, linear_weight_bytes, quantized_agreement
from kernel_pytorch.deploy.quant_accuracy import greedy, model_logits, stream_stats
from kernel_pytorch.deploy.quantize import quantize
from kernel_pytorch.models import MODELS, build_model

CONFIG = dataclasses.replace(MODELS["llama-tiny"].config, n_layers=1)
NEW = 8  # generated tokens: enough positions for a fraction, few forwards on the CPU


@pytest.fixture(scope="module")
def llama() -> tuple[nn.Module, torch.Tensor]:
    model, (ids,) = build_model("llama-tiny", dtype=torch.float32, config=CONFIG)
    return model, ids


def test_a_model_agrees_with_itself(llama) -> None:
    model, ids = llama
    acc = quantized_agreement(model, copy.deepcopy(model), ids[:, :4], new_tokens=NEW, stream=ids)
    assert isinstance(acc, QuantAgreement)
    assert acc.agreement == 1.0 and acc.first_divergence == (None, None)
    assert acc.kl == 0.0 and acc.ppl_change == 0.0 and acc.max_rel_err == 0.0
    assert acc.ppl_reference == acc.ppl_quantized > 1
    assert acc.new_tokens == NEW and acc.stream_tokens == ids.shape[0] * (ids.shape[1] - 1)
    assert "greedy agreement 1.000" in acc.summary()
    assert acc.to_dict()["first_divergence"] == [None, None]


def test_a_perturbed_copy_disagrees(llama) -> None:
    model, ids = llama
    noisy = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in noisy.modules():
            if isinstance(m, nn.Linear):  # noise of the weights' own size: far beyond any rounding
                m.weight.add_(torch.randn(m.weight.shape, generator=g) * m.weight.std())
    acc = quantized_agreement(model, noisy, ids[:, :4], new_tokens=NEW)  # stream: prompt + continuation
    assert acc.agreement < 1.0 and acc.kl > 0 and acc.max_rel_err > 0 and acc.ppl_change != 0
    assert any(p is not None for p in acc.first_divergence)
    assert acc.stream_tokens == ids.shape[0] * (4 + NEW - 1)
    free = quantized_agreement(model, noisy, ids[:, :4], new_tokens=NEW, free_running=False)
    assert free.first_divergence == () and free.agreement == acc.agreement


def test_teacher_forcing_reads_the_reference_tokens(llama) -> None:
    """The agreement compares next-token argmaxes on the reference's own continuation."""
    model, ids = llama
    prompt = ids[:, :4]
    seq = greedy(model, prompt, NEW)
    assert seq.shape == (2, 4 + NEW) and torch.equal(seq[:, :4], prompt)
    assert torch.equal(model_logits(model, seq[:, :-1])[:, 3:].argmax(-1), seq[:, 4:])


@pytest.mark.parametrize("scheme,group,lo,hi", [("int8", None, 0.5, 0.56), ("int4", 32, 0.25, 0.35)])
def test_linear_weight_bytes_of_a_quantized_model(scheme: str, group: int | None, lo: float, hi: float) -> None:
    model, (ids,) = build_model("llama-tiny", dtype=torch.bfloat16, config=CONFIG)
    reference = copy.deepcopy(model)
    quantized = quantize(model, scheme, backend="kernel_pytorch", group_size=group)
    ratio = linear_weight_bytes(quantized) / linear_weight_bytes(reference)
    assert lo <= ratio < hi, ratio
    acc = quantized_agreement(reference, quantized, ids[:, :4], new_tokens=NEW, stream=ids)
    assert 0 < acc.kl < 0.1 and 0 < acc.max_rel_err and acc.agreement > 0.5


def test_bad_arguments_are_named(llama) -> None:
    model, ids = llama
    with pytest.raises(ValueError, match="new_tokens"):
        quantized_agreement(model, model, ids, new_tokens=0)
    with pytest.raises(ValueError, match="tokens must be token ids"):
        quantized_agreement(model, model, ids.float())
    with pytest.raises(ValueError, match="stream needs at least 2"):
        quantized_agreement(model, model, ids, stream=ids[:, :1])
    with pytest.raises(TypeError, match="logits_fn"):
        model_logits(lambda ids: {"x": ids}, ids)



def test_stream_scored_in_blocks_of_rows() -> None:
    """A long stream is scored a block of positions at a time; the blocks add up to the whole."""
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(23, 50, generator=g)
    q = ref + 0.05 * torch.randn(23, 50, generator=g)
    targets = torch.randint(0, 50, (23,), generator=g)
    whole, blocks = stream_stats(ref, q, targets, rows=1024), stream_stats(ref, q, targets, rows=5)
    assert blocks == pytest.approx(whole, rel=1e-6) and whole[2] > 0
    logp_r, logp_q = ref.log_softmax(-1), q.log_softmax(-1)
    assert whole[0] == pytest.approx(float(-logp_r.gather(1, targets[:, None]).sum()), rel=1e-5)
    assert whole[2] == pytest.approx(float((logp_r.exp() * (logp_r - logp_q)).sum()), rel=1e-4)
    assert whole[3] == float((q - ref).abs().max())
