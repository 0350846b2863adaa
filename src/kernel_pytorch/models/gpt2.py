"""A GPT-2-style decoder in plain torch, with Hugging Face GPT-2's module names.

Shapes: B batch, T tokens (T <= max_seq_len), D = dim, H heads, V vocab.

    x = wte(input_ids) + wpe(positions)                      (B, T, D)
    per block: x = x + attn.c_proj(causal_attn(attn.c_attn(ln_1(x))))
               x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
    logits = lm_head(ln_f(x)), lm_head tied to wte            (B, T, V)

HF stores c_attn/c_fc/c_proj as `Conv1D` with (in, out) weights; here they are `nn.Linear` with the
usual (out, in) layout so that linear-layer optimisations apply, so HF checkpoints load after a transpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch.models._common import HeadSplit, LayerNormBlock, causal_lm_loss, zero_


@dataclass(frozen=True)
class GPT2Config(HeadSplit):
    """Sizes of a GPT-2-style decoder. Defaults are the `tiny` CPU preset."""

    vocab_size: int = 512
    max_seq_len: int = 128
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    intermediate_size: int = 256
    norm_eps: float = 1e-5
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        self.check_heads()

    @classmethod
    def gpt2_small(cls) -> GPT2Config:
        """GPT-2 small (124M parameters with the tied head)."""
        return cls(
            vocab_size=50257, max_seq_len=1024, dim=768, n_layers=12, n_heads=12, intermediate_size=3072
        )


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention with one fused qkv projection. x (B, T, D) -> (B, T, D)."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.num_heads = config.n_heads
        self.head_dim = config.head_dim
        self.c_attn = nn.Linear(config.dim, 3 * config.dim)
        self.c_proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.num_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        return self.c_proj(out.transpose(1, 2).reshape(b, t, d))


class GPT2MLP(nn.Module):
    """c_proj(gelu_tanh(c_fc(x))); x (B, T, D) -> (B, T, D)."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.dim, config.intermediate_size)
        self.c_proj = nn.Linear(config.intermediate_size, config.dim)
        # GPT-2 was trained with the tanh approximation of GELU.
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(LayerNormBlock):
    """Pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(.)). x (B, T, D) -> (B, T, D)."""

    parts = ("ln_1", "attn", "ln_2", "mlp")

    def __init__(self, config: GPT2Config) -> None:
        super().__init__(config.dim, config.norm_eps, GPT2Attention(config), GPT2MLP(config))


class GPT2Model(nn.Module):
    """Token + learned position embeddings, blocks, final LayerNorm. input_ids (B, T) -> (B, T, D)."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.dim)
        self.wpe = nn.Embedding(config.max_seq_len, config.dim)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.dim, eps=config.norm_eps)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,), broadcast over B
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    """GPT2Model plus the tied vocabulary projection.

    forward(input_ids (B, T) long, labels (B, T) long or None):
        without labels -> logits (B, T, V); with labels -> scalar next-token cross-entropy (fp32).
    """

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """GPT-2 always shares lm_head.weight with wte.weight."""
        self.lm_head.weight = self.transformer.wte.weight

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2's init: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2L)."""
        self.tie_weights()
        std = self.config.initializer_range
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                # Each block adds two residual branches; scaling keeps the residual stream's variance flat.
                scale = 1 / math.sqrt(2 * self.config.n_layers) if name.endswith("c_proj") else 1.0
                nn.init.normal_(module.weight, 0.0, std * scale, generator=generator)
                zero_(getattr(module, "bias", None))
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                zero_(module.bias)

    def forward(self, input_ids: Tensor, labels: Tensor | None = None) -> Tensor:
        if not torch.compiler.is_compiling() and input_ids.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence length {input_ids.shape[1]} > max_seq_len {self.config.max_seq_len}")
        logits = self.lm_head(self.transformer(input_ids))
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels)


__all__ = ["GPT2Attention", "GPT2Block", "GPT2Config", "GPT2LMHeadModel", "GPT2MLP", "GPT2Model"]
