"""The families corpus: one tiny random-config Hugging Face model of every family users train, each with
an ordinary training batch as a user's data loader makes it (one row right-padded, its attention mask 0
and its labels -100 there). Each factory returns `(model, batch)`, so `kernel-pytorch analyze
tests/optimize/corpus.py:NAME` takes it as it is.

Models come from `tests/optimize/models.py` where it has the family; the batch is this module's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tests.optimize import models

VOCAB = models.VOCAB
PAD = 2  # padding positions of the left-padded generation prompt's last row


def left_padded_prompt(batch: int = 2, seq: int = 5) -> dict[str, Tensor]:
    """A generation batch: the last row left-padded (pad id 0) with its attention mask 0 there."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, :PAD] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


def _lm(family: str) -> Any:
    def make() -> tuple[nn.Module, dict[str, Tensor]]:
        torch.manual_seed(0)
        model, _ = getattr(models, family)()
        return model, models.padded_lm_inputs()

    make.__name__ = family
    return make


def opt() -> tuple[nn.Module, dict[str, Tensor]]:
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=1, bos_token_id=2,
                       eos_token_id=2)
    return OPTForCausalLM(config).eval(), models.padded_lm_inputs()


def bert() -> tuple[nn.Module, dict[str, Tensor]]:
    """A masked LM: labels -100 except at the masked tokens, as a collator makes them."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=64)
    batch = models.padded_lm_inputs()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1:6:2] = batch["input_ids"][:, 1:6:2]
    return BertForMaskedLM(config).eval(), {**batch, "labels": labels}


def vit() -> tuple[nn.Module, dict[str, Tensor]]:
    """An image classifier: labels are class ids."""
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_labels=5)
    g = torch.Generator().manual_seed(0)
    batch = {"pixel_values": torch.randn(2, 3, 16, 16, generator=g), "labels": torch.tensor([3, 0])}
    return ViTForImageClassification(config).eval(), batch


CAUSAL = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox", "falcon",
          "stablelm", "mixtral", "qwen2_moe", "qwen3_moe")
for _family in CAUSAL:
    globals()[_family] = _lm(_family)


def t5() -> tuple[nn.Module, dict[str, Tensor]]:
    """Encoder-decoder: the labels are the decoder's targets (the model shifts them right itself)."""
    torch.manual_seed(0)
    model, _ = models.t5()
    return model, models.padded_lm_inputs()


FAMILIES = (*CAUSAL, "opt", "t5", "bert", "vit")
GENERATES = (*CAUSAL, "opt", "t5")  # greedy generate() is compared on these


def build(family: str) -> tuple[nn.Module, dict[str, Tensor]]:
    """The family's (model, batch)."""
    return globals()[family]()
