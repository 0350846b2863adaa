"""Embedding rules: torch.nn.Embedding -> `kernel_pytorch.nn.Embedding` (token and learned position
tables), and transformers' scaled word embeddings -> `kernel_pytorch.nn.ScaledEmbedding`.

Why swap a lookup that is already at copy speed: its backward. torch's CUDA backward adds rows with
atomics, in an order that may change between runs, and under torch.compile Inductor lowers it to an
fp32 (V, H) zero buffer, an index_put with accumulation and a cast, so a 128256 x 2048 bf16 table costs
a 1 GiB fp32 buffer plus the 0.5 GiB bf16 gradient at the end of every backward, when every other
gradient already exists. Ours (ops/embedding.py) is a registered op that sums each row in fp32 in a
fixed order and writes the gradient once in the table's dtype: bitwise reproducible, half the bytes
written, and Inductor keeps it as one op.

    torch_embedding:      torch.nn.Embedding (or a subclass keeping its forward)
    hf_scaled_embedding:  an Embedding subclass with an `embed_scale` whose forward is the lookup times
                          that scale (Gemma 1/2/3: a 0-d fp32 buffer cast to the table's dtype first;
                          BART-like: a float), recognised by a probe that must agree bit for bit

The replacement holds the module's own `weight` Parameter (and the same `embed_scale` buffer object,
non-persistent as transformers registers it), so `state_dict` keys, dtype, device, ties (a tied LM head
keeps sharing the table) and optimizer state are unchanged. Left alone, with the reason: other
subclasses with a forward of their own (OPT's offset table), `max_norm` (renormalises rows in place
during the lookup) and sparse gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kernel_pytorch import nn as kp_nn
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import DropInRule, blocked, build_on_meta, run_probe


def _left_alone(module: nn.Embedding) -> str | None:
    """Why an Embedding must stay torch's whatever its forward computes, or None."""
    if module.max_norm is not None:
        return "max_norm renormalises weight rows in place during the lookup"
    if module.sparse:
        return "sparse gradients (the replacement's gradient is dense)"
    if not module.weight.is_floating_point():
        return f"weight is {module.weight.dtype}, not floating point"
    return blocked(module)


def _table_options(module: nn.Embedding) -> dict:
    return {"padding_idx": module.padding_idx, "scale_grad_by_freq": module.scale_grad_by_freq, "device": "meta"}


class TorchEmbeddingRule(DropInRule):
    """torch.nn.Embedding (or a subclass keeping its forward) -> kernel_pytorch.nn.Embedding."""

    name = "torch_embedding"
    family = "embedding"
    base, ours = nn.Embedding, kp_nn.Embedding

    def left_alone(self, module: nn.Module) -> str | None:
        return _left_alone(module)

    def build(self, module: nn.Module) -> nn.Module:
        return kp_nn.Embedding(module.num_embeddings, module.embedding_dim, **_table_options(module))

    def describe(self, kind: str) -> str:
        return f"{kind} -> kernel_pytorch.nn.Embedding (deterministic backward in the table's dtype)"


def _scale(module: nn.Module) -> float | Tensor | None:
    """The module's `embed_scale` when it is a number or a 0-d floating tensor, else None."""
    scale = getattr(module, "embed_scale", None)
    if isinstance(scale, Tensor):
        return scale if scale.dim() == 0 and scale.is_floating_point() and not scale.is_meta else None
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return float(scale)
    return None


def _probe_ids(module: nn.Embedding) -> Tensor:
    """(2, 5) indices over the whole table (the padding row included when there is one), from a private
    generator so the caller's RNG stream is untouched."""
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, module.num_embeddings, (2, 5), generator=g)
    if module.padding_idx is not None:
        ids[0, 0] = module.padding_idx % module.num_embeddings
    return ids.to(module.weight.device)


class HFScaledEmbeddingRule:
    """An Embedding subclass computing lookup * embed_scale (Gemma's scaled word embedding, any class:
    recognised by a probe) -> kernel_pytorch.nn.ScaledEmbedding with the same scale object."""

    name = "hf_scaled_embedding"
    family = "embedding"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if not isinstance(module, nn.Embedding) or isinstance(module, kp_nn.Embedding):
            return None
        scale = _scale(module)
        if type(module).forward is nn.Embedding.forward or scale is None:
            return None  # not a scaled embedding: torch_embedding decides
        kind = type(module).__name__
        if (why := _left_alone(module)) is not None:
            return Match(None, why)
        new = build_on_meta(
            lambda: kp_nn.ScaledEmbedding(module.num_embeddings, module.embedding_dim, embed_scale=scale,
                                          **_table_options(module)),
            module,
            ("weight",),
        )
        # plain attributes the original carries beside torch's (transformers' `scalar_embed_scale`, read by
        # its weight initialisation)
        for attr, value in vars(module).items():
            if not attr.startswith("_") and attr not in vars(new) and isinstance(value, (bool, int, float, str)):
                setattr(new, attr, value)
        old_keys, new_keys = list(module.state_dict(keep_vars=True)), list(new.state_dict(keep_vars=True))
        if old_keys != new_keys:
            return Match(None, f"{kind}'s state_dict keys {old_keys} would become {new_keys}")
        ids = _probe_ids(module)
        expected, ours = run_probe(module, ids), run_probe(new, ids)
        if not (isinstance(expected, Tensor) and isinstance(ours, Tensor) and expected.dtype == ours.dtype
                and torch.equal(expected, ours)):
            return Match(None, f"{kind} has an embed_scale but does not compute lookup * embed_scale on a probe")
        form = f"{scale.dtype} buffer cast to the table's dtype" if isinstance(scale, Tensor) else "float"
        return Match(new, f"{kind} (lookup * embed_scale, a {form}) -> kernel_pytorch.nn.ScaledEmbedding "
                          "(deterministic backward in the table's dtype)")


EMBEDDING_RULES = (HFScaledEmbeddingRule(), TorchEmbeddingRule())

__all__ = ["EMBEDDING_RULES", "HFScaledEmbeddingRule", "TorchEmbeddingRule"]
