"""Every family of the corpus (tests/optimize/corpus.py) through what a user does with it: the default
`optimize(model, batch)` call on an ordinary padded training batch with -100 labels passes and keeps every
swap; a training step's loss and every gradient agree with the unmodified model within the fp64-derived
budget; greedy generate() gives the same tokens, also on a left-padded batch; save/load round-trips bit
for bit; the state_dict keys are unchanged; and `kernel-pytorch analyze` runs on it (exit 0) with its
recompilations fixed.

The families run in one process; each model is tiny (hidden 32, 2 layers, vocab 96) so the whole corpus
fits the CI budget.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.cli.main import main as cli
from kernel_pytorch.validation.compare import compare_named
from kernel_pytorch.validation.reference64 import fp64_copy
from kernel_pytorch.validation.runs import Run, named, run_model
from tests.optimize import corpus

pytest.importorskip("transformers")

CORE = {"hf_rms_norm": 5, "hf_gated_mlp": 2, "hf_attention": 2, "fused_linear_cross_entropy": 1}
WITH_EMBEDDING = {**CORE, "torch_embedding": 1}
# packed query_key_value attention, dense_h_to_4h -> GELU -> dense_4h_to_h MLPs, LayerNorms
PACKED = {"hf_attention": 2, "fc_mlp": 2, "torch_layer_norm": 5, "fused_linear_cross_entropy": 1, "torch_embedding": 1}
MOE = {"hf_rms_norm": 5, "hf_attention": 2, "fused_linear_cross_entropy": 1, "torch_embedding": 1}
EXPECTED: dict[str, dict[str, int]] = {
    "llama": WITH_EMBEDDING,
    "mistral": WITH_EMBEDDING,
    "qwen2": WITH_EMBEDDING,
    "qwen3": WITH_EMBEDDING,
    "gemma": {**CORE, "hf_scaled_embedding": 1},  # lookup * embed_scale
    "gemma2": {**CORE, "hf_scaled_embedding": 1, "hf_rms_norm": 9},  # the loss soft-capped
    "gemma3": {**CORE, "hf_scaled_embedding": 1, "hf_rms_norm": 9},
    "phi3": {"hf_rms_norm": 5, "packed_gated_mlp": 2, "hf_attention": 2, "fused_linear_cross_entropy": 1,
             "torch_embedding": 1},
    "gpt2": {"torch_layer_norm": 5, "fused_linear_cross_entropy": 1, "torch_embedding": 2},
    "gpt_neox": PACKED,
    "falcon": PACKED,
    "stablelm": {"hf_attention": 2, "hf_gated_mlp": 2, "torch_layer_norm": 5, "fused_linear_cross_entropy": 1,
                 "torch_embedding": 1},
    "mixtral": MOE,
    "qwen2_moe": {**MOE, "hf_gated_mlp": 2},  # the shared expert is a plain gated MLP
    "qwen3_moe": MOE,
    "opt": {"torch_layer_norm": 5, "fused_linear_cross_entropy": 1, "torch_embedding": 1},
    "t5": {"hf_rms_norm": 12, "fused_linear_cross_entropy": 1, "torch_embedding": 5},
    "bert": {"torch_layer_norm": 6, "torch_embedding": 3},
    "vit": {"torch_layer_norm": 5, "fc_mlp": 2},
}
assert set(EXPECTED) == set(corpus.FAMILIES)


def _no_dropout(model: nn.Module) -> None:
    """Dropout off in training mode, so two models' training steps can be compared."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for k, v in vars(m).items():
            if "dropout" in k and isinstance(v, float):
                setattr(m, k, 0.0)


def _loss_and_grads(run: Run) -> dict:
    return {"loss": run.outputs["loss"], **run.grads}


def _training_step_agrees(reference: nn.Module, model: nn.Module, batch: dict) -> None:
    """One training step of each (dropout off): loss and every gradient within the fp64-derived budget."""
    for m in (reference, model):
        _no_dropout(m)
        m.train()
    shared = [n for n, p in reference.named_parameters() if p.requires_grad]
    wanted = [("output['loss']", torch.float32)]
    base = run_model(reference, named(reference, shared), batch, with_grads=True, seed=0, grad_outputs=wanted)
    ours = run_model(model, named(model, shared), batch, with_grads=True, seed=0, grad_outputs=wanted)
    hi64, label = fp64_copy(reference, batch, "auto")
    assert hi64 is not None, label
    hi = hi64.run(shared, batch, with_grads=True, seed=0, grad_outputs=wanted)
    checks = compare_named(_loss_and_grads(ours), _loss_and_grads(base), reference_hi=_loss_and_grads(hi))
    assert {c.name for c in checks} >= {"loss", *(f"grad(param {n!r})" for n in shared)}
    bad = [c.message() for c in checks if not c.passed]
    assert not bad, bad[:3]
    for m in (reference, model):
        m.eval()


def _generate(model: nn.Module, inputs: dict) -> torch.Tensor:
    return model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=0)


def _analyse(family: str, out: Path) -> None:
    """`kernel-pytorch analyze corpus.py:FAMILY` on the recompilation sweep: exit 0, recompiles fixed."""
    rc = cli(["analyze", f"{corpus.__file__}:{family}", "--sections", "recompilations", "--backend", "eager",
              "--no-compile-time", "--no-profile", "--shapes", "batch=4;seq=12", "--json", str(out), "-q"])
    assert rc == 0
    findings = json.loads(out.read_text())["sections"]["recompilations"]
    summary = [f for f in findings if f["id"] == "recompile.summary"]
    for f in summary:
        assert f["data"]["recompiles_after"] == 0, f["title"]


@pytest.mark.parametrize("family", corpus.FAMILIES)
def test_family(family: str, tmp_path: Path) -> None:
    model, batch = corpus.build(family)
    reference = copy.deepcopy(model)
    keys = list(model.state_dict())
    prompts = [{"input_ids": batch["input_ids"][:1, :5]}, corpus.left_padded_prompt()] \
        if family in corpus.GENERATES else []
    tokens = [_generate(reference, p) for p in prompts]

    model, report = kp.optimize(model, batch)  # the default call, as a user makes it
    assert report.passed, report.summary()
    assert not report.reverted(), report.summary(validation=False)
    assert report.counts() == EXPECTED[family], report.summary(validation=False)
    corr = report.validation.correctness_check
    assert corr.reference.startswith("fp64 copy"), corr.reference
    assert corr.given_inputs_seeds == [] and len(corr.checks) == 2  # both seeds ran, on inputs drawn for them
    assert list(model.state_dict()) == keys

    _training_step_agrees(reference, model, batch)
    for prompt, expected in zip(prompts, tokens):
        assert torch.equal(_generate(model, prompt), expected)

    kp.save(model, tmp_path / "saved", report=report)
    loaded = kp.load(tmp_path / "saved", lambda: corpus.build(family)[0])
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]
    with torch.no_grad():
        got, want = loaded(**batch), model(**batch)
    for name in ("loss", "logits"):
        assert torch.equal(got[name], want[name]), name

    _analyse(family, tmp_path / "analysis.json")
