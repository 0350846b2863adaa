"""RotaryEmbedding against transformers' rotary modules (every scheme, from config objects, dicts and
explicit arguments; dynamic NTK's growth and reset; partial rotary; interleaved), its table cache, and
the rotation end to end against transformers' apply_rotary_pos_emb."""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.tolerances import compare
from tests.ops.norm_helpers import assert_close

transformers = pytest.importorskip("transformers", reason="the comparisons need transformers (dev extras)")
from transformers import CohereConfig, GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

BASE = dict(hidden_size=256, num_attention_heads=4, max_position_embeddings=512)
SCHEMES = {
    "none": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


@pytest.mark.parametrize("name", SCHEMES)
def test_forward_matches_transformers(name: str) -> None:
    config = LlamaConfig(**BASE, rope_parameters={**SCHEMES[name], "rope_theta": 50000.0})
    hf, ours = LlamaRotaryEmbedding(config), kp.nn.RotaryEmbedding.from_config(config)
    explicit = kp.nn.RotaryEmbedding(64, theta=50000.0, max_position_embeddings=512, scaling=SCHEMES[name])
    from_dict = kp.nn.RotaryEmbedding(config=config.to_dict())
    x = torch.zeros(1, dtype=torch.bfloat16)
    # dynamic: past the context length (growth), longer still, then short again (reset)
    for length in (20, 700, 1100, 30):
        pos = torch.arange(length)[None] + torch.tensor([[0], [3]])
        want = hf(x, pos)
        for module in (ours, explicit, from_dict):
            got = module(x, pos)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (name, length)


def test_partial_rotary_and_interleaved_match_transformers() -> None:
    neox = GPTNeoXConfig(hidden_size=256, num_attention_heads=4, rotary_pct=0.25)
    cohere = CohereConfig(hidden_size=256, num_attention_heads=4, rope_parameters={"rope_type": "default"})
    pos = torch.arange(7)[None]
    x = torch.zeros(1, dtype=torch.float16)
    for hf, ours in ((GPTNeoXRotaryEmbedding(neox), kp.nn.RotaryEmbedding.from_config(neox)),
                     (CohereRotaryEmbedding(cohere), kp.nn.RotaryEmbedding.from_config(cohere, interleaved=True))):
        want, got = hf(x, pos), ours(x, pos)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert kp.nn.RotaryEmbedding.from_config(neox).rotary_dim == 16


def test_table_is_cached_per_device_and_dtype() -> None:
    rot = kp.nn.RotaryEmbedding(32, theta=1e4)
    cos, sin = rot.table(10)
    assert cos.shape == (10, 32) and cos.dtype == torch.float32
    again, _ = rot.table(6)
    assert again.data_ptr() == cos.data_ptr()
    half, _ = rot.table(6, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.data_ptr() != cos.data_ptr()
    longer, _ = rot.table(30)
    rows = rot(torch.zeros(1), torch.arange(30)[None])
    assert compare(longer, rows[0][0]).passed and compare(rot.table(30)[1], rows[1][0]).passed


def test_end_to_end_against_apply_rotary_pos_emb() -> None:
    """Our table + position ids through apply_rotary against transformers' module rows through its
    apply_rotary_pos_emb (fp32: the same numbers up to rounding)."""
    config = LlamaConfig(**BASE, rope_parameters={**SCHEMES["llama3"], "rope_theta": 50000.0})
    hf, ours = LlamaRotaryEmbedding(config), kp.nn.RotaryEmbedding.from_config(config)
    q, k = torch.randn(2, 4, 5, 64), torch.randn(2, 2, 5, 64)
    pos = torch.tensor([[0, 1, 2, 3, 4], [9, 10, 11, 40, 41]])
    cos, sin = hf(q, pos)
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = kp.functional.apply_rotary(q, k, *ours.table(64), position_ids=pos)
    assert_close(got[0], want[0], "q"), assert_close(got[1], want[1], "k")
