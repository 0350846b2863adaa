"""Memory bottlenecks on CPU: what one training step holds (measured saved tensors, parameters,
gradients, an optimizer's state), the largest tensor's line, and the suggestions with their estimates.
The CUDA allocator's peak is checked on a GPU only."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.memory.memory import analyze_memory, repeated_blocks
from kernel_pytorch.assistant.memory.step import measure_step

NO_COMPILE = kp.AnalysisOptions(measure_compile_time=False)


class Block(nn.Module):
    def __init__(self, d: int = 32, h: int = 256) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.gelu(self.up(x))  # MEM:largest
        return x + self.down(hidden)


class Stack(nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class GatedLM(nn.Module):
    def __init__(self, d: int = 16, h: int = 512, vocab: int = 33000) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False), nn.Linear(h, d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: Tensor, labels: Tensor | None = None) -> Tensor:
        x = x + self.down(F.silu(self.gate(x)) * self.up(x))
        return x if labels is None else F.cross_entropy(self.head(x), labels)


def _line(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# MEM:{marker}"))


def _memory(model: nn.Module, inputs: object, device: str = "cpu", **kw: object) -> dict[str, object]:
    ctx = kp.CompilerOptimizationAssistant(NO_COMPILE, device=device).context(model, inputs)
    return {f.id: f for f in analyze_memory(ctx, **kw)}


def test_saved_tensors_are_measured_and_attributed() -> None:
    model, x = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8)), torch.randn(4, 16)
    run = measure_step(model, (x,), {})
    # the first Linear saves x, GELU its input, the last Linear its input: 4 x (16 + 64 + 64) fp32
    assert run.activations == 4 * (16 + 64 + 64) * 4
    assert run.by_module == {"0": 4 * 16 * 4, "1": 4 * 64 * 4, "2": 4 * 64 * 4}
    params = sum(p.numel() * 4 for p in model.parameters())
    assert run.params == run.grads == params and run.peak is None and run.error is None
    assert all(p.grad is None for p in model.parameters())  # restored


def test_summary_largest_and_checkpointing() -> None:
    model, x = Stack(), torch.randn(2, 8, 32)
    ctx = kp.CompilerOptimizationAssistant(NO_COMPILE, device="cpu").context(model, (x,))
    found = {f.id: f for f in analyze_memory(ctx)}
    summary = found["memory.summary"]
    assert summary.data["peak_measured"] is False and "no allocator peak counter" in summary.evidence
    assert summary.data["activations"] > 0 and summary.data["optimizer_state"] is None
    assert summary.data["optimizer_state_estimate_adamw"] == 8 * sum(p.numel() for p in model.parameters())
    assert any(k.startswith("layers.") for k in summary.data["activations_by_module"])
    largest = found["memory.largest-tensors"]
    assert largest.location is not None and largest.location.line == _line("largest")
    assert largest.data["tensors"][0]["shape"] == [2, 8, 256]
    ckpt = found["memory.checkpointing"]
    assert ckpt.data["blocks"] == ["layers.0", "layers.1", "layers.2"] and ckpt.data["freed_bytes"] > 0
    assert "estimated" in (ckpt.estimated_gain or "")
    # the recompute is priced in the eager step the report's kernel profile measured, and its time is a
    # cost, not a gain: the gain the ranking reads is the memory freed
    step = ctx.runtime.timings["eager fwd"].median_ms
    assert ckpt.data["step_ms"] == step and ckpt.data["step_measured"]
    assert ckpt.data["cost_ms"] == pytest.approx(step * ckpt.data["recompute_share"])
    assert "the kernel profile measured" in ckpt.estimated_gain and ckpt.data["gain_bytes"] == ckpt.data["freed_bytes"]
    # the printed fix runs, and checkpointed blocks save less for backward
    code = ckpt.suggestion.split("`")[1]
    patched = copy.deepcopy(model)
    exec(code, {"model": patched, "functools": functools, "torch": torch})
    assert measure_step(patched, (x,), {}).activations < summary.data["activations"]
    assert repeated_blocks(model) == ("layers", ["layers.0", "layers.1", "layers.2"])


def test_optimizer_step_measured_and_parameters_restored() -> None:
    model, x = Stack(n=2), torch.randn(2, 8, 32)
    before = copy.deepcopy(model.state_dict())
    summary = _memory(model, (x,), optimizer=torch.optim.AdamW)["memory.summary"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert 2 * params <= summary.data["optimizer_state"] <= 2 * params + 64 * len(before)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_large_vocabulary_autocast_and_gated_mlp() -> None:
    model, inputs = GatedLM(), (torch.randn(64, 16), torch.randint(0, 33000, (64,)))
    found = _memory(model, inputs)
    assert found["memory.logits"].data["vocab"] == 33000 and found["memory.logits"].data["saved_logits"] > 0
    assert "(in development)" in found["memory.logits"].suggestion or "`kp." in found["memory.logits"].suggestion
    assert found["memory.autocast"].data["fp32_saved"] > 0
    mlp = _memory(GatedLM(vocab=8), (torch.randn(64, 16),))["memory.gated-mlp"]  # no logits to dwarf it
    assert mlp.data["freed_bytes"] == 64 * 512 * 4 and mlp.data["modules"] == [""]


def test_a_training_kv_cache_is_found_with_its_size() -> None:
    """An HF Llama in training with transformers' default use_cache returns a cache: found, measured (K and V
    of every layer); with use_cache=False, or in eval, nothing is said."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 64, (2, 8))
    found = _memory(model, {"input_ids": ids, "labels": ids})["memory.training-kv-cache"]
    kv_bytes = 2 * 8 * 2 * 8 * 4  # batch 2 x 2 KV heads x 8 tokens x head 8, fp32, per tensor
    assert found.data["tensors"] == 2 * config.num_hidden_layers and found.data["bytes"] == 4 * kv_bytes
    assert "use_cache=False" in found.suggestion
    assert "memory.training-kv-cache" not in _memory(model, {"input_ids": ids, "labels": ids, "use_cache": False})
    assert "memory.training-kv-cache" not in _memory(model.eval(), {"input_ids": ids, "labels": ids})


def test_no_parameters_is_skipped() -> None:
    found = _memory(nn.GELU(), (torch.randn(4, 4),))
    assert list(found) == ["memory.skipped"]


@pytest.mark.cuda
def test_cuda_peak_is_measured() -> None:
    model, x = Stack().cuda(), torch.randn(4, 64, 32, device="cuda")
    run = measure_step(model, (x,), {})
    assert run.peak is not None and run.peak >= run.activations
    summary = _memory(model, (x,), device="cuda")["memory.summary"]
    assert summary.data["peak_measured"] is True and summary.data["peak_bytes"] >= summary.data["activations"]
