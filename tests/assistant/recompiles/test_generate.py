"""generate(): recompiles per decode step with the forward compiled, the static-cache fix verified by
generating again; on a stand-in for a Hugging Face model (the real one runs in test_real_models)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from kernel_pytorch.assistant import CompilerOptimizationAssistant
from kernel_pytorch.assistant.recompiles.generate import describe_reason


class TinyLM(nn.Module):
    """A decoder with HF's generate() contract: the prompt first, then one token per call, and a cache
    that grows by one token per call unless `cache_implementation="static"` allocates it whole."""

    _can_compile_fullgraph = True  # transformers' flag: a static cache is supported

    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)
        self.generation_config = SimpleNamespace(pad_token_id=None, eos_token_id=None)
        self.fail = False

    def forward(self, input_ids: Tensor, cache: Tensor) -> Tensor:
        return self.head(self.embed(input_ids) + cache.sum(1, keepdim=True))

    def generate(
        self, input_ids: Tensor, *, max_new_tokens: int, cache_implementation: str | None = None, **_: Any
    ) -> Tensor:
        if self.fail:
            raise RuntimeError("generation broke")
        assert self.generation_config.pad_token_id is not None  # set for the run
        batch, prompt = input_ids.shape
        length = prompt + max_new_tokens if cache_implementation == "static" else prompt
        cache = torch.zeros(batch, length, self.embed.embedding_dim)
        ids = input_ids
        for step in range(max_new_tokens):
            logits = self(input_ids=ids if step == 0 else ids[:, -1:], cache=cache)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], 1)
            if cache_implementation != "static" and step >= 1:  # as HF's: the prompt's entries come at step 0
                cache = torch.cat([cache, cache[:, :1]], 1)
        return ids


def _analyze(model: nn.Module, tokens: int = 4) -> Any:
    prompt = {"input_ids": torch.randint(0, 16, (2, 6)), "labels": torch.zeros(2, 6, dtype=torch.long)}
    return CompilerOptimizationAssistant().analyze_generate(model, prompt, max_new_tokens=tokens)


def test_recompiles_per_decode_step_and_the_static_cache_fix() -> None:
    torch.manual_seed(0)
    model = TinyLM()
    report = _analyze(model)
    (f,) = report.recompilations
    assert f.id == "generate.recompiles" and report.meta["sections_run"] == ["recompilations"]
    # prefill, the first decode step (6 tokens -> 1), the cache's growth (then automatic dynamic)
    assert f.data["recompiles_per_step"] == [0, 1, 1, 0]
    assert "goes from the prompt's 6 tokens to 1" in f.data["reasons"]["1"][0]
    assert "the KV cache grows by one token per step" in f.data["reasons"]["2"][0]
    static = f.data["attempts"]["static cache"]
    assert static["recompiles_per_step"] == [0, 1, 0, 0] and static["same_tokens"] is True
    assert (f.data["recompiles_before"], f.data["recompiles_after"]) == (2, 1)
    assert 'cache_implementation="static"' in f.suggestion and "verified" in f.title
    # the instance is left as it was: no compiled forward, no pad token
    assert "forward" not in model.__dict__ and model.generation_config.pad_token_id is None


def test_without_a_static_cache_dynamic_true_is_tried() -> None:
    model = TinyLM()
    model._can_compile_fullgraph = False
    (f,) = _analyze(model).recompilations
    assert set(f.data["attempts"]) == {"dynamic=True"}


def test_a_failing_generate_is_a_finding_and_no_generate_is_an_error() -> None:
    model = TinyLM()
    model.fail = True
    (f,) = _analyze(model).recompilations
    assert f.id == "generate.failed" and "generation broke" in f.evidence
    with pytest.raises(TypeError, match=r"Linear has no generate\(\)"):
        CompilerOptimizationAssistant().analyze_generate(nn.Linear(2, 2), (torch.randn(1, 2),))


def test_decode_step_guards_read_as_what_the_loop_does() -> None:
    ids = describe_reason("tensor 'kwargs['input_ids']' size mismatch at index 1. expected 8, actual 1")
    assert ids.startswith("`input_ids` goes from the prompt's 8 tokens to 1")
    keys = "tensor 'kwargs['past_key_values'].layers[0].keys' size mismatch at index 2. expected 8, actual 9"
    assert describe_reason(keys).startswith("the KV cache grows by one token per step")
    assert "different keyword arguments" in describe_reason("len(kwargs) == 4")
