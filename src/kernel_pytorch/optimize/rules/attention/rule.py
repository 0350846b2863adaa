"""Attention rule: Hugging Face decoder attention modules (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3,
StableLM, GPT-NeoX, Falcon and any class shaped like them) to `HFAttention`, which computes the same
attention through `kernel_pytorch.functional.attention` and `apply_rotary`.

Recognised by structure, not by class name: the projections (q_proj/k_proj/v_proj -> o_proj, Phi-3's
packed qkv_proj, GPT-NeoX's and Falcon's packed query_key_value -> dense, in the layouts of
layouts.py), optional q_norm/k_norm on (B, T, H, D) (Qwen3, Gemma3) or q_layernorm/k_layernorm
on (B, H, T, D) (StableLM's qk_layernorm), the `config`, `layer_idx` and `scaling` transformers'
attention classes keep, and a forward taking `position_embeddings`. Partial rotary (GPT-NeoX's
rotary_pct, StableLM's and Phi's partial_rotary_factor) rotates the first r features of each head, r
being the width of transformers' cos/sin; the rest pass through. A probe (random hidden states, cos/sin
of the module's rotary width and a padded causal mask) checks the replacement computes what the module
computes before it is used.

Split q/k/v projections (plain Linears) run through `functional.shared_input_linears`: the same three
GEMMs, and in the backward the input's gradient summed inside the GEMMs instead of by an add kernel.

`HFAttention` keeps transformers' call (hidden_states, position_embeddings=(cos, sin), attention_mask,
past_key_values / cache / layer_past, **kwargs) -> (attn_output, None), the child modules themselves
(so `state_dict` keys and parameters are unchanged) and every plain attribute (`layer_idx`,
`sliding_window`, `is_causal` ...).

The fast call. transformers builds the 4-D mask before the layers see it; whether it hands SDPA
`is_causal=True` or a materialised (B, 1, T, T) mask with K/V repeated depends on its version and on
tracing (under torch.compile 5.17 materialises it). `HFAttention` does not look at the mask's values:
a pre-hook on the model (`MaskHint`, hint.py) records, for the call in progress, whether the caller asked
for plain causal attention (no `attention_mask`, or an all-ones 2-D one in eager mode; no `position_ids`
without a mask, which could mark packed documents; no cache; no other input that may shape the mask).
When it did, and the layer's queries and keys have the same length within any sliding window, the layer
calls SDPA with `is_causal=True`, no mask and K/V not repeated (`enable_gqa`); where the layer's window
binds it passes the window itself (`attention(window=...)`: FlexAttention's block mask on CUDA, whose
tiles outside the window cost nothing) instead of transformers' dense mask. In every other case
(padding, a cache with earlier tokens, a 4-D mask from the caller) it passes transformers' mask on. The
window is the one transformers' mask gives the layer (`_layer_window`): the layer's `sliding_window` where
it has one (Qwen2/3, Gemma 2/3: None on full layers), else its entry of the config's `layer_types` (Qwen2-
MoE keeps the attribute on sliding layers only), else the config's `sliding_window` on every layer
(Mistral, Phi-3); a window that is not a positive int is not understood, and such a layer always passes
transformers' mask on. An activation-checkpointing recompute, which runs after the hint is cleared, finds
the decision on transformers' mask tensor.

Packed documents. Where transformers reads packed documents from `position_ids` (given without an
`attention_mask`, and no cache in the layer: hint.py), the layer attends causally within each document
(and its sliding window) through `attention(seq_ids=...)`, the ids read from the position ids, instead of
transformers' dense (B, 1, T, T) mask: FlexAttention's block mask on CUDA (only the tiles inside
documents run), SDPA with the block-diagonal boolean mask on the CPU (which has a backward; CPU Flex has
none). RoPE needs nothing more: transformers' cos/sin are already those of the restarting positions.

Left alone, with the reason: attention dropout > 0, flash / flex / paged attention implementations
(their masks are other objects), ALiBi (Falcon's `alibi`: the bias rides in the mask, which the fast
call drops), bidirectional layers, extra parameters, hooks, LoRA-like projections, a module that fails
the probe (with the error's text). GPT-2's Conv1D attention is not of this shape and is not matched.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.functional import Backend
from kernel_pytorch.functional.attention import attention, prepare_mask
from kernel_pytorch.functional.linears import shared_input_linears
from kernel_pytorch.functional.rope import apply_rotary
from kernel_pytorch.nn._recompute import recompute_norm_outputs
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import projections_left_alone, same_output
from kernel_pytorch.optimize.rules.attention.hint import MaskHint, hint_of
from kernel_pytorch.optimize.rules.attention.layouts import QKVLayout, qkv_layout, rotary_dims
from kernel_pytorch.optimize.rules.norm import HFRMSNormRule

_NORMS = ("q_norm", "k_norm")  # on (B, T, H, D); RMSNorms, swapped by the norm rule
_HEAD_NORMS = ("q_layernorm", "k_layernorm")  # on (B, H, T, D) (StableLM's per-head LayerNorms), kept
_IMPLEMENTATIONS = ("sdpa", "eager", None)


class HFAttention(nn.Module):
    """A transformers decoder attention computed by kernel_pytorch (module docstring). Built by
    `AttentionRule` from the module it replaces; holds that module's children and attributes.
    `backend` (RoPE's: "auto", "triton", "reference") may be set on an instance, as on the norms."""

    backend: Backend = "auto"

    def __init__(self, old: nn.Module, layout: QKVLayout, norms: dict[str, nn.Module]) -> None:
        super().__init__()
        for key, value in vars(old).items():
            if not key.startswith("_") and key != "training":
                setattr(self, key, value)
        for name, child in old.named_children():
            self.add_module(name, norms.get(name, child))
        config = old.config
        self.layout = layout
        self.n_heads, self.n_kv_heads, self.head_dim = layout.n_heads, layout.n_kv_heads, layout.head_dim
        self.softcap = getattr(old, "attn_logit_softcapping", None)
        # None with the eager implementation means no mask at all; with SDPA, causal
        self.none_is_causal = getattr(config, "_attn_implementation", None) != "eager"
        # the window transformers' mask gives this layer; the structural calls (fast, windowed, documents)
        # only where it is understood
        self.window_bound, self.window_known = _layer_window(old, config)
        self.hint: MaskHint | None = None
        self.train(old.training)

    def extra_repr(self) -> str:
        return (f"layer_idx={self.layer_idx}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, layout={self.layout.kind!r}, window_bound={self.window_bound}")

    def attach(self, model: nn.Module) -> None:
        """Share the model's MaskHint (registering its hooks on the first attach)."""
        hint = hint_of(model)
        if hint is None:
            hint = MaskHint()
            hint.handles = [model.register_forward_pre_hook(hint.before, with_kwargs=True),
                            model.register_forward_hook(hint.after, with_kwargs=True, always_call=True)]
        hint.users += 1
        self.hint = hint

    def detach(self, model: nn.Module) -> None:
        """Stop using the hint; the last user removes its hooks from the model."""
        hint, self.hint = self.hint, None
        if hint is not None:
            hint.users -= 1
            if hint.users <= 0:
                for handle in hint.handles:
                    handle.remove()

    def forward(self, hidden_states: Tensor, position_embeddings: tuple[Tensor, Tensor] | None = None,
                attention_mask: Tensor | None = None, past_key_values: Any = None,
                cache_position: Tensor | None = None, cache: Any = None, layer_past: Any = None,
                **kwargs: Any) -> tuple[Tensor, None]:
        """hidden_states (B, T, hidden) -> ((B, T, hidden), None), as transformers' attention (which
        takes the KV cache as `past_key_values` in older transformers, as `cache` in newer ones and as
        `layer_past` in GPT-NeoX and Falcon). cos, sin: (B or 1, T, r), r <= head_dim: the first r
        features of each head rotate, the rest pass through."""
        if cache is not None:
            past_key_values = cache
        elif layer_past is not None:
            past_key_values = layer_past
        b, t = hidden_states.shape[:2]
        with recompute_norm_outputs():  # the projections keep not a norm's output but its input
            if self.layout.packed is not None:
                q, k, v = self.layout.split(getattr(self, self.layout.packed)(hidden_states))
            else:
                q, k, v = (x.view(b, t, -1, self.head_dim) for x in self._split_projections(hidden_states))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if hasattr(self, "q_layernorm"):
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        cos, sin = position_embeddings
        q, k = apply_rotary(q, k, cos, sin, backend=self.backend)
        if past_key_values is not None:
            extra = () if cache_position is None else ({"sin": sin, "cos": cos, "cache_position": cache_position},)
            k, v = past_key_values.update(k, v, self.layer_idx, *extra)
        out = self._attend(q, k, v, attention_mask, kwargs.get("position_ids"), past_key_values is not None)
        return getattr(self, self.layout.out)(out.transpose(1, 2).reshape(b, t, -1)), None

    def _split_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q_proj(x), k_proj(x), v_proj(x): while all three are still torch Linears without hooks (checked
        per call: a module swapped in later, e.g. a LoRA layer, runs as itself), as shared-input GEMMs
        with one input-gradient buffer summed in the GEMMs."""
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if all(type(p).forward is nn.Linear.forward and not (p._forward_hooks or p._forward_pre_hooks)
               for p in projs):
            return shared_input_linears(x, *_weights_and_biases(*projs))
        return projs[0](x), projs[1](x), projs[2](x)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Any, position_ids: Tensor | None,
                cached: bool) -> Tensor:
        q_len, kv_len = q.shape[2], k.shape[2]
        options = dict(scale=self.scaling, softcap=self.softcap)
        eager = not torch.compiler.is_compiling()
        hint = self.hint
        plain = hint is not None and hint.plain_causal
        docs = None
        if hint is not None and hint.documents and self.window_known and not cached \
                and isinstance(position_ids, Tensor) and q_len == kv_len:
            docs = hint.documents_of(position_ids, q.shape[0])
            plain = docs is None  # every row one document (found in eager only): plain causal
        elif eager and isinstance(mask, Tensor):
            # an activation-checkpointing recompute runs after the model's call has cleared the hint: the
            # mask it was decided for carries the decision (eager only; a compiled graph recomputes itself)
            plain = plain or getattr(mask, "_kp_plain_causal", False)
            docs = getattr(mask, "_kp_seq_ids", None)
        if docs is not None:  # packed documents: causal within each, in any sliding window
            if eager and isinstance(mask, Tensor):
                mask._kp_seq_ids = docs
            return attention(q, k, v, is_causal=True, window=self.window_bound, seq_ids=docs, **options)
        if plain and self.window_known and q_len == kv_len and q_len > 1:
            if eager and isinstance(mask, Tensor):
                mask._kp_plain_causal = True
            if self.window_bound is None or kv_len <= self.window_bound:
                return attention(q, k, v, is_causal=True, **options)  # the fast call: no mask, K/V not repeated
            # a window that binds, as the structural option: block-sparse Flex on CUDA, not a dense mask
            return attention(q, k, v, is_causal=True, window=self.window_bound, **options)
        if mask is None:
            causal = self.none_is_causal and q_len > 1
            if causal and kv_len > q_len:  # a fresh static cache: transformers attends to its first q_len slots
                k, v = k[:, :, :q_len], v[:, :, :q_len]
            return attention(q, k, v, is_causal=causal, **options)
        if mask.dim() == 4:
            mask = mask[:, :, :, :kv_len]
        return attention(q, k, v, mask=prepare_mask(mask, q_len, kv_len), **options)


def _layer_window(module: nn.Module, config: Any) -> tuple[int | None, bool]:
    """(the sliding window transformers' mask gives the layer, None for none; whether it is understood): the
    module's `sliding_window` attribute, else the layer's entry of `config.layer_types`, else the config's
    `sliding_window` (a window for every layer: Mistral, Phi-3); understood when None or a positive int."""
    index = getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None)
    if hasattr(module, "sliding_window"):
        window = module.sliding_window
    elif isinstance(types, (list, tuple)) and isinstance(index, int) and 0 <= index < len(types):
        window = getattr(config, "sliding_window", None) if types[index] == "sliding_attention" else None
    else:
        window = getattr(config, "sliding_window", None)
    known = window is None or (isinstance(window, int) and not isinstance(window, bool) and window > 0)
    return (window if known else None), known


def _weights_and_biases(*linears: nn.Linear) -> tuple[tuple[Tensor, ...], tuple[Tensor | None, ...]]:
    return tuple(p.weight for p in linears), tuple(p.bias for p in linears)


def _shape(module: nn.Module) -> QKVLayout | str | None:
    """The projections' layout when `module` is shaped like a transformers decoder attention (a reason
    string when it is, in a layout we do not reproduce), else None."""
    if not isinstance(getattr(module, "layer_idx", None), int):
        return None
    try:
        takes = "position_embeddings" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return qkv_layout(module) if takes else None


def _left_alone(module: nn.Module, projs: dict[str, nn.Linear]) -> str | None:
    if (why := projections_left_alone(module, projs)) is not None:
        return why
    for name, child in module.named_children():
        if name not in projs and name not in (*_NORMS, *_HEAD_NORMS):
            return f"has a child {name} ({type(child).__name__}) the replacement would not call"
    for q, k in (_NORMS, _HEAD_NORMS):  # the forward applies both of a pair or neither
        if isinstance(getattr(module, q, None), nn.Module) != isinstance(getattr(module, k, None), nn.Module):
            return f"has one of {q}/{k} but not the other"
    impl = getattr(module.config, "_attn_implementation", None)
    if impl not in _IMPLEMENTATIONS:
        return f"attn_implementation={impl!r}: only 'sdpa' and 'eager' masks are understood"
    if getattr(module.config, "alibi", False):
        return "ALiBi position bias (carried in the mask, which the fast causal call would drop)"
    if float(getattr(module, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention_dropout > 0 (the replacement applies no dropout)"
    if not getattr(module, "is_causal", True):
        return "bidirectional attention (is_causal=False)"
    if not isinstance(getattr(module, "scaling", None), float):
        return "no float `scaling` attribute"
    return None


def _probe(module: nn.Module, layout: QKVLayout) -> tuple[tuple, dict]:
    """(args, kwargs) for one call: hidden states (2, 5, hidden), random cos/sin over the module's rotary
    width and a causal additive mask that pads the first key of row 0 (the mask path; the fast path needs
    no probe: it is the same attention with the mask it would build)."""
    out = getattr(module, layout.out)
    weight = out.weight
    dtype = weight.dtype if weight.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32
    g = torch.Generator().manual_seed(1234)
    hidden = out.out_features
    rot = rotary_dims(module, layout.head_dim)
    x = torch.randn(2, 5, hidden, generator=g)
    angles = torch.rand(2, 5, rot // 2, generator=g) * 6.0
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    keep = torch.ones(5, 5).tril().bool().expand(2, 1, 5, 5).clone()
    keep[0, :, 1:, 0] = False
    mask = torch.zeros(2, 1, 5, 5).masked_fill(~keep, torch.finfo(dtype).min)
    to = dict(device=weight.device, dtype=dtype)
    return (x.to(**to),), {"position_embeddings": (cos.to(**to), sin.to(**to)), "attention_mask": mask.to(**to)}


class AttentionRule:
    """A transformers-style decoder attention (any class: structure, names and a probe) -> HFAttention."""

    name = "hf_attention"
    family = "attention"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if isinstance(module, HFAttention) or (layout := _shape(module)) is None:
            return None
        kind = type(module).__name__
        if isinstance(layout, str):
            return Match(None, f"{kind}: {layout}")
        projs = {n: getattr(module, n) for n in layout.projections}
        if (why := _left_alone(module, projs)) is not None:
            return Match(None, f"{kind}: {why}")
        norms: dict[str, nn.Module] = {}
        for n in _NORMS:
            child = getattr(module, n, None)
            if child is not None:
                found = HFRMSNormRule().match(child, f"{name}.{n}", model)
                if found is not None and found.replacement is not None:
                    norms[n] = found.replacement
        try:
            new = HFAttention(module, layout, norms)
        except (AttributeError, TypeError, ValueError) as exc:
            return Match(None, f"{kind}: {exc}")
        if list(module.state_dict(keep_vars=True)) != list(new.state_dict(keep_vars=True)):
            return Match(None, f"{kind}: the replacement's state_dict keys would differ")
        args, kwargs = _probe(module, layout)
        try:
            with torch.no_grad():
                expected = module(*args, **kwargs)[0]
                got = new(*args, **kwargs)[0]
        except Exception as exc:  # a forward of another kind: not ours to replace
            return Match(None, f"{kind} does not run as a transformers attention on a probe "
                               f"({short_error(exc, 300, lines=2)})")
        if not same_output(expected, got):
            return Match(None, f"{kind} computes something other than HFAttention on a probe input")
        extra = f", {'/'.join(norms)} swapped" if norms else ""
        packed = f", packed {layout.packed} ({layout.kind})" if layout.packed else ""
        return Match(new, f"{kind} ({new.n_heads} heads, {new.n_kv_heads} KV heads{packed}{extra}) "
                          "-> HFAttention (SDPA is_causal + GQA when the mask is plain causal)")


ATTENTION_RULES = (AttentionRule(),)

__all__ = ["ATTENTION_RULES", "AttentionRule", "HFAttention"]
