"""optimize() on tiny Hugging Face decoders and plain torch models: the expected modules are swapped
(by instance), names, state_dicts, ties, modes and generate() survive, validation reverts what fails."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.optimize import CompileOptions, Match, OptimizeReport, optimize
from kernel_pytorch.optimize.rules.norm import rms_norm_options
from kernel_pytorch.tolerances import compare
from tests.optimize import models

transformers = pytest.importorskip("transformers")

N_NORMS = 5  # two per layer in two layers, and the final norm
N_MLPS = 2  # one per layer
N_ATTENTION = 2  # one per layer
DECODER_COUNTS = {"hf_rms_norm": N_NORMS, "hf_gated_mlp": N_MLPS, "hf_attention": N_ATTENTION,
                  "fused_linear_cross_entropy": 1, "torch_embedding": 1}


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message()


@pytest.fixture(scope="module")
def llama_run() -> dict:
    torch.manual_seed(0)
    model, inputs = models.llama(tie_word_embeddings=True)
    prompt = inputs["input_ids"][:1, :5]
    before = {
        "tokens": model.generate(prompt, max_new_tokens=4, do_sample=False),
        "logits": model(**inputs).logits.detach(),
        "params": {n: p for n, p in model.named_parameters()},
        "keys": list(model.state_dict()),
        "classes": {type(m) for m in model.modules()},
    }
    out, report = optimize(model, inputs)
    return {"model": out, "report": report, "inputs": inputs, "prompt": prompt, "before": before}


def test_llama_norms_swapped_by_instance(llama_run: dict) -> None:
    model, report = llama_run["model"], llama_run["report"]
    assert report.passed and report.validated
    assert report.counts() == DECODER_COUNTS
    norms = [m for n, m in model.named_modules() if n.endswith("norm")]
    assert len(norms) == N_NORMS and all(type(m) is kp.nn.RMSNorm for m in norms)
    # the transformers class itself is untouched, and still what a fresh model is built from
    from transformers.models.llama import modeling_llama

    assert modeling_llama.LlamaRMSNorm.forward is not kp.nn.RMSNorm.forward
    fresh, _ = models.llama()
    assert type(fresh.model.norm) is modeling_llama.LlamaRMSNorm


def test_llama_keeps_parameters_keys_ties_and_outputs(llama_run: dict) -> None:
    model, before = llama_run["model"], llama_run["before"]
    # the same Parameter objects under the same names: an optimizer built before keeps working
    assert {n: id(p) for n, p in model.named_parameters()} == {n: id(p) for n, p in before["params"].items()}
    assert list(model.state_dict()) == before["keys"]
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _close(model(**llama_run["inputs"]).logits, before["logits"])
    assert torch.equal(model.generate(llama_run["prompt"], max_new_tokens=4, do_sample=False), before["tokens"])


def test_llama_state_dict_round_trips(llama_run: dict) -> None:
    model, inputs = llama_run["model"], llama_run["inputs"]
    fresh, _ = models.llama(tie_word_embeddings=True)
    fresh.load_state_dict(model.state_dict())  # ours -> transformers'
    _close(fresh(**inputs).logits, model(**inputs).logits)
    with models.weights_kept(model):
        other, _ = models.llama(tie_word_embeddings=True)
        model.load_state_dict(other.state_dict())  # transformers' -> ours
        _close(model(**inputs).logits, other(**inputs).logits)


def test_llama_train_eval_reach_the_swapped_modules(llama_run: dict) -> None:
    model = llama_run["model"]
    model.train()
    assert model.model.norm.training
    loss = model(**llama_run["inputs"]).loss
    loss.backward()
    assert model.model.norm.weight.grad is not None
    model.zero_grad(set_to_none=True)
    model.eval()
    assert not model.model.norm.training


def test_bf16_llama_rounds_as_transformers() -> None:
    model, inputs = models.llama()
    model.to(torch.bfloat16)
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.passed and report.counts() == DECODER_COUNTS
    assert model.model.norm.weight.dtype == torch.bfloat16


def test_qwen2_norms_swapped() -> None:
    model, inputs = models.qwen2()
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.passed and report.counts() == DECODER_COUNTS


def test_gemma_norms_swapped_with_their_rounding() -> None:
    model, inputs = models.gemma()
    _, report = optimize(model, inputs, seeds=(0,))
    # GemmaTextScaledWordEmbedding: lookup * embed_scale, recognised by its probe
    counts = {k: v for k, v in DECODER_COUNTS.items() if k != "torch_embedding"}
    assert report.passed and report.counts() == {**counts, "hf_scaled_embedding": 1}
    assert (model.model.norm.casting, model.model.norm.offset) == ("gemma", 1.0)
    assert "Gemma-style" in next(c for c in report.applied() if c.rule == "hf_rms_norm").reason
    assert rms_norm_options("gemma") == {"casting": "gemma", "offset": 1.0}


def test_gpt2_layer_norms_swapped() -> None:
    model, inputs = models.gpt2()
    keys = list(model.state_dict())
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.passed and report.counts() == {"torch_layer_norm": N_NORMS, "fused_linear_cross_entropy": 1,
                                              "torch_embedding": 2}  # token and position tables
    assert type(model.transformer.ln_f) is kp.nn.LayerNorm and type(model.transformer.wpe) is kp.nn.Embedding
    assert list(model.state_dict()) == keys
    fresh, _ = models.gpt2()
    fresh.load_state_dict(model.state_dict())


def test_builtin_vit_layer_norms_swapped() -> None:
    from kernel_pytorch.models import build_model

    model, inputs = build_model("vit-tiny")
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.passed and report.counts() == {"torch_layer_norm": N_NORMS, "fc_mlp": N_MLPS}


def test_plain_stack_shared_module_stays_shared() -> None:
    model, inputs = models.stack()
    expected = model(*inputs)
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.counts() == {"torch_layer_norm": 4, "torch_rms_norm": 1}
    assert model.shared is model.again and type(model.shared) is kp.nn.LayerNorm
    _close(model(*inputs), expected)


def test_cnn_has_nothing_to_swap() -> None:
    model, inputs = models.cnn()
    _, report = optimize(model, inputs, seeds=(0,))
    assert report.passed and report.changes == []


def test_hooked_module_left_alone() -> None:
    model, inputs = models.stack()
    model.final.register_forward_hook(lambda m, a, out: out)
    _, report = optimize(model, inputs, components="torch_rms_norm", seeds=(0,))
    assert type(model.final) is nn.RMSNorm
    assert [c.reason for c in report.skipped()] == ["has forward/backward hooks, which a new instance would not carry"]


class WrongLayerNorm:
    """A deliberately failing rule: LayerNorm with a far larger eps."""

    name = "wrong_layer_norm"
    family = "test"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if type(module) is not nn.LayerNorm:
            return None
        new = kp.nn.LayerNorm(module.normalized_shape, eps=0.5)
        new.weight, new.bias = module.weight, module.bias
        return Match(new, "LayerNorm with the wrong eps")


def test_failing_rule_is_reverted_and_the_rest_kept() -> None:
    model, inputs = models.stack()
    expected = model(*inputs)
    _, report = optimize(model, inputs, components=[WrongLayerNorm(), "torch_rms_norm"], seeds=(0,))
    assert report.passed
    assert report.counts() == {"torch_rms_norm": 1}
    assert {c.path for c in report.reverted()} == {"blocks.0.norm", "blocks.1.norm", "blocks.2.norm", "shared"}
    assert all("wrong_layer_norm" in c.detail and "MISMATCH" in c.detail for c in report.reverted())
    assert type(model.blocks[0].norm) is nn.LayerNorm and model.shared is model.again
    _close(model(*inputs), expected)
    assert "REVERTED [wrong_layer_norm] blocks.0.norm" in str(report)


def test_report_is_text_and_json() -> None:
    model, inputs = models.stack()
    _, report = optimize(model, inputs, seeds=(0,))
    assert isinstance(report, OptimizeReport)
    data = json.loads(report.to_json())
    assert data["applied"] == 5 and data["passed"] and data["validation"]["passed"]
    assert {c["rule"] for c in data["changes"]} == {"torch_layer_norm", "torch_rms_norm"}
    text = str(report)
    assert text.startswith("optimize: 5 modules replaced") and "correctness_check: PASS" in text
    assert "not measured on the CPU" in text  # compile="auto" on the CPU applies nothing, and says so


def test_regional_compile_on_request() -> None:
    model, inputs = models.stack()
    _, report = optimize(model, inputs, compile=True, compile_options=CompileOptions(backend="eager"),
                         seeds=(0,))
    step = report.compile_steps[0]
    assert (step.name, step.status) == ("regional", "applied") and report.passed
    assert all(b._compiled_call_impl is not None for b in model.blocks)


def test_arguments() -> None:
    model, inputs = models.stack()
    with pytest.raises(ValueError, match="example_inputs"):
        optimize(model)
    with pytest.raises(ValueError, match="no rule or family"):
        optimize(model, inputs, components=["nope"])
    _, report = optimize(model, validate=False, components="norm", compile=False)
    assert not report.validated and len(report.applied()) == 5
    assert "validation: not run" in str(report)


def test_public_name_is_the_function_and_the_package() -> None:
    import kernel_pytorch.optimize.rules  # noqa: F401  (importing a submodule rebinds the attribute)

    model, inputs = models.stack()
    _, report = kp.optimize(model, inputs, seeds=(0,))
    assert report.counts()["torch_layer_norm"] == 4


def test_embedding_rule_keeps_the_table_and_declines_what_it_cannot_keep() -> None:
    from kernel_pytorch.optimize.rules.embedding import TorchEmbeddingRule

    rule = TorchEmbeddingRule()
    table = nn.Embedding(11, 4, padding_idx=3, scale_grad_by_freq=True)
    match = rule.match(table, "wte", table)
    new = match.replacement
    assert type(new) is kp.nn.Embedding and new.weight is table.weight
    assert (new.padding_idx, new.scale_grad_by_freq) == (3, True)
    ids = torch.tensor([[1, 3, 3, 10], [1, 1, 0, 7]])
    new(ids).square().sum().backward()
    ref = table.weight.grad.clone()
    table.weight.grad = None
    table(ids).square().sum().backward()
    assert torch.allclose(ref, table.weight.grad)
    assert rule.match(kp.nn.Embedding(5, 2), "e", table) is None  # already ours
    assert rule.match(nn.Linear(2, 2), "e", table) is None
    for declined, why in ((nn.Embedding(5, 2, max_norm=1.0), "max_norm"), (nn.Embedding(5, 2, sparse=True), "sparse")):
        match = rule.match(declined, "e", declined)
        assert match.replacement is None and why in match.reason
