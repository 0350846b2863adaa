"""Embedding rule: torch.nn.Embedding -> `kernel_pytorch.nn.Embedding` (token and learned position tables).

Why swap a lookup that is already at copy speed: its backward. torch's CUDA backward adds rows with
atomics, in an order that may change between runs, and under torch.compile Inductor lowers it to an
fp32 (V, H) zero buffer, an index_put with accumulation and a cast, so a 128256 x 2048 bf16 table costs
a 1 GiB fp32 buffer plus the 0.5 GiB bf16 gradient at the end of every backward, when every other
gradient already exists. Ours (ops/embedding.py) is a registered op that sums each row in fp32 in a
fixed order and writes the gradient once in the table's dtype: bitwise reproducible, half the bytes
written, and Inductor keeps it as one op.

The replacement holds the module's own `weight` Parameter, so `state_dict` keys, dtype, device, ties (a
tied LM head keeps sharing the table) and optimizer state are unchanged. Left alone: subclasses with a
forward of their own (Gemma's scaled embedding, OPT's offset table), `max_norm` (renormalises rows in
place during the lookup) and sparse gradients.
"""

from __future__ import annotations

from torch import nn

from kernel_pytorch import nn as kp_nn
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import blocked, build_on_meta


class TorchEmbeddingRule:
    """torch.nn.Embedding (or a subclass keeping its forward) -> kernel_pytorch.nn.Embedding."""

    name = "torch_embedding"
    family = "embedding"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if not isinstance(module, nn.Embedding) or isinstance(module, kp_nn.Embedding):
            return None
        kind = type(module).__name__
        if type(module).forward is not nn.Embedding.forward:
            return Match(None, f"{kind} overrides torch.nn.Embedding.forward")
        if module.max_norm is not None:
            return Match(None, "max_norm renormalises weight rows in place during the lookup")
        if module.sparse:
            return Match(None, "sparse gradients (the replacement's gradient is dense)")
        if not module.weight.is_floating_point():
            return Match(None, f"weight is {module.weight.dtype}, not floating point")
        if (why := blocked(module)) is not None:
            return Match(None, why)
        new = build_on_meta(
            lambda: kp_nn.Embedding(module.num_embeddings, module.embedding_dim, padding_idx=module.padding_idx,
                                    scale_grad_by_freq=module.scale_grad_by_freq, device="meta"),
            module,
            ("weight",),
        )
        return Match(new, f"{kind} -> kernel_pytorch.nn.Embedding (deterministic backward in the table's dtype)")


EMBEDDING_RULES = (TorchEmbeddingRule(),)

__all__ = ["EMBEDDING_RULES", "TorchEmbeddingRule"]
