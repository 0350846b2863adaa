"""A Llama-style decoder in plain torch, with Hugging Face Llama's module structure and parameter names.

Shapes: B batch, T tokens, D = dim, H query heads, Hkv key/value heads, Dh = D / H head dim, V vocab.

    x = embed_tokens(input_ids)                                   (B, T, D)
    per layer: x = x + o_proj(attn(rope(q), rope(k), v))          causal, GQA: each kv head serves H/Hkv
               x = x + down_proj(silu(gate_proj(n)) * up_proj(n)) n = RMSNorm(x)
    logits = lm_head(norm(x))                                     (B, T, V)

RMSNorm follows HF's math (normalise in fp32, cast back, then scale), so a HF checkpoint's state_dict
loads unchanged and the modules are the ones later optimisations swap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch.models._common import HeadSplit, PreNormBlock, causal_lm_loss, zero_


@dataclass(frozen=True)
class LlamaConfig(HeadSplit):
    """Sizes of a Llama-style decoder. Defaults are the `tiny` CPU preset."""

    vocab_size: int = 512
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    intermediate_size: int = 176
    max_seq_len: int = 128
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        self.check_heads()
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @classmethod
    def llama3_8b(cls) -> LlamaConfig:
        """Llama-3-8B's sizes (~8.03B parameters)."""
        return cls(
            vocab_size=128256,
            dim=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            intermediate_size=14336,
            max_seq_len=8192,
        )

    @classmethod
    def llama_8layer_2048(cls) -> LlamaConfig:
        """8 Llama-3 layers at hidden 2048 with the full Llama-3 vocabulary (~1.03B parameters)."""
        return replace(cls.llama3_8b(), dim=2048, n_layers=8, n_heads=16, intermediate_size=8192)


class LlamaRMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised in fp32 and cast back before the scale.

    forward: x (..., D) -> (..., D), dtype of x (promoted with weight's dtype, as in HF).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class LlamaRotaryEmbedding(nn.Module):
    """cos/sin tables of rotary position embeddings (half-split layout, as HF Llama).

    The inverse frequencies are computed in forward, in fp32, rather than kept as a buffer: a buffer
    would be cast by `model.to(torch.bfloat16)` and lose the precision of the long wavelengths.

    forward: x (B, T, ...) only for dtype/device, position_ids (B, T) or (1, T) long
        -> (cos, sin), each (B or 1, T, Dh) in x.dtype.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta

    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, device=x.device, dtype=torch.float32) / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponent)  # (Dh/2,)
        freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # (B, T, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, Dh)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate q (B, H, T, Dh) and k (B, Hkv, T, Dh) by cos/sin (B, T, Dh); shapes are kept."""
    cos = cos.unsqueeze(1)  # broadcast over heads
    sin = sin.unsqueeze(1)
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed, k_embed


def repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """(B, Hkv, T, Dh) -> (B, Hkv * n_rep, T, Dh), each kv head repeated for its group of query heads."""
    if n_rep == 1:
        return hidden_states
    b, h_kv, t, d = hidden_states.shape
    expanded = hidden_states[:, :, None, :, :].expand(b, h_kv, n_rep, t, d)
    return expanded.reshape(b, h_kv * n_rep, t, d)


class LlamaAttention(nn.Module):
    """Causal grouped-query self-attention with rotary embeddings.

    forward: hidden_states (B, T, D), position_embeddings (cos, sin) each (B or 1, T, Dh) -> (B, T, D).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.n_heads
        self.num_key_value_heads = config.n_kv_heads
        self.num_key_value_groups = config.n_heads // config.n_kv_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor]) -> Tensor:
        b, t, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        # Repeat kv explicitly rather than SDPA's enable_gqa: every SDPA backend accepts the result.
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)  # (B, H, T, Dh)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down_proj(silu(gate_proj(x)) * up_proj(x)); x (B, T, D) -> (B, T, D)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.dim, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(PreNormBlock):
    """Pre-norm block: x + self_attn(input_layernorm(x), cos/sin), then + mlp(post_attention_layernorm(.)).

    forward: hidden_states (B, T, D), position_embeddings (cos, sin) -> (B, T, D).
    """

    parts = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.dim, eps=config.norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.dim, eps=config.norm_eps)


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm. forward: input_ids (B, T) long -> hidden (B, T, D)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.n_layers))
        self.norm = LlamaRMSNorm(config.dim, eps=config.norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids: Tensor) -> Tensor:
        hidden_states = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # (1, T)
        # One cos/sin table per forward, shared by every layer.
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings)
        return self.norm(hidden_states)


class LlamaForCausalLM(nn.Module):
    """LlamaModel plus the vocabulary projection.

    forward(input_ids (B, T) long, labels (B, T) long or None):
        without labels -> logits (B, T, V) in the model's dtype;
        with labels -> scalar mean next-token cross-entropy in fp32 (position t predicts labels[:, t+1];
        label -100 is ignored), as HF computes it.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head.weight with embed_tokens.weight when the config asks for it."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """HF Llama's init: N(0, initializer_range) for linears and embeddings, ones for norms."""
        self.tie_weights()
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std, generator=generator)
                zero_(getattr(module, "bias", None))
            elif isinstance(module, LlamaRMSNorm):
                module.weight.fill_(1.0)

    def forward(self, input_ids: Tensor, labels: Tensor | None = None) -> Tensor:
        logits = self.lm_head(self.model(input_ids))
        if labels is None:
            return logits
        return causal_lm_loss(logits, labels)


__all__ = [
    "LlamaAttention",
    "LlamaConfig",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "LlamaMLP",
    "LlamaModel",
    "LlamaRMSNorm",
    "LlamaRotaryEmbedding",
    "apply_rotary_pos_emb",
    "causal_lm_loss",
    "repeat_kv",
    "rotate_half",
]
