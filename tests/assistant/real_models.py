"""The analyser's real-models corpus: the models people compile, built tiny and random (no downloads).

Each factory returns `(model, example_inputs)` like a `FILE.py:FACTORY` of the CLI: Hugging Face
transformers models from random configs (2 layers, hidden 32), torchvision and timm vision models,
recurrent models, and the small repros of analyser defects reported against #18. Factories import
their optional library inside, so this module imports with torch alone; `LIBRARY[name]` says which
library a factory needs, for the tests to skip with a reason.

Every repro line the tests check carries a `# CORPUS:<name>` marker, found by `marker_line`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Factory = Callable[[], tuple[nn.Module, Any]]

# where the corpus runs: the CPU by default, the GPU for the device log (KP_CORPUS_DEVICE=cuda)
DEVICE = os.environ.get("KP_CORPUS_DEVICE", "cpu")

VOCAB = 128
BATCH, SEQ = 2, 16


def _tokens(batch: int = BATCH, seq: int = SEQ) -> Tensor:
    return torch.randint(3, VOCAB, (batch, seq), device=DEVICE)


def _lm_inputs() -> dict[str, Tensor]:
    """A causal LM's training call: ids, mask and labels share batch and sequence dims."""
    ids = _tokens()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _eval(model: nn.Module) -> nn.Module:
    return model.to(DEVICE).eval()


# ---------------------------------------------------------------------------------------------------
# Hugging Face transformers (random configs)
# ---------------------------------------------------------------------------------------------------

# one layer keeps Dynamo's tracing (most of the corpus's time) short; Llama keeps two for the
# repeated-block (regional compilation) advice
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def llama() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    return _eval(LlamaForCausalLM(LlamaConfig(**{**_DECODER, "num_hidden_layers": 2}))), _lm_inputs()


def mistral() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import MistralConfig, MistralForCausalLM

    return _eval(MistralForCausalLM(MistralConfig(**_DECODER, sliding_window=32))), _lm_inputs()


def qwen2() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _eval(Qwen2ForCausalLM(Qwen2Config(**_DECODER))), _lm_inputs()


def gemma() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import GemmaConfig, GemmaForCausalLM

    return _eval(GemmaForCausalLM(GemmaConfig(**{**_DECODER, "num_key_value_heads": 1}, head_dim=8))), _lm_inputs()


def gpt2() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    # no labels: GPT-2's loss_function logs a warning (loss_type unset), a graph break whose extra frames
    # multiply the sweep's compiles; that case is a repro of its own in #18's defect list
    ids = _tokens()
    return _eval(GPT2LMHeadModel(config)), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def bert() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    ids = _tokens()
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return _eval(BertModel(config, add_pooling_layer=False)), inputs


def t5() -> tuple[nn.Module, dict[str, Tensor]]:
    """Encoder-decoder: the encoder and decoder sequences differ (16 and 8)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    ids = _tokens()
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "decoder_input_ids": _tokens(seq=8)}
    return _eval(T5ForConditionalGeneration(config)), inputs


def whisper() -> tuple[nn.Module, dict[str, Tensor]]:
    """Whisper-tiny-like: (B, mel bins, frames) features, frames fixed at 2 x max_source_positions."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        encoder_layers=1,
        decoder_layers=1,
        d_model=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    inputs = {
        "input_features": torch.randn(BATCH, 16, 32, device=DEVICE),
        "decoder_input_ids": _tokens(seq=8),
    }
    return _eval(WhisperForConditionalGeneration(config)), inputs


# ---------------------------------------------------------------------------------------------------
# torchvision and timm
# ---------------------------------------------------------------------------------------------------


def _images(size: int = 32) -> tuple[Tensor]:
    return (torch.randn(BATCH, 3, size, size, device=DEVICE),)


def resnet18() -> tuple[nn.Module, tuple[Tensor]]:
    from torchvision.models import resnet18 as build

    return _eval(build(weights=None, num_classes=10)), _images()


def mobilenet_v3() -> tuple[nn.Module, tuple[Tensor]]:
    """Depthwise convolutions (groups == channels) and hard-swish/SE blocks."""
    from torchvision.models import mobilenet_v3_small

    return _eval(mobilenet_v3_small(weights=None, num_classes=10)), _images()


def vit_timm() -> tuple[nn.Module, tuple[Tensor]]:
    import timm

    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=10,
    )
    return _eval(model), _images()


# ---------------------------------------------------------------------------------------------------
# Recurrent models
# ---------------------------------------------------------------------------------------------------


class LSTMTagger(nn.Module):
    """Token ids -> embedding -> LSTM (batch_first) -> per-token logits."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=1, batch_first=True)
        self.head = nn.Linear(dim, 8)

    def forward(self, ids: Tensor) -> Tensor:  # ids: (B, T)
        h, _ = self.rnn(self.embed(ids))  # CORPUS:lstm
        return self.head(h)


class GRUEncoder(nn.Module):
    """(T, B, F) features -> GRU (batch_first=False, torch's default) -> last hidden state."""

    def __init__(self, features: int = 8, dim: int = 16) -> None:
        super().__init__()
        self.rnn = nn.GRU(features, dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, x: Tensor) -> Tensor:  # x: (T, B, F)
        _, h = self.rnn(x)  # CORPUS:gru
        return self.head(h[-1])


def lstm() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(LSTMTagger()), (_tokens(),)


def gru() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(GRUEncoder()), (torch.randn(SEQ, BATCH, 8, device=DEVICE),)


# ---------------------------------------------------------------------------------------------------
# Repros from #18
# ---------------------------------------------------------------------------------------------------


class Conv3dGroupNorm(nn.Module):
    """Video-like (B, C, T, H, W) input through Conv3d and GroupNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(4, 8)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.conv(x)).mean(dim=(2, 3, 4))  # CORPUS:conv3d


def conv3d_groupnorm() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(Conv3dGroupNorm()), (torch.randn(BATCH, 3, 4, 8, 8, device=DEVICE),)


class CrossEntropyHead(nn.Module):
    """Logits and targets share the batch dim: (B, C) features, (B,) class ids."""

    def __init__(self, dim: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, classes)

    def forward(self, x: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(self.proj(x), targets)  # CORPUS:cross-entropy


def cross_entropy() -> tuple[nn.Module, tuple[Tensor, Tensor]]:
    x = torch.randn(BATCH, 16, device=DEVICE)
    return _eval(CrossEntropyHead()), (x, torch.randint(0, 10, (BATCH,), device=DEVICE))


class QKVAttention(nn.Module):
    """Q, K and V share batch and sequence dims: (B, H, T, D) each."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.out = nn.Linear(dim, dim)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.out(F.scaled_dot_product_attention(q, k, v))  # CORPUS:attention


def qkv_attention() -> tuple[nn.Module, tuple[Tensor, Tensor, Tensor]]:
    q, k, v = (torch.randn(BATCH, 2, SEQ, 8, device=DEVICE) for _ in range(3))
    return _eval(QKVAttention()), (q, k, v)


class WrongShapeLinear(nn.Module):
    """Fed (B, 8) where the Linear expects (B, 16): raises in eager mode inside torch."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)  # CORPUS:wrong-shape


def wrong_shape() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(WrongShapeLinear()), (torch.randn(BATCH, 8, device=DEVICE),)


def wrong_shape_torch() -> tuple[nn.Module, tuple[Tensor]]:
    """torch's own nn.Linear, no user forward: the error arises in torch alone."""
    return _eval(nn.Linear(16, 16)), (torch.randn(BATCH, 8, device=DEVICE),)  # CORPUS:wrong-shape-torch


class ParamFree(nn.Module):
    """No parameters at all (a loss or a post-processing step)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x).sum(-1)


def param_free() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(ParamFree()), (torch.randn(BATCH, 16, device=DEVICE),)


def _returns_dict(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Like transformers' `can_return_tuple`: a (self, *args, **kwargs) wrapper around forward, so
    Dynamo's frame sees the inputs as `kwargs['x']`."""

    @functools.wraps(fn)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        return {"out": fn(self, *args, **kwargs)}

    return wrapper


class KwargsWrapped(nn.Module):
    """Keyword inputs through a decorator: a tensor, and a Python float baked into the graph."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    @_returns_dict
    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        # x may come in another dtype (the bf16 extra input): cast at the boundary, a dtype guard remains
        return self.proj(x.to(self.proj.weight.dtype)) * scale  # CORPUS:kwargs


def kwargs_wrapped() -> tuple[nn.Module, dict[str, Any]]:
    return _eval(KwargsWrapped()), {"x": torch.randn(BATCH, 16, device=DEVICE), "scale": 0.5}


class NestedBatch(nn.Module):
    """One dict argument holding the tensors (a collated batch, an HF BatchEncoding)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return (self.proj(batch["x"]) * batch["mask"]).sum(-1)  # CORPUS:nested


def nested_batch() -> tuple[nn.Module, tuple[dict[str, Tensor]]]:
    x = torch.randn(BATCH, SEQ, 16, device=DEVICE)
    return _eval(NestedBatch()), ({"x": x, "mask": torch.ones(BATCH, SEQ, 1, device=DEVICE)},)


class BasicBlock(nn.Module):
    """A ResNet basic block: two identical 3x3 convolutions, siblings (not a repeated block)."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


class SiblingConvs(nn.Module):
    """ResNet-like: a stem and a stage of two different blocks; the largest identical siblings are the
    two convolutions inside `stage.1` (a path with a digit, not an attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.stage = nn.Sequential(nn.Identity(), BasicBlock())
        self.head = nn.Linear(32, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.stage(self.stem(x)).mean(dim=(2, 3)))


def sibling_convs() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(SiblingConvs()), _images(8)


class TwoNorms(nn.Module):
    """A block whose only identical children are two LayerNorms, a tiny share of the parameters,
    held by the root module itself (there is no container to iterate)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = nn.Linear(dim, 4 * dim)
        self.norm2 = nn.LayerNorm(dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm2(x + self.out(torch.relu(self.mlp(self.norm1(x)))))


def two_norms() -> tuple[nn.Module, tuple[Tensor]]:
    return _eval(TwoNorms()), (torch.randn(BATCH, SEQ, 64, device=DEVICE),)


# ---------------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------------

FACTORIES: dict[str, Factory] = {
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "gemma": gemma,
    "gpt2": gpt2,
    "bert": bert,
    "t5": t5,
    "whisper": whisper,
    "resnet18": resnet18,
    "mobilenet_v3": mobilenet_v3,
    "vit_timm": vit_timm,
    "lstm": lstm,
    "gru": gru,
    "conv3d_groupnorm": conv3d_groupnorm,
    "cross_entropy": cross_entropy,
    "qkv_attention": qkv_attention,
    "wrong_shape": wrong_shape,
    "wrong_shape_torch": wrong_shape_torch,
    "param_free": param_free,
    "kwargs_wrapped": kwargs_wrapped,
    "nested_batch": nested_batch,
    "sibling_convs": sibling_convs,
    "two_norms": two_norms,
}

# the optional library each factory needs (absent: torch alone)
LIBRARY: dict[str, str] = {
    **{name: "transformers" for name in ("llama", "mistral", "qwen2", "gemma", "gpt2", "bert", "t5", "whisper")},
    "resnet18": "torchvision",
    "mobilenet_v3": "torchvision",
    "vit_timm": "timm",
}

HF_CAUSAL_LM = ("llama", "mistral", "qwen2", "gemma", "gpt2")


def marker_line(name: str) -> int:
    """The line of this file carrying `# CORPUS:<name>`."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# CORPUS:{name}"))
