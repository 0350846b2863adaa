"""The end-to-end benchmark's decoder families and sizes: `Size` (the transformers config it makes, its
matmul parameters and a training step's FLOPs), the benchmark's size and the quick one of each family.

    family   transformers classes                     what the family adds to the step
    llama    LlamaConfig, LlamaForCausalLM            -
    qwen3    Qwen3Config, Qwen3ForCausalLM            q/k RMSNorms in attention, head_dim 128 (Qwen3-1.7B's widths)
    gemma3   Gemma3TextConfig, Gemma3ForCausalLM      scaled embeddings, four norms a layer, GeGLU (tanh), sliding-
                                                      window layers (5 of 6), a 262144-token vocabulary

Step FLOPs are model FLOPs: 6 x matmul parameters x tokens (the lm_head included, the embedding a lookup),
plus attention, 12 x (heads x head_dim) per query-key pair a layer scores (QK^T and PV, forward and
backward). Pairs are counted with the diagonal as half a pair, so a causal row of n tokens scores n^2 / 2
(the count the committed results use); on a sliding layer of window w a query past the window scores
w - 1/2, a row of n > w tokens w^2 / 2 + (n - w)(w - 1/2); packed documents score their own lengths'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """A decoder family: its name in labels, its transformers classes and Liger's patch function for it."""

    title: str
    config_class: str
    model_class: str
    liger_patch: str


FAMILIES: Mapping[str, Family] = {
    "llama": Family("Llama", "LlamaConfig", "LlamaForCausalLM", "apply_liger_kernel_to_llama"),
    "qwen3": Family("Qwen3", "Qwen3Config", "Qwen3ForCausalLM", "apply_liger_kernel_to_qwen3"),
    "gemma3": Family("Gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "apply_liger_kernel_to_gemma3_text"),
}


@dataclass(frozen=True)
class Size:
    """The decoder's sizes and the batch (the benchmark's config, or the --quick one).

    head_dim: None for hidden // heads. window: the sliding window of the sliding layers (None: none);
    full_every: every full_every-th layer attends to the whole row, the others slide (1: all full).
    tied: lm_head shares the embedding's weight. quick: a tiny size that checks the pipeline."""

    hidden: int = 2048
    intermediate: int = 5632
    layers: int = 8
    heads: int = 16
    kv_heads: int = 8
    vocab: int = 128256
    batch: int = 4
    seq: int = 2048
    long_seq: int = 16384
    prompt: int = 512
    decode: int = 256
    family: str = "llama"
    head_dim: int | None = None
    window: int | None = None
    full_every: int = 1
    tied: bool = False
    quick: bool = False

    @property
    def dim(self) -> int:
        """Features per attention head."""
        return self.head_dim or self.hidden // self.heads

    @property
    def label(self) -> str:
        extra = f" d{self.head_dim}" if self.head_dim and self.head_dim != self.hidden // self.heads else ""
        tail = " tied" if self.tied else ""
        if self.window is not None:
            tail += f" w{self.window} on {self.layer_types().count('sliding_attention')}/{self.layers} layers"
        return (f"HF {FAMILIES[self.family].title} h{self.hidden} i{self.intermediate} L{self.layers} "
                f"H{self.heads}/{self.kv_heads}{extra} V{self.vocab}{tail}")

    def layer_types(self) -> list[str]:
        """transformers' layer_types: "sliding_attention" or "full_attention" per layer."""
        return ["sliding_attention" if self.window is not None and (i + 1) % self.full_every else "full_attention"
                for i in range(self.layers)]

    def hf_config(self) -> Any:
        import transformers

        family = FAMILIES[self.family]
        common = dict(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                      num_hidden_layers=self.layers, num_attention_heads=self.heads,
                      num_key_value_heads=self.kv_heads, max_position_embeddings=max(self.long_seq, self.seq, 4096),
                      attn_implementation="sdpa")
        if self.family == "llama":
            return transformers.LlamaConfig(**common)
        common.update(head_dim=self.dim, tie_word_embeddings=self.tied)
        if self.family == "gemma3":
            common.update(query_pre_attn_scalar=self.dim, sliding_window=self.window or 4096,
                          layer_types=self.layer_types())
        return getattr(transformers, family.config_class)(**common)

    def matmul_params(self) -> int:
        d, q, kv = self.hidden, self.heads * self.dim, self.kv_heads * self.dim
        per_layer = 2 * d * q + 2 * d * kv + 3 * d * self.intermediate
        return self.layers * per_layer + self.vocab * d  # the lm_head; the embedding is a lookup

    def attention_pairs(self, rows: Sequence[Sequence[int]]) -> int:
        """Twice the query-key pairs every layer scores over `rows` (each a row's document lengths): n^2 per
        document of n tokens, w^2 + (n - w)(2w - 1) on a sliding layer of window w < n (module docstring)."""
        total = 0
        for kind in self.layer_types():
            w = self.window if kind == "sliding_attention" else None
            for row in rows:
                total += sum(n * n if w is None or n <= w else w * w + (n - w) * (2 * w - 1) for n in row)
        return total

    def step_flops(self, batch: int, seq: int, docs: Sequence[Sequence[int]] | None = None) -> int:
        """Forward + backward FLOPs of one step: 6 N per token, plus causal attention (module docstring);
        docs: each row's document lengths (packed rows), None for one document a row."""
        rows = docs if docs is not None else [[seq]] * batch
        return 6 * self.matmul_params() * batch * seq + 6 * self.heads * self.dim * self.attention_pairs(rows)


# Llama-3-8B's shape (random weights): 8.0B parameters, 128 GB of fp32 weights, gradients and AdamW state,
# so it trains only sharded (+fsdp2 over 2 or more 80 GB GPUs); 2 x 4096 tokens per GPU
LLAMA3_8B = Size(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, batch=2, seq=4096,
                 long_seq=8192)
QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, batch=2, seq=32, long_seq=64,
             prompt=8, decode=4, quick=True)

# the benchmark's size of each family: 8 layers of hidden 2048, 4 x 2048 tokens
SIZES: Mapping[str, Size] = {
    "llama": Size(),
    # Qwen3-1.7B's widths (intermediate 6144, 16 heads of 128, 8 KV heads, tied embeddings), 8 layers
    "qwen3": Size(family="qwen3", intermediate=6144, head_dim=128, vocab=151936, tied=True),
    # Gemma 3's layout at hidden 2048 (8 heads of 256, 4 KV heads, 4x GeGLU), Gemma 3 4B's window of 1024 on
    # 5 layers of 6 (here layers 0-4, 6, 7)
    "gemma3": Size(family="gemma3", intermediate=8192, heads=8, kv_heads=4, head_dim=256, vocab=262144, window=1024,
                   full_every=6, tied=True),
}
QUICK_SIZES: Mapping[str, Size] = {
    "llama": QUICK,
    "qwen3": dataclasses.replace(QUICK, family="qwen3", head_dim=32, tied=True),
    # a window of 16 in rows of 32: it binds on layer 0
    "gemma3": dataclasses.replace(QUICK, family="gemma3", head_dim=32, window=16, full_every=2, tied=True),
}


def size_of(family: str, *, quick: bool = False, shape: str = "e2e", batch: int | None = None,
            seq: int | None = None) -> Size:
    """The family's size: the benchmark's, the quick one, or (llama only) `shape` "llama3-8b"; `batch` and
    `seq` replace the size's batch shape."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; families: {', '.join(FAMILIES)}")
    if shape != "e2e" and (quick or family != "llama"):
        raise ValueError(f"--size {shape} is a Llama of its own: not with --quick or --family {family}")
    size = QUICK_SIZES[family] if quick else LLAMA3_8B if shape == "llama3-8b" else SIZES[family]
    return dataclasses.replace(size, batch=batch or size.batch, seq=seq or size.seq)
