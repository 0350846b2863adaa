"""RotaryEmbedding: cos/sin for the rotary position embedding, as transformers computes them.

`forward(x, position_ids)` has the call shape and results of transformers' rotary modules
(`LlamaRotaryEmbedding` and the like): cos/sin rows (B, T, r) in x's dtype, bit for bit the same for
the schemes none/linear/dynamic NTK/Llama-3/YaRN/LongRoPE (reference/rope_tables.py is the
arithmetic; tests/nn/test_rope.py compares with transformers' modules). `table(n_positions, ...)`
returns (P, r) tables cached per (device, dtype), the form `functional.apply_rotary(...,
position_ids=...)` reads: no per-step cos/sin computation, one table shared by every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch.reference.rope_tables import (
    RotaryConfig,
    cos_sin,
    cos_sin_table,
    dynamic_cached_len,
    inv_freq_and_scaling,
    rotary_config,
)


class RotaryEmbedding(torch.nn.Module):
    """The rotary tables of one model (or one layer type).

    Args:
        head_dim: D, the per-head width (ignored when `config` is given).
        theta: the frequency base (transformers' rope_theta).
        partial_rotary_factor: the rotated fraction of each head: r = int(head_dim * factor).
        max_position_embeddings: the model's context length (dynamic NTK scales past it).
        scaling: a scheme as transformers' rope_parameters / rope_scaling write it, e.g.
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}; None: no scaling.
        config: instead of the arguments above: a transformers config object or config dict
            (rope_theta, rope_parameters or rope_scaling, partial_rotary_factor, head_dim), or a
            `RotaryConfig`.
        layer_type: the key of a per-layer-type rope_parameters dict in `config`.
        interleaved: lay cos/sin out for the interleaved pairing (GPT-J, Cohere) instead of
            rotate-half.
    Buffers (not in the state dict, as in transformers): inv_freq (r/2,), original_inv_freq.
    """

    def __init__(
        self,
        head_dim: int | None = None,
        *,
        theta: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        max_position_embeddings: int = 2048,
        scaling: Mapping[str, Any] | None = None,
        config: Any = None,
        layer_type: str | None = None,
        interleaved: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if config is None:
            if head_dim is None:
                raise ValueError("RotaryEmbedding needs head_dim (or a config)")
            params = {"rope_type": "default", **(scaling or {}), "rope_theta": theta,
                      "partial_rotary_factor": partial_rotary_factor}
            config = {"head_dim": head_dim, "max_position_embeddings": max_position_embeddings,
                      "rope_parameters": params}
        self.config = config if isinstance(config, RotaryConfig) else rotary_config(config, layer_type)
        self.interleaved = interleaved
        inv_freq, self.attention_scaling = inv_freq_and_scaling(self.config, device=device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)
        self._cached_len = self.config.max_position_embeddings  # dynamic NTK: the length inv_freq serves
        self._long = False  # LongRoPE: whether inv_freq holds the long factors
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    @classmethod
    def from_config(cls, config: Any, layer_type: str | None = None, **kwargs: Any) -> RotaryEmbedding:
        """From a transformers config object or dict (or a RotaryConfig); kwargs: interleaved, device."""
        return cls(config=config, layer_type=layer_type, **kwargs)

    @property
    def rotary_dim(self) -> int:
        """r: the rotated features of each head (cos/sin's last dim)."""
        return self.config.rotary_dim

    def _set_inv_freq(self, seq_len: int | None) -> None:
        inv_freq, self.attention_scaling = inv_freq_and_scaling(self.config, seq_len, self.inv_freq.device)
        self.inv_freq = inv_freq
        self._tables.clear()

    def _update(self, seq_len: int) -> None:
        """The schemes whose frequencies depend on the length served (transformers' dynamic_rope_update)."""
        kind = self.config.rope_type
        if kind == "dynamic":
            cached = dynamic_cached_len(self._cached_len, self.config.max_position_embeddings, seq_len)
            if cached != self._cached_len:
                self._cached_len = cached
                self._set_inv_freq(cached)
        elif kind == "longrope":
            long = seq_len > self.config.original_max_position_embeddings
            if long != self._long:
                self._long = long
                self._set_inv_freq(seq_len)

    @torch.no_grad()
    def forward(self, x: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin rows for position_ids (B, T): (B, T, r) each, x's dtype and device (x is read for
        those only), with the attention scaling applied, as transformers' rotary modules return them.
        Dynamic NTK and LongRoPE read max(position_ids) (a host sync, as in transformers)."""
        if self.config.rope_type in ("dynamic", "longrope"):
            self._update(int(position_ids.max()) + 1)
        return cos_sin(self.inv_freq.to(x.device), position_ids, self.attention_scaling, x.dtype, self.interleaved)

    @torch.no_grad()
    def table(
        self, n_positions: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[Tensor, Tensor]:
        """(n_positions, r) cos/sin tables (row p: position p), for apply_rotary(..., position_ids=...).

        Cached per (device, dtype): a call for no more rows than cached returns views of the cache;
        a longer one recomputes at least twice the cached length. Rows equal `forward`'s up to the
        rounding of cos/sin in different vector lanes (one ulp of the table dtype at most).
        """
        device = torch.device(device) if device is not None else self.inv_freq.device
        if self.config.rope_type in ("dynamic", "longrope"):
            self._update(n_positions)
        key = (device, dtype)
        cached = self._tables.get(key)
        if cached is None or cached[0].shape[0] < n_positions:
            length = max(n_positions, 2 * cached[0].shape[0]) if cached is not None else n_positions
            cached = cos_sin_table(self.inv_freq.to(device), length, self.attention_scaling, dtype, self.interleaved)
            self._tables[key] = cached
        return cached[0][:n_positions], cached[1][:n_positions]

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        self._tables.clear()  # .to()/.cuda()/.half(): the buffers moved, the tables follow on demand
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        c = self.config
        return f"rope_type={c.rope_type!r}, rotary_dim={c.rotary_dim}, theta={c.theta}, interleaved={self.interleaved}"
