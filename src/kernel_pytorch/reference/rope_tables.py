"""The rotary tables: inverse frequencies, attention scaling and cos/sin, as transformers computes them.

For rotary width r = int(head_dim * partial_rotary_factor) and base theta, the default frequencies are

    inv_freq[i] = 1 / theta ** (2i / r),   i = 0 .. r/2 - 1            # fp32

and the scaling schemes (transformers' ROPE_INIT_FUNCTIONS, same arithmetic and dtypes) change them:
    linear:   inv_freq / factor
    dynamic:  theta' = theta * (factor * L / L0 - (factor - 1)) ** (r / (r - 2)), L = max(seq_len, L0)
              (NTK-aware; L0 = max_position_embeddings, grows with the longest sequence seen)
    llama3:   long wavelengths (> L_orig / low_freq_factor) divided by factor, short ones
              (< L_orig / high_freq_factor) kept, a linear blend between
    yarn:     per-frequency blend of inv_freq and inv_freq / factor by a ramp over the dims whose
              rotations in L_orig fall between beta_slow and beta_fast; attention_scaling =
              0.1 * ln(factor) + 1 (or the mscale ratio, or the configured attention_factor)
    longrope: inv_freq / ext_factors (short or long list, by seq_len against L_orig), scaled attention

cos/sin for positions p (transformers' RotaryEmbedding.forward): angles = p * inv_freq in fp32,
emb = cat(angles, angles) (rotate-half) or repeat_interleave(angles, 2) (interleaved), then
cos = cos(emb) * attention_scaling, sin likewise, rounded to the model dtype.

Configs come from a transformers config object or its dict (config.json), in either form:
transformers 5's `rope_parameters` (rope_type, rope_theta, partial_rotary_factor inside) or the older
top-level `rope_theta` / `partial_rotary_factor` plus a `rope_scaling` dict ("type" or "rope_type").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DEFAULT_THETA = 10000.0
# transformers reads these from the config itself (original_max_position_embeddings) or derives them
_NEEDS_ORIGINAL_MAX = ("llama3", "yarn", "longrope")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class RotaryConfig:
    """Everything the tables depend on, read once from a model config (see `rotary_config`)."""

    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    head_dim: int = 128
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 2048
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None

    @property
    def rotary_dim(self) -> int:
        """r: the rotated features of each head."""
        return int(self.head_dim * self.partial_rotary_factor)


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _has(config: Any, name: str) -> bool:
    return name in config if isinstance(config, Mapping) else hasattr(config, name)


def rotary_config(config: Any, layer_type: str | None = None) -> RotaryConfig:
    """Read a `RotaryConfig` from a transformers config object or a config dict.

    Args:
        config: has head_dim (or hidden_size and num_attention_heads), max_position_embeddings, and
            either `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older), where
            `rope_scaling` wins if both are set, as in transformers.
        layer_type: the key of a per-layer-type `rope_parameters` dict (e.g. "sliding_attention").
    Raises:
        ValueError naming the field when a scheme lacks one it needs, or the type is unknown.
    """
    params = _get(config, "rope_scaling") or _get(config, "rope_parameters") or {}
    if layer_type is not None:
        params = params[layer_type]
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
    theta = params.get("rope_theta", _get(config, "rope_theta", _get(config, "rotary_emb_base")))
    partial = params.get("partial_rotary_factor", _get(config, "partial_rotary_factor", _get(config, "rotary_pct")))
    head_dim = _get(config, "head_dim") or _get(config, "hidden_size") // _get(config, "num_attention_heads")
    max_pos = _get(config, "max_position_embeddings")
    original = params.get("original_max_position_embeddings")
    if rope_type in _NEEDS_ORIGINAL_MAX:
        # Phi-3 keeps the pretraining length next to, not inside, the rope parameters; it wins
        if _has(config, "original_max_position_embeddings"):
            original = _get(config, "original_max_position_embeddings")
        original = original if original is not None else max_pos
    if rope_type in ("linear", "dynamic", "llama3") and params.get("factor") is None:
        raise ValueError(f"rope_type {rope_type!r} needs rope_parameters['factor']")
    if rope_type == "llama3" and (params.get("low_freq_factor") is None or params.get("high_freq_factor") is None):
        raise ValueError("rope_type 'llama3' needs rope_parameters['low_freq_factor'] and ['high_freq_factor']")
    if rope_type == "longrope" and (params.get("short_factor") is None or params.get("long_factor") is None):
        raise ValueError("rope_type 'longrope' needs rope_parameters['short_factor'] and ['long_factor']")
    return RotaryConfig(
        rope_type=rope_type,
        theta=float(theta) if theta is not None else DEFAULT_THETA,
        head_dim=int(head_dim),
        partial_rotary_factor=float(partial) if partial is not None else 1.0,
        max_position_embeddings=int(max_pos) if max_pos is not None else 2048,
        factor=params.get("factor"),
        original_max_position_embeddings=original,
        low_freq_factor=params.get("low_freq_factor"),
        high_freq_factor=params.get("high_freq_factor"),
        attention_factor=params.get("attention_factor"),
        beta_fast=params.get("beta_fast"),
        beta_slow=params.get("beta_slow"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=params.get("truncate", True),
        short_factor=tuple(params["short_factor"]) if params.get("short_factor") is not None else None,
        long_factor=tuple(params["long_factor"]) if params.get("long_factor") is not None else None,
    )


def _exponents(dim: int, device: torch.device | str | None) -> Tensor:
    """2i / dim for i < dim / 2, fp32 (the exponent of theta in every scheme)."""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim


def default_inv_freq(theta: float, dim: int, device: torch.device | str | None = None) -> Tensor:
    """1 / theta ** (2i / dim): (dim // 2,) fp32."""
    return 1.0 / (theta ** _exponents(dim, device))


def _dynamic(cfg: RotaryConfig, seq_len: int | Tensor | None, device) -> Tensor:
    dim, max_pos, factor = cfg.rotary_dim, cfg.max_position_embeddings, cfg.factor
    if seq_len is None:
        seq_len = max_pos
    elif isinstance(seq_len, Tensor):  # a tensor length keeps transformers' fp32 tensor arithmetic
        seq_len = torch.maximum(seq_len, torch.tensor(max_pos, dtype=seq_len.dtype, device=seq_len.device))
    else:
        seq_len = max(seq_len, max_pos)
    base = cfg.theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim, device))


def _llama3(cfg: RotaryConfig, device) -> Tensor:
    inv_freq = default_inv_freq(cfg.theta, cfg.rotary_dim, device)
    factor, low, high = cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor
    old_len = cfg.original_max_position_embeddings
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(cfg: RotaryConfig, device) -> tuple[Tensor, float]:
    dim, base, original = cfg.rotary_dim, cfg.theta, cfg.original_max_position_embeddings
    factor = cfg.factor if cfg.factor is not None else cfg.max_position_embeddings / original
    scaling = cfg.attention_factor
    if scaling is None:
        if cfg.mscale and cfg.mscale_all_dim:
            scaling = float(_yarn_mscale(factor, cfg.mscale) / _yarn_mscale(factor, cfg.mscale_all_dim))
        else:
            scaling = _yarn_mscale(factor)
    beta_fast, beta_slow = cfg.beta_fast or 32, cfg.beta_slow or 1

    def correction_dim(rotations: float) -> float:  # the dim whose wavelength fits `rotations` times
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp.to(device=device, dtype=torch.float)  # 1: extrapolate (high frequencies), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep, scaling


def _longrope(cfg: RotaryConfig, seq_len: int | None, device) -> tuple[Tensor, float]:
    original = cfg.original_max_position_embeddings
    factor = cfg.factor if cfg.factor is not None else cfg.max_position_embeddings / original
    scaling = cfg.attention_factor
    if scaling is None:
        scaling = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = cfg.long_factor if seq_len and seq_len > original else cfg.short_factor
    ext_factors = torch.tensor(ext, dtype=torch.float32, device=device)
    shape = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.int64, device=device).float() / cfg.rotary_dim
    return 1.0 / (ext_factors * cfg.theta**shape), scaling


def inv_freq_and_scaling(
    cfg: RotaryConfig, seq_len: int | Tensor | None = None, device: torch.device | str | None = None
) -> tuple[Tensor, float]:
    """The inverse frequencies ((rotary_dim // 2,) fp32) and the attention scaling of cos/sin.

    Args:
        cfg: from `rotary_config`.
        seq_len: the sequence length the table must serve (dynamic: the longest seen so far, int or a
            0-d tensor as transformers' module passes; longrope: picks the long factors past the
            original length); ignored by the other schemes.
    """
    kind = cfg.rope_type
    if kind == "default":
        return default_inv_freq(cfg.theta, cfg.rotary_dim, device), 1.0
    if kind == "linear":
        return default_inv_freq(cfg.theta, cfg.rotary_dim, device) / cfg.factor, 1.0
    if kind == "dynamic":
        return _dynamic(cfg, seq_len, device), 1.0
    if kind == "llama3":
        return _llama3(cfg, device), 1.0
    if kind == "yarn":
        return _yarn(cfg, device)
    return _longrope(cfg, seq_len, device)


def dynamic_cached_len(cached: int, original: int, seq_len: int) -> int:
    """transformers' dynamic-NTK cache rule: the length the frequencies are computed for after a call
    whose positions reach seq_len - 1, given the length `cached` before it (starts at `original`,
    max_position_embeddings). Grows to a longer sequence; resets to `original` when a sequence
    shorter than it comes after growth; else unchanged."""
    if seq_len > cached:
        cached = seq_len
    if seq_len < original and cached > original:
        cached = original
    return cached


def cos_sin(
    inv_freq: Tensor, position_ids: Tensor, attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32, interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """cos/sin rows for positions, as transformers' rotary module returns them.

    Args:
        inv_freq: (r // 2,) fp32.
        position_ids: integer (..., T), typically (B, T).
        attention_scaling: multiplies cos and sin (YaRN, LongRoPE).
        dtype: the model dtype the rows are rounded to.
        interleaved: repeat each angle twice in place (GPT-J/Cohere layout) instead of cat.
    Returns:
        cos, sin of shape (..., T, r) and `dtype`.
    """
    freqs = position_ids[..., None].float() * inv_freq.to(device=position_ids.device, dtype=torch.float)
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def cos_sin_table(
    inv_freq: Tensor, n_positions: int, attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32, interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """(n_positions, r) cos/sin tables: row p is `cos_sin` at position p (the kernels' table form)."""
    positions = torch.arange(n_positions, device=inv_freq.device)
    return cos_sin(inv_freq, positions, attention_scaling, dtype, interleaved)
