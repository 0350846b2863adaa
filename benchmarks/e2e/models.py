"""The end-to-end benchmark's models: building a provider's model (the sizes and families are
e2e/families.py's), the loss call, the device helpers."""

from __future__ import annotations

import gc
from typing import Any

import torch

from e2e.families import FAMILIES, LLAMA3_8B, QUICK, Size  # noqa: F401 (the sizes, as probes import them here)
from e2e.providers import Provider, optimized, parse


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free(dev: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def hf_model(size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The family's transformers *ForCausalLM of `size`, random weights from seed 0, in training mode."""
    import transformers

    torch.manual_seed(0)
    with torch.device(dev):
        model = getattr(transformers, FAMILIES[size.family].model_class)(size.hf_config())
    return model.to(dtype).train()


def apply_liger(family: str) -> None:
    """Liger-Kernel's patch of the family's transformers classes (every model built after is patched)."""
    from liger_kernel import transformers as liger

    name = FAMILIES[family].liger_patch
    patch = getattr(liger, name, None)
    if patch is None:
        raise RuntimeError(f"this liger_kernel has no {name}")
    patch()


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
    if provider.variant.shard == "tp" and base.startswith("liger"):
        raise ValueError("+tp: Liger's patched modules take no DTensors (it has no tensor-parallel path)")
    if base.startswith("liger"):
        apply_liger(size.family)
    if base == "builtin" and size.family != "llama":
        raise ValueError(f"builtin is the built-in Llama: not a {size.family} row")
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
    if provider.variant.shard == "tp":
        from e2e.distributed import tensor_parallel

        model = tensor_parallel(model, dev)
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


def loss_of(model: torch.nn.Module, batch: torch.Tensor | dict[str, torch.Tensor], **options: Any) -> torch.Tensor:
    """The model's loss on `batch`: token ids (labels = input_ids) or the inputs of e2e/batches.py's
    `training_batch`; `options` go to the call (`Variant.call_kwargs`)."""
    inputs = {"input_ids": batch, "labels": batch} if isinstance(batch, torch.Tensor) else batch
    out = model(**inputs, **options)
    return out if isinstance(out, torch.Tensor) else out.loss
