"""What the multi-process optimize and checkpoint tests share: two tiny decoders (transformers' Llama from
a random config, no download; kernel_pytorch.models' Llama), their batches and loss, the sharding recipe
(torchtitan's: activation checkpointing, then compile, then `fully_shard` on each decoder layer and the
root) and a training loop. Imported inside the spawned ranks, so every import of torch.distributed is
inside a function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

VOCAB = 128
SEQ = 16
HF_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def hf_llama(seed: int = 0) -> nn.Module:
    """transformers' LlamaForCausalLM, 2 layers of width 64, in training mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**HF_LLAMA)).train()


def kp_llama(seed: int = 0) -> nn.Module:
    """kernel_pytorch.models' Llama (the tiny preset: 2 layers of width 64), in training mode."""
    from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB)).train()


MODELS: dict[str, Callable[[int], nn.Module]] = {"hf": hf_llama, "kp": kp_llama}


def is_hf(model: nn.Module) -> bool:
    return hasattr(model, "base_model_prefix")


def ids(rank: int, step: int, device: torch.device | str = "cpu", batch: int = 2) -> Tensor:
    """(batch, SEQ) token ids, different on every rank and step."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, VOCAB, (batch, SEQ), generator=g).to(device)


def example(model: nn.Module, device: torch.device | str = "cpu") -> Any:
    """The example inputs optimize() validates on (as `loss` calls the model)."""
    x = ids(0, -1, device)
    return {"input_ids": x, "labels": x} if is_hf(model) else (x, x)


def loss(model: nn.Module, x: Tensor) -> Tensor:
    """The next-token loss of `model` (or of DDP's wrapper around it) on ids `x` (0-d fp32)."""
    if is_hf(getattr(model, "module", model)):
        return model(input_ids=x, labels=x).loss
    return model(x, x)


def layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers (both models keep transformers' names)."""
    return model.model.layers


def shard(model: nn.Module, mesh: Any, *, param_dtype: torch.dtype = torch.float32, checkpoint: bool = False,
          compile_backend: Any = None) -> nn.Module:
    """torchtitan's recipe on `model`: each decoder layer wrapped for activation checkpointing (`checkpoint`),
    compiled in place with fullgraph=True (`compile_backend`), then `fully_shard` on each layer and on the
    root, with MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = layers(model)
    for i, block in enumerate(blocks):
        if checkpoint:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            block = blocks[i] = checkpoint_wrapper(block)
        if compile_backend is not None:
            block.compile(backend=compile_backend, fullgraph=True)  # a graph break fails, as in torchtitan
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    return fully_shard(model, mesh=mesh, mp_policy=mp)


def train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: int, *, first: int = 0,
          device: torch.device | str = "cpu") -> list[float]:
    """`steps` optimizer steps on the rank's batches; the losses."""
    losses = []
    for step in range(first, first + steps):
        value = loss(model, ids(rank, step, device))
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(value.item())
    return losses


def adam_kernel_on_cpu(device: torch.device, launches: list[bool] | None = None) -> None:
    """On CPU, kernel_pytorch.optim.AdamW's kernel runs in Triton's interpreter (as tests/optim/test_adam.py
    runs it) instead of torch's step; each launch appends to `launches` whether all its tensors were plain.
    For a rank's process (tests/distributed.py's setup_rank): it replaces module attributes for good."""
    if device.type != "cpu":
        return
    from kernel_pytorch._env import is_plain_tensor
    from kernel_pytorch.ops import adam as K
    from kernel_pytorch.optim import adam as optim_adam

    optim_adam.kernel_ready = lambda device: (True, "interpreter")
    launch = K.adam_step

    def counted(params, *args, **kwargs):
        if launches is not None:
            launches.append(all(is_plain_tensor(t) for t in params))
        launch(params, *args, **kwargs)

    K.adam_step = counted


def full(t: Tensor) -> Tensor:
    """A DTensor's full tensor (a plain tensor as it is)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


__all__ = ["HF_LLAMA", "MODELS", "SEQ", "VOCAB", "adam_kernel_on_cpu", "example", "full", "hf_llama", "ids", "is_hf",
           "kp_llama", "layers", "loss", "shard", "train"]
