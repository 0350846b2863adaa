"""Tiny models for the optimize tests: Hugging Face decoders from random configs (no downloads) and
plain torch models. Each factory returns `(model, example_inputs)`; HF factories import transformers
inside, so this module imports with torch alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

VOCAB = 96
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


@contextmanager
def weights_kept(model: nn.Module) -> Iterator[nn.Module]:
    """Loads the model's own weights back on exit: a test that loads others into a module-scoped model
    leaves it as it found it, whatever order the tests run in."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        yield model
    finally:
        model.load_state_dict(saved)


def lm_inputs(batch: int = 2, seq: int = 8) -> dict[str, Tensor]:
    ids = torch.randint(3, VOCAB, (batch, seq))
    return {"input_ids": ids, "labels": ids.clone()}


def llama(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**{**DECODER, **overrides})).eval(), lm_inputs()


def gemma() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import GemmaConfig, GemmaForCausalLM

    model = GemmaForCausalLM(GemmaConfig(**DECODER, head_dim=8)).eval()
    with torch.no_grad():  # Gemma's norm weights start at 0: make them tell (1 + w) from w
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.1)
    return model, lm_inputs()


def qwen2() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**DECODER)).eval(), lm_inputs()


def _noisy_norms(model: nn.Module) -> nn.Module:
    """Gemma's norm weights start at 0: make them tell (1 + w) from w."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.1)
    return model


def mistral(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**{**DECODER, "sliding_window": 6, **overrides})  # a window shorter than the inputs
    return MistralForCausalLM(config).eval(), lm_inputs()


def qwen3() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**DECODER, head_dim=8)).eval(), lm_inputs()


def gemma2(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(**{**DECODER, "head_dim": 8, "sliding_window": 6, "attn_implementation": "eager",
                             **overrides})
    return _noisy_norms(Gemma2ForCausalLM(config)).eval(), lm_inputs()


def gemma3(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**{**DECODER, "head_dim": 8, "sliding_window": 6, "sliding_window_pattern": 2,
                                 **overrides})
    return _noisy_norms(Gemma3ForCausalLM(config)).eval(), lm_inputs()


def phi3() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(**{**DECODER, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2})
    return Phi3ForCausalLM(config).eval(), lm_inputs()


def gpt2() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, loss_type="ForCausalLM")
    return GPT2LMHeadModel(config).eval(), lm_inputs()


def gpt_neox(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    """GPT-NeoX (Pythia): packed per-head query_key_value, a quarter of each head rotated, parallel residual."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    sizes = {k: v for k, v in DECODER.items() if k != "num_key_value_heads"}  # K/V heads = heads
    config = GPTNeoXConfig(**{**sizes, "rotary_pct": 0.25, **overrides})
    return GPTNeoXForCausalLM(config).eval(), lm_inputs()


def falcon(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    """Falcon's new decoder architecture (Falcon-40B/180B): query_key_value grouped per KV head, 2 of 4."""
    from transformers import FalconConfig, FalconForCausalLM

    sizes = dict(vocab_size=VOCAB, hidden_size=32, ffn_hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
    config = FalconConfig(**{**sizes, "new_decoder_architecture": True, "num_kv_heads": 2, **overrides})
    return FalconForCausalLM(config).eval(), lm_inputs()


def falcon_multi_query() -> tuple[nn.Module, dict[str, Tensor]]:
    """Falcon-7B's layout: one K/V head after the query heads, sequential residual, biases."""
    return falcon(new_decoder_architecture=False, multi_query=True, parallel_attn=False, bias=True)


def falcon_per_head() -> tuple[nn.Module, dict[str, Tensor]]:
    """Falcon without multi_query: [q, k, v] interleaved per head, as GPT-NeoX."""
    return falcon(new_decoder_architecture=False, multi_query=False, num_kv_heads=4)


def falcon_h1() -> tuple[nn.Module, dict[str, Tensor]]:
    """Falcon-H1: attention and Mamba-2 mixers side by side (transformers' PyTorch Mamba path on CPU), and a
    gated MLP `feed_forward` with gate and down multipliers (mlp_multipliers, not 1 here)."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(**{**DECODER, "head_dim": 8, "mamba_d_ssm": 32, "mamba_n_heads": 2, "mamba_d_head": 16,
                               "mamba_n_groups": 1, "mamba_d_state": 8, "mamba_chunk_size": 8,
                               "mlp_multipliers": [0.7, 1.9]})
    return FalconH1ForCausalLM(config).eval(), lm_inputs()


def stablelm(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    """StableLM (3B/Zephyr): a quarter of each head rotated, LayerNorms."""
    from transformers import StableLmConfig, StableLmForCausalLM

    config = StableLmConfig(**{**DECODER, "partial_rotary_factor": 0.25, **overrides})
    return StableLmForCausalLM(config).eval(), lm_inputs()


def stablelm_qk_layernorm() -> tuple[nn.Module, dict[str, Tensor]]:
    """StableLM 2 12B's variant: per-head LayerNorms on q and k, parallel residual."""
    model, inputs = stablelm(qk_layernorm=True, use_parallel_residual=True)
    with torch.no_grad():  # the per-head norms start at weight 1: make each head's differ
        for name, p in model.named_parameters():
            if "layernorm.norms" in name:
                p.normal_(1, 0.1)
    return model, inputs


def padded_lm_inputs(batch: int = 2, seq: int = 8) -> dict[str, Tensor]:
    """lm_inputs with row 1's last 2 positions padding: attention_mask 0 there, labels -100."""
    inputs = lm_inputs(batch, seq)
    mask = torch.ones_like(inputs["input_ids"])
    mask[1, -2:] = 0
    inputs["labels"][mask == 0] = -100
    return {**inputs, "attention_mask": mask}


MOE = dict(num_experts_per_tok=2, moe_intermediate_size=48)


def mixtral(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(**{**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2, **overrides})
    return MixtralForCausalLM(config).eval(), lm_inputs()


def qwen2_moe(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    # layer 0 a sparse block (router, 4 experts, a gated shared expert), layer 1 a dense MLP
    config = Qwen2MoeConfig(**{**DECODER, **MOE, "num_experts": 4, "shared_expert_intermediate_size": 64,
                               "mlp_only_layers": [1], **overrides})
    return Qwen2MoeForCausalLM(config).eval(), lm_inputs()


def qwen3_moe(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**{**DECODER, **MOE, "num_experts": 4, "head_dim": 8, **overrides})
    return Qwen3MoeForCausalLM(config).eval(), lm_inputs()


def t5(**overrides: Any) -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(**{"vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
                         "num_heads": 4, "decoder_start_token_id": 0, **overrides})
    model = T5ForConditionalGeneration(config).eval()
    ids = torch.randint(3, VOCAB, (2, 8))
    labels = torch.randint(3, VOCAB, (2, 6))
    return model, {"input_ids": ids, "labels": labels}


class Block(nn.Module):
    """Pre-norm residual MLP block."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc(torch.relu(self.norm(x)))


class Stack(nn.Module):
    """Repeated blocks, a final RMSNorm and a head; `shared` is one LayerNorm held at two paths."""

    def __init__(self, dim: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.shared = nn.LayerNorm(dim)
        self.again = self.shared
        self.final = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, 4)

    def forward(self, x: Tensor) -> Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(self.final(self.again(self.shared(x))))


def stack() -> tuple[nn.Module, tuple[Tensor]]:
    return Stack(), (torch.randn(4, 5, 16),)


class SmallCNN(nn.Module):
    """Conv, BatchNorm, GroupNorm, pooling: nothing a norm rule of ours takes (no torchvision)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(8, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).flatten(1))


def cnn() -> tuple[nn.Module, tuple[Tensor]]:
    return SmallCNN().eval(), (torch.randn(2, 3, 8, 8),)
