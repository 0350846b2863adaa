"""The prefill benchmark's sizes, one provider's callable, and its floors: the model's GEMMs alone at the prefill's
shapes (per layer q, k, v, o, gate, up, down at M = batch x tokens, then the lm_head at M = batch), and the
same with causal SDPA in each layer, run back to back with the model's own weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hf_llama import LlamaSize, hf_model
from torch import Tensor, nn

FLOORS = ("gemm-floor", "gemm+sdpa-floor")


@dataclass(frozen=True)
class Size(LlamaSize):
    """The decoder's widths (LlamaSize), the prompt and the batch (the benchmark's config, or --quick's)."""

    tokens: int = 4096
    batch: int = 1
    rep_ms: float = 300.0  # time_fn's measured repetitions, about this long in all

    @property
    def max_positions(self) -> int:
        return self.tokens


QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, tokens=64, rep_ms=50.0)


@dataclass
class Prefill:
    """One provider's prefill: run() -> the last position's logits (B, 1, V); keep holds what it needs alive."""

    run: Callable[[], Tensor]
    compiled: bool
    keep: list[Any] = field(default_factory=list)
    gemm_only: bool = False  # a floor row: no logits to check


def gemm_shapes(size: Size) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of the prefill's GEMMs in the order one layer runs them, then the lm_head's at M = 1."""
    t, h, i, kv = size.batch * size.tokens, size.hidden, size.intermediate, size.kv_heads * size.head_dim
    layer = [("q", t, h, h), ("k", t, kv, h), ("v", t, kv, h), ("o", t, h, h), ("gate", t, i, h), ("up", t, i, h),
             ("down", t, h, i)]
    return layer * size.layers + [("lm_head", size.batch, size.vocab, h)]


def gemm_flops(size: Size) -> int:
    return sum(2 * m * n * k for _, m, n, k in gemm_shapes(size))


def attention_flops(size: Size) -> int:
    """Causal attention's QK^T and PV FLOPs over all layers (half the square)."""
    return size.layers * size.batch * size.heads * 2 * size.tokens * size.tokens * size.head_dim


def floor_prefill(provider: str, size: Size, dev: torch.device, dtype: torch.dtype) -> Prefill:
    """The model's own weights multiplied back to back at the prefill's shapes (`gemm_shapes`); with
    `gemm+sdpa-floor`, causal SDPA at T after each layer's q, k, v (K/V expanded to every query head)."""
    model = hf_model(size, dev, dtype)
    g = torch.Generator(device=dev).manual_seed(3)
    t = size.batch * size.tokens
    x = torch.randn(t, size.hidden, generator=g, device=dev, dtype=dtype)
    mid = torch.randn(t, size.intermediate, generator=g, device=dev, dtype=dtype)
    last = x[-size.batch:].contiguous()
    layers = [(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, m.gate_proj.weight,
               m.up_proj.weight, m.down_proj.weight)
              for a, m in ((layer.self_attn, layer.mlp) for layer in model.model.layers)]
    head = model.lm_head.weight
    qkv = None
    if provider == "gemm+sdpa-floor":
        shape = (size.batch, size.heads, size.tokens, size.head_dim)
        qkv = [torch.randn(shape, generator=g, device=dev, dtype=dtype) for _ in range(3)]
    f = nn.functional

    def run() -> Tensor:
        for wq, wk, wv, wo, wg, wu, wd in layers:
            f.linear(x, wq), f.linear(x, wk), f.linear(x, wv)
            if qkv is not None:
                f.scaled_dot_product_attention(*qkv, is_causal=True)
            f.linear(x, wo), f.linear(x, wg), f.linear(x, wu), f.linear(mid, wd)
        return f.linear(last, head)

    return Prefill(run, False, [model, x, mid, last, qkv], gemm_only=True)
