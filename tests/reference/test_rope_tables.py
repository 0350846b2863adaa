"""The rotary tables against transformers: every scaling scheme's inverse frequencies and attention
scaling (ROPE_INIT_FUNCTIONS), from new-form and old-form configs, the rotary module's cos/sin, and
dynamic NTK's growth and reset past the original length."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.reference.rope_tables import (
    RotaryConfig,
    cos_sin,
    cos_sin_table,
    dynamic_cached_len,
    inv_freq_and_scaling,
    rotary_config,
)
from kernel_pytorch.tolerances import compare

transformers = pytest.importorskip("transformers")
from transformers import CohereConfig, GPTNeoXConfig, LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

BASE = dict(hidden_size=512, num_attention_heads=4, max_position_embeddings=1024)
SCHEMES = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "beta_fast": 16, "truncate": False},
    "yarn_no_factor": {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 512,
                       "attention_factor": 1.2},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": 256,
                 "short_factor": [1.0 + 0.05 * i for i in range(64)],
                 "long_factor": [2.0 + 0.1 * i for i in range(64)]},
}
THETA = 500000.0


def _new_form(params: dict) -> LlamaConfig:
    return LlamaConfig(**BASE, rope_parameters={**params, "rope_theta": THETA})


def _old_form_dict(params: dict) -> dict:
    """A config.json from before transformers 5: theta at the top, the scheme in rope_scaling with
    "type" rather than "rope_type"."""
    scaling = {("type" if key == "rope_type" else key): value for key, value in params.items()}
    return {**BASE, "rope_theta": THETA, "rope_scaling": None if params["rope_type"] == "default" else scaling}


def _hf(config, seq_len=None):
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("seq_len", [None, 700, 5000])
def test_inv_freq_and_scaling_match_transformers(name: str, seq_len: int | None) -> None:
    config = _new_form(SCHEMES[name])
    hf_inv, hf_scale = _hf(config, seq_len)
    for source in (config, config.to_dict(), _old_form_dict(SCHEMES[name])):
        inv, scale = inv_freq_and_scaling(rotary_config(source), seq_len=seq_len)
        assert torch.equal(inv, hf_inv) and scale == hf_scale, (name, type(source).__name__)


def test_old_form_kwargs_reach_the_same_config() -> None:
    old = LlamaConfig(**BASE, rope_theta=THETA, rope_scaling={"type": "linear", "factor": 4.0})
    assert rotary_config(old) == rotary_config(_new_form(SCHEMES["linear"]))


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cos_sin_match_the_rotary_module(name: str, dtype: torch.dtype) -> None:
    """LlamaRotaryEmbedding.forward's cos/sin, attention scaling included, for positions past the
    original length (longrope then takes its long factors)."""
    config = _new_form(SCHEMES[name])
    module = LlamaRotaryEmbedding(config)
    pos = torch.arange(6)[None] + torch.tensor([[0], [600]])
    x = torch.zeros(1, dtype=dtype)
    cos, sin = module(x, pos)
    inv, scale = inv_freq_and_scaling(rotary_config(config), seq_len=int(pos.max()) + 1)
    if name == "dynamic":  # the module's dynamic update runs only past max_position_embeddings
        inv, scale = inv_freq_and_scaling(rotary_config(config))
    ours = cos_sin(inv, pos, scale, dtype)
    assert torch.equal(ours[0], cos) and torch.equal(ours[1], sin)


def test_dynamic_ntk_grows_and_resets_like_the_module() -> None:
    """The module recomputes its frequencies for a longer sequence than it has seen, keeps them for
    shorter ones past the original length, and resets below it: dynamic_cached_len tracks the same."""
    config = _new_form(SCHEMES["dynamic"])
    module = LlamaRotaryEmbedding(config)
    cfg = rotary_config(config)
    cached = cfg.max_position_embeddings
    for length in (100, 3000, 2000, 5000, 500, 1500):
        pos = torch.arange(length)[None]
        cos, _ = module(torch.zeros(1), pos)
        cached = dynamic_cached_len(cached, cfg.max_position_embeddings, length)
        for seq_len in (cached, torch.tensor(cached)):
            inv, _ = inv_freq_and_scaling(cfg, seq_len=seq_len)
            assert torch.equal(inv, module.inv_freq), (length, cached)
            assert torch.equal(cos_sin(inv, pos)[0], cos)


def test_interleaved_cos_sin_match_cohere() -> None:
    config = CohereConfig(hidden_size=256, num_attention_heads=4, rope_parameters={"rope_type": "default"})
    pos = torch.arange(5)[None]
    cos, sin = CohereRotaryEmbedding(config)(torch.zeros(1, dtype=torch.bfloat16), pos)
    inv, scale = inv_freq_and_scaling(rotary_config(config))
    ours = cos_sin(inv, pos, scale, torch.bfloat16, interleaved=True)
    assert torch.equal(ours[0], cos) and torch.equal(ours[1], sin)


@pytest.mark.parametrize("source", ["config", "old_dict"])
def test_partial_rotary_factor(source: str) -> None:
    """GPT-NeoX rotates 25% of each head: rotary_pct in old configs, partial_rotary_factor in new."""
    config = GPTNeoXConfig(hidden_size=512, num_attention_heads=4, rotary_pct=0.25)
    hf = GPTNeoXRotaryEmbedding(config)
    src = config if source == "config" else {"hidden_size": 512, "num_attention_heads": 4, "rotary_pct": 0.25,
                                              "rotary_emb_base": 10000, "max_position_embeddings": 2048}
    cfg = rotary_config(src)
    assert cfg.rotary_dim == 32
    inv, _ = inv_freq_and_scaling(cfg)
    assert torch.equal(inv, hf.inv_freq)


def test_head_dim_and_phi3_original_length() -> None:
    """An explicit head_dim wins over hidden_size / heads; Phi-3 keeps original_max_position_embeddings
    next to rope_parameters, and that value wins, as in transformers."""
    cfg = rotary_config({"hidden_size": 512, "num_attention_heads": 4, "head_dim": 64, "rope_theta": 1e4})
    assert cfg.rotary_dim == 64
    short, long = [1.0] * 48, [4.0] * 48
    config = Phi3Config(hidden_size=384, num_attention_heads=4, max_position_embeddings=8192,
                        original_max_position_embeddings=2048,
                        rope_parameters={"rope_type": "longrope", "short_factor": short, "long_factor": long})
    ours = rotary_config(config)
    assert ours.original_max_position_embeddings == 2048
    for seq_len in (None, 4096):
        hf_inv, hf_scale = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
        inv, scale = inv_freq_and_scaling(ours, seq_len=seq_len)
        assert torch.equal(inv, hf_inv) and scale == hf_scale


def test_table_rows_are_the_per_position_rows() -> None:
    inv, scale = inv_freq_and_scaling(rotary_config(_new_form(SCHEMES["yarn"])))
    table = cos_sin_table(inv, 1100, scale, torch.bfloat16)
    pos = torch.tensor([[0, 5, 1099], [17, 17, 3]])
    rows = cos_sin(inv, pos, scale, torch.bfloat16)
    for t, r in zip(table, rows):
        assert t.shape == (1100, 128)
        assert compare(t[pos], r).passed  # CPU cos may round a vector lane and a tail lane differently


def test_bad_configs_name_the_field() -> None:
    with pytest.raises(ValueError, match="rope_type 'ntk' is not one of"):
        rotary_config({**BASE, "rope_scaling": {"type": "ntk", "factor": 2.0}})
    with pytest.raises(ValueError, match=r"needs rope_parameters\['factor'\]"):
        rotary_config({**BASE, "rope_parameters": {"rope_type": "linear"}})
    with pytest.raises(ValueError, match="low_freq_factor"):
        rotary_config({**BASE, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}})
    assert rotary_config({**BASE}) == RotaryConfig(head_dim=128, max_position_embeddings=1024)
