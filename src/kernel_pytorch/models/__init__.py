"""Built-in reference models: the analyser's default demo and the test bed for optimisations.

Each model is plain torch with a frozen-dataclass config and named presets. The registry maps a preset
name to a `ModelSpec`; `build_model(name)` returns `(model, example_inputs)` ready to call as
`model(*example_inputs)`, and `input_spec(name)` says which input dims are batch, sequence or spatial.

    >>> model, (input_ids,) = build_model("llama-tiny")
    >>> model(input_ids).shape                          # (B, T, V)
    torch.Size([2, 32, 512])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch
from torch import Tensor, nn

from kernel_pytorch.models._common import materialize
from kernel_pytorch.models.gpt2 import GPT2Config, GPT2LMHeadModel
from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM
from kernel_pytorch.models.resnet import BasicBlock, Bottleneck, ResNet, ResNetConfig
from kernel_pytorch.models.vit import VisionTransformer, ViTConfig

ModelConfig = LlamaConfig | GPT2Config | ViTConfig | ResNetConfig
DimKind = Literal["batch", "seq", "spatial"]
Task = Literal["causal-lm", "image-classification"]


def _task(config: ModelConfig) -> Task:
    """ "causal-lm" for the decoder configs (input: token ids), else "image-classification" (images)."""
    return "causal-lm" if isinstance(config, (LlamaConfig, GPT2Config)) else "image-classification"


@dataclass(frozen=True)
class ModelSpec:
    """One registry entry.

    Attributes:
        name: registry key, e.g. "llama-tiny".
        config: the preset's config.
        batch_size: default example batch B.
        seq_len: default tokens per sequence T for language models; None for image models, whose
            example images are config.image_size square.
        description: one line for listings.
    """

    name: str
    config: ModelConfig
    batch_size: int
    seq_len: int | None
    description: str

    @property
    def task(self) -> Task:
        """ "causal-lm" (input: token ids (B, T)) or "image-classification" (input: images (B, C, H, W))."""
        return _task(self.config)


MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            ModelSpec(
                "llama-tiny", LlamaConfig.tiny(), 2, 32, "Llama-style decoder, 2 layers, dim 64 (CPU demo)"
            ),
            ModelSpec(
                "llama-8l-2048",
                LlamaConfig.llama_8layer_2048(),
                4,
                2048,
                "Llama-3-style decoder, 8 layers, dim 2048, vocab 128256 (~1.03B params, GPU)",
            ),
            ModelSpec("llama3-8b", LlamaConfig.llama3_8b(), 1, 2048, "Llama-3-8B sizes (~8.03B params, GPU)"),
            ModelSpec("gpt2-tiny", GPT2Config.tiny(), 2, 32, "GPT-2-style decoder, 2 layers, dim 64 (CPU demo)"),
            ModelSpec("gpt2-small", GPT2Config.gpt2_small(), 8, 1024, "GPT-2 small (124M params)"),
            ModelSpec("vit-tiny", ViTConfig.tiny(), 2, None, "ViT, 2 layers, dim 64, 32x32 images (CPU demo)"),
            ModelSpec("vit-b16", ViTConfig.vit_b16(), 32, None, "ViT-B/16, 224x224 images (86.6M params)"),
            ModelSpec("resnet-tiny", ResNetConfig.tiny(), 2, None, "ResNet, 4 basic blocks, width 8 (CPU demo)"),
            ModelSpec("resnet18", ResNetConfig.resnet18(), 32, None, "ResNet-18, 224x224 images (11.7M params)"),
            ModelSpec("resnet50", ResNetConfig.resnet50(), 32, None, "ResNet-50, 224x224 images (25.6M params)"),
        )
    }
)

DEFAULT_DEMO = "llama-tiny"


def list_models() -> list[str]:
    """Registry names, in registry order (tiny presets before their full-size siblings)."""
    return list(MODELS)


def get_spec(name: str) -> ModelSpec:
    """The registry entry for `name`; raises KeyError naming the valid choices."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None


def _module_for(config: ModelConfig) -> nn.Module:
    if isinstance(config, LlamaConfig):
        return LlamaForCausalLM(config)
    if isinstance(config, GPT2Config):
        return GPT2LMHeadModel(config)
    if isinstance(config, ViTConfig):
        return VisionTransformer(config)
    if isinstance(config, ResNetConfig):
        return ResNet(config)
    raise TypeError(f"no model for config type {type(config).__name__}")


def input_spec(name: str) -> tuple[dict[int, DimKind], ...]:
    """For each positional input of `name`'s forward, which dims may vary and what they mean.

    Returns a fresh tuple of dicts {dim index: "batch" | "seq" | "spatial"}; dims not listed are fixed
    by the config (ViT's image side is fixed by its learned position embeddings; channels always are).
    Example: llama-tiny -> ({0: "batch", 1: "seq"},).
    """
    spec = get_spec(name)
    if spec.task == "causal-lm":
        return ({0: "batch", 1: "seq"},)
    if isinstance(spec.config, ViTConfig):
        return ({0: "batch"},)
    return ({0: "batch", 2: "spatial", 3: "spatial"},)


def example_inputs(
    name: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    batch_size: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    *,
    image_size: int | None = None,
    config: ModelConfig | None = None,
) -> tuple[Tensor, ...]:
    """Random example inputs for `name` (positional arguments of its forward), deterministic by seed.

    Args:
        name: registry name.
        device: where the inputs go; they are drawn on the CPU first so every device gets the same values.
        dtype: dtype of images (token ids are always int64).
        batch_size: B; default the preset's.
        seq_len: T for language models (default the preset's); must be None for image models.
        seed: seeds a private generator; the global RNG is untouched.
        image_size: H = W for image models (default config.image_size; ViT accepts only that).
        config: overrides the preset's config (e.g. `dataclasses.replace(spec.config, vocab_size=...)`).
    Returns:
        Language models: (input_ids (B, T) int64 in [0, vocab_size),).
        Image models: (images (B, in_channels, H, W) in `dtype`, standard normal,).
    """
    spec = get_spec(name)
    config = spec.config if config is None else config
    b = spec.batch_size if batch_size is None else batch_size
    generator = torch.Generator().manual_seed(seed)
    shape: tuple[int, ...]
    if _task(config) == "causal-lm":
        if image_size is not None:
            raise ValueError(f"{name} takes token ids; image_size does not apply")
        t = spec.seq_len if seq_len is None else seq_len
        assert t is not None  # every language-model spec has a default seq_len
        if isinstance(config, GPT2Config) and t > config.max_seq_len:
            raise ValueError(f"seq_len {t} > max_seq_len {config.max_seq_len} of {name}'s position table")
        shape, out_dtype = (b, t), torch.long
        draw = lambda: torch.randint(0, config.vocab_size, shape, generator=generator)
    else:
        if seq_len is not None:
            raise ValueError(f"{name} takes images; pass image_size instead of seq_len")
        side = config.image_size if image_size is None else image_size
        if isinstance(config, ViTConfig) and side != config.image_size:
            raise ValueError(f"{name} has position embeddings for {config.image_size}x{config.image_size} only")
        shape, out_dtype = (b, config.in_channels, side, side), dtype
        draw = lambda: torch.randn(shape, generator=generator)
    if torch.device(device).type == "meta":  # shapes only: nothing drawn, nothing allocated
        return (torch.empty(shape, dtype=out_dtype, device="meta"),)
    return (draw().to(device=device, dtype=out_dtype),)


def build_model(
    name: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    seed: int = 0,
    train: bool = False,
    config: ModelConfig | None = None,
    **sizes: int | None,
) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Build a registry model and example inputs for it.

    The model is built on the meta device and allocated once on `device` in `dtype`, so large presets
    never pass through host memory in fp32; `device="meta"` gives a shapes-only model (parameter
    counting, no allocation) with meta inputs.

    Args:
        name: registry name (see `list_models()`).
        device, dtype: of the parameters (and of image inputs).
        seed: weights and inputs are deterministic by seed (weights per device type: CUDA and CPU
            generators draw different streams).
        train: the module's mode. Default False, eval mode: BatchNorm uses its running statistics and
            repeated calls have no side effects. Gradients flow either way.
        config: overrides the preset's config, e.g. `dataclasses.replace(MODELS[name].config, n_layers=4)`.
        sizes: the example inputs' `batch_size`, `seq_len` or `image_size`, as `example_inputs` takes them.
    Returns:
        (model, inputs) with `model(*inputs)` -> logits: (B, T, vocab_size) for language models,
        (B, num_classes) for image models.
    """
    spec = get_spec(name)
    config = spec.config if config is None else config
    if not isinstance(config, type(spec.config)):
        raise TypeError(f"{name} needs a {type(spec.config).__name__}, got {type(config).__name__}")
    # inputs first: sizes the model cannot take fail before a large preset is allocated
    inputs = example_inputs(name, device, dtype, seed=seed, config=config, **sizes)
    model = materialize(lambda: _module_for(config), device, dtype, seed)
    model.train(train)
    return model, inputs


__all__ = [
    "DEFAULT_DEMO",
    "MODELS",
    "BasicBlock",
    "Bottleneck",
    "DimKind",
    "GPT2Config",
    "GPT2LMHeadModel",
    "LlamaConfig",
    "LlamaForCausalLM",
    "ModelConfig",
    "ModelSpec",
    "ResNet",
    "ResNetConfig",
    "ViTConfig",
    "VisionTransformer",
    "build_model",
    "example_inputs",
    "get_spec",
    "input_spec",
    "list_models",
]
