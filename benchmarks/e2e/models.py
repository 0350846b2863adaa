"""The end-to-end benchmark's models: the sizes, building a provider's model, the loss call, the device
helpers."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import torch

from e2e.providers import Provider, optimized, parse


@dataclass(frozen=True)
class Size:
    """The decoder's sizes and the batch (the benchmark's config, or the --quick one)."""

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

    @property
    def label(self) -> str:
        return (f"HF Llama h{self.hidden} i{self.intermediate} L{self.layers} H{self.heads}/{self.kv_heads} "
                f"V{self.vocab}")

    def hf_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=max(self.long_seq, 4096),
                           attn_implementation="sdpa")

    def matmul_params(self) -> int:
        d, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * self.intermediate
        return self.layers * per_layer + self.vocab * d  # the lm_head; the embedding is a lookup

    def step_flops(self, batch: int, seq: int) -> int:
        """Forward + backward FLOPs of one step: 6 N per token, plus causal attention (QK^T and PV, half)."""
        tokens = batch * seq
        attention = 6 * self.layers * batch * seq * seq * self.hidden  # 3 x (4 B T^2 d) / 2
        return 6 * self.matmul_params() * tokens + attention


# Llama-3-8B's shape (random weights): 8.0B parameters, 128 GB of fp32 weights, gradients and AdamW state,
# so it trains only sharded (+fsdp2 over 2 or more 80 GB GPUs); 2 x 4096 tokens per GPU
LLAMA3_8B = Size(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, batch=2, seq=4096,
                 long_seq=8192)
QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, batch=2, seq=32, long_seq=64,
             prompt=8, decode=4)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free(dev: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def hf_model(size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(size.hf_config())
    return model.to(dtype).train()


def builtin_model(size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=size.vocab, dim=size.hidden, n_layers=size.layers, n_heads=size.heads,
                         n_kv_heads=size.kv_heads, intermediate_size=size.intermediate,
                         max_seq_len=max(size.long_seq, size.seq), rope_theta=10000.0, norm_eps=1e-6)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(config)
        model.init_weights()
    return model.to(dtype).train()


def ours(model: torch.nn.Module, size: Size, dev: torch.device) -> torch.nn.Module:
    """optimize() validated on a short batch (the full one would double the activations)."""
    from kernel_pytorch.optimize import optimize

    ids = torch.randint(0, size.vocab, (1, min(size.seq, 128)), device=dev)
    model, report = optimize(model, {"input_ids": ids, "labels": ids}, compile=False, seeds=(0,))
    if not report.passed:
        raise RuntimeError(f"optimize() did not validate: {report.summary(validation=False)}")
    return model


def build(provider: Provider | str, size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A training provider's model (a string is `parse`d): built from seed 0, optimized for an 'ours' or the
    builtin base, set as its variant says, compiled as its base says."""
    provider = parse(provider) if isinstance(provider, str) else provider
    base = provider.base
    sharded = provider.variant.shard == "fsdp2"
    compute_dtype, dtype = dtype, (torch.float32 if sharded else dtype)  # FSDP2 keeps fp32 parameters
    if base.startswith("liger"):
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()  # patches transformers' Llama classes for every model built after
    if base == "builtin":
        model = ours(builtin_model(size, dev, dtype), size, dev)
    else:
        model = hf_model(size, dev, dtype)
    if base.startswith("ours"):
        model = ours(model, size, dev)
    if optimized(base):
        model = provider.variant.apply(model)
    if sharded:
        from e2e.distributed import shard
        from kernel_pytorch.optimize import INDUCTOR_OPTIONS

        compiles = base.endswith("compile") or base in ("builtin", "ours+compile-reuse")
        return shard(model, dev, compute_dtype, INDUCTOR_OPTIONS if base == "ours+compile" else None, compiles)
    if base.endswith("-cg"):
        model = torch.compile(model, mode="reduce-overhead")
    elif base == "ours+compile":  # compiled whole with the Inductor options optimize() recommends
        from kernel_pytorch.optimize import INDUCTOR_OPTIONS

        model = torch.compile(model, options=INDUCTOR_OPTIONS)
    elif base.endswith("compile") or base in ("builtin", "ours+compile-reuse"):
        model = torch.compile(model)
    return model


def make_optimizer(provider: Provider | str, model: torch.nn.Module, dev: torch.device) -> torch.optim.Optimizer:
    """The provider's AdamW (`Variant.make_optimizer`; a string is `parse`d)."""
    provider = parse(provider) if isinstance(provider, str) else provider
    return provider.variant.make_optimizer(model, dev)


def loss_of(model: torch.nn.Module, ids: torch.Tensor, **options: Any) -> torch.Tensor:
    """The model's loss on `ids` (labels = input_ids); `options` go to the call (`Variant.call_kwargs`)."""
    out = model(input_ids=ids, labels=ids, **options)
    return out if isinstance(out, torch.Tensor) else out.loss
