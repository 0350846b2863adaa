"""Where a decoder attention's q, k and v come from, for the attention rule: three projections, or one
packed projection in one of the layouts transformers' families use; and which child projects back.

    layout    projections                           rows of the packed weight, per token (H query heads,
                                                    KV key/value heads, D features each)
    split     q_proj, k_proj, v_proj -> o_proj       -
    concat    qkv_proj -> o_proj (Phi-3)            [q (H*D); k (KV*D); v (KV*D)]
              query_key_value -> dense (Falcon multi_query: KV = 1)
    per_head  query_key_value -> dense (GPT-NeoX,   [q_0; k_0; v_0; q_1; k_1; v_1; ...], D rows each (KV = H)
              Falcon without multi_query)
    grouped   query_key_value -> dense (Falcon      per KV group g of G = H / KV query heads:
              new_decoder_architecture)             [q_gG; ...; q_(gG+G-1); k_g; v_g], D rows each

`qkv_layout(module)` reads the layout from the module's children and attributes (GPT-NeoX and Falcon
keep the head size as `head_size` / `head_dim`, Falcon its layout flags as `new_decoder_architecture` and
`multi_query`), and `QKVLayout.split` cuts the packed projection's output into q, k and v exactly as
those modules do, as views where the layout allows (the rotary op takes any strides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

Kind = Literal["split", "concat", "per_head", "grouped"]


@dataclass(frozen=True)
class QKVLayout:
    """How one attention module holds its projections: `kind` (module docstring), the packed projection's
    name `packed` (None for split q/k/v), the output projection's name `out`, and the head counts."""

    kind: Kind
    n_heads: int
    n_kv_heads: int
    head_dim: int
    packed: str | None = None
    out: str = "o_proj"

    @property
    def projections(self) -> tuple[str, ...]:
        """The Linear children the replacement calls, in the order the module holds them."""
        qkv = ("q_proj", "k_proj", "v_proj") if self.packed is None else (self.packed,)
        return (*qkv, self.out)

    def packed_features(self) -> int:
        """The packed projection's output features: 3HD for per_head, (H + 2KV)D otherwise."""
        heads = 3 * self.n_heads if self.kind == "per_head" else self.n_heads + 2 * self.n_kv_heads
        return heads * self.head_dim

    def split(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The packed projection's output (B, T, packed_features) -> q (B, T, H, D), k and v (B, T, KV, D)."""
        b, t, d = qkv.shape[0], qkv.shape[1], self.head_dim
        if self.kind == "concat":
            q, k, v = qkv.split((self.n_heads * d, self.n_kv_heads * d, self.n_kv_heads * d), dim=-1)
            return q.view(b, t, -1, d), k.view(b, t, -1, d), v.view(b, t, -1, d)
        if self.kind == "per_head":
            q, k, v = qkv.view(b, t, self.n_heads, 3, d).unbind(-2)
            return q, k, v
        if self.kind == "grouped":
            grouped = qkv.view(b, t, self.n_kv_heads, -1, d)
            return grouped[..., :-2, :].flatten(2, 3), grouped[..., -2, :], grouped[..., -1, :]
        raise ValueError(f"{self.kind!r} projections are not packed")


def _int(module: nn.Module, *names: str) -> int | None:
    for n in names:
        value = getattr(module, n, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _packed_query_key_value(module: nn.Module, heads: int, proj: nn.Linear) -> QKVLayout | str:
    """GPT-NeoX's and Falcon's `query_key_value`: the layout from Falcon's flags (GPT-NeoX has none)."""
    head_dim = _int(module, "head_dim", "head_size")
    if head_dim is None:
        return "no int head_dim or head_size attribute"
    if getattr(module, "new_decoder_architecture", False) is True:
        kv = _int(module, "num_kv_heads")
        if kv is None or kv < 1 or heads % kv:
            return f"new_decoder_architecture with num_kv_heads={kv!r}, which does not divide {heads} heads"
        layout = QKVLayout("grouped", heads, kv, head_dim, "query_key_value", "dense")
    elif getattr(module, "multi_query", False) is True:
        layout = QKVLayout("concat", heads, 1, head_dim, "query_key_value", "dense")
    else:
        kv = _int(module, "num_kv_heads")
        if kv is not None and kv != heads:  # its forward pairs one k/v per head whatever this says
            return f"per-head packed q/k/v with num_kv_heads={kv} != {heads} heads"
        layout = QKVLayout("per_head", heads, heads, head_dim, "query_key_value", "dense")
    if proj.out_features != layout.packed_features():
        return (f"query_key_value has {proj.out_features} output features where the {layout.kind} layout of "
                f"{heads} heads, {layout.n_kv_heads} KV heads of {head_dim} has {layout.packed_features()}")
    return layout


def qkv_layout(module: nn.Module) -> QKVLayout | str | None:
    """The layout of `module`'s projections; None when it has none of these shapes (not an attention of
    ours to judge), a reason string when it has one we do not reproduce. Every projection named in the
    layout is a child nn.Linear."""
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    linear = {n: isinstance(getattr(module, n, None), nn.Linear)
              for n in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value", "dense")}
    if not isinstance(heads, int):
        return None
    if linear["query_key_value"] and linear["dense"]:
        return _packed_query_key_value(module, heads, module.query_key_value)
    if not linear["o_proj"] or not (linear["qkv_proj"] or all(linear[n] for n in ("q_proj", "k_proj", "v_proj"))):
        return None
    kv, head_dim = getattr(config, "num_key_value_heads", None), _int(module, "head_dim")
    if not isinstance(kv, int) or head_dim is None:
        return None
    if linear["qkv_proj"]:
        layout = QKVLayout("concat", heads, kv, head_dim, "qkv_proj")
        if module.qkv_proj.out_features != layout.packed_features():
            return f"qkv_proj has {module.qkv_proj.out_features} output features, not {layout.packed_features()}"
        return layout
    return QKVLayout("split", heads, kv, head_dim)


def rotary_dims(module: nn.Module, head_dim: int) -> int:
    """The rotated features per head: the module's `rotary_ndims` (GPT-NeoX, StableLM), else head_dim
    times the config's partial_rotary_factor (read from `rope_parameters` in newer transformers), even."""
    own = _int(module, "rotary_ndims")
    if own is not None:
        return own
    config = getattr(module, "config", None)
    rope = getattr(config, "rope_parameters", None)
    factor = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if factor is None:
        factor = getattr(config, "partial_rotary_factor", None)
    return int(head_dim * float(factor or 1.0)) // 2 * 2


__all__ = ["QKVLayout", "qkv_layout", "rotary_dims"]
