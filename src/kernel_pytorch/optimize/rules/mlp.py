"""MLP rules: Hugging Face-style gated MLPs to `kernel_pytorch.nn.GatedMLP`, and fc1 -> act -> fc2
MLPs to `kernel_pytorch.nn.MLP`; mixture-of-experts blocks recognised and left alone.

Recognised by structure, not by class name:

    hf_gated_mlp:  child Linears gate_proj, up_proj, down_proj   LlamaMLP, MistralMLP, Qwen2MLP, GemmaMLP ...
                   and FalconH1MLP, whose gate_multiplier / down_multiplier attributes GatedMLP takes over
    packed_gated_mlp: child Linears gate_up_proj ([gate; up] rows), down_proj   Phi3MLP
                   (-> GatedMLP(fuse_gate_up=True): one GEMM, gated_act_packed, saved in the packed layout)
    fc_mlp:        child Linears fc1, fc2                          CLIPMLP, SiglipMLP, PhiMLP, ViT MLPs ...
                   or dense_h_to_4h, dense_4h_to_h                 GPTNeoXMLP, FalconMLP
                   (-> MLP(names=...): the Linears keep their names, so their state_dict keys)
    moe_block:     a router child (gate / router) and an `experts` child holding stacked (E, ., .) expert
                   weights                                         Mixtral, Qwen2-MoE, Qwen3-MoE sparse blocks
                   (recognised and left alone, with the reason: a grouped-GEMM expert MLP is not part of
                   kernel_pytorch yet; its other children, Qwen2-MoE's gated shared_expert, are looked at
                   on their own)

The activation is the module's torch or transformers activation module (GELU, GELU-tanh, SiLU), else
its `config.hidden_act`
(`GatedMLP.from_module`, `MLP.from_module`); one we do not run (relu2, quick_gelu, ...) leaves the
module alone, with the reason. A probe input then checks that the replacement computes what the
module computes, so a module with these names and another forward is left alone too.

The replacement holds the module's own Linear `Parameter` objects under the same names, so
`state_dict` keys (`...mlp.gate_proj.weight`), dtype, device and optimizer state are unchanged. Modules
whose state would not carry over (extra parameters or buffers, hooks on them or their projections,
Linear subclasses with their own forward, dropout) are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from kernel_pytorch import nn as kp_nn
from kernel_pytorch.nn.mlp import LINEAR_NAMES, multipliers_repr
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import probe_input, projections_left_alone, run_probe, same_output

_GATED = ("gate_proj", "up_proj", "down_proj")
_PACKED = ("gate_up_proj", "down_proj")


def _linears(module: nn.Module, names: tuple[str, ...]) -> dict[str, nn.Linear] | None:
    """module's children `names` when every one is a torch.nn.Linear, else None (not this kind)."""
    found = {n: getattr(module, n, None) for n in names}
    if not all(isinstance(m, nn.Linear) for m in found.values()):
        return None
    return found  # type: ignore[return-value]


def _left_alone(module: nn.Module, projs: dict[str, nn.Linear]) -> str | None:
    """Why `module` cannot be rebuilt around its projections' parameters without losing something."""
    if (why := projections_left_alone(module, projs)) is not None:
        return why
    for name, child in module.named_children():
        if name in projs:
            continue
        if next(child.parameters(), None) is not None or next(child.buffers(), None) is not None:
            return f"child {name} ({type(child).__name__}) holds parameters or buffers the replacement would drop"
        if any(isinstance(m, nn.Dropout) and m.p > 0 for m in child.modules()):
            return f"child {name} is a dropout (p > 0), which the replacement does not apply"
    return None


def _swap(module: nn.Module, projs: dict[str, nn.Linear], build: Callable[[nn.Module], nn.Module],
          target: str) -> Match:
    """The Match for a module of the rule's kind: `build(module)` checked for keys and on a probe."""
    kind = type(module).__name__
    if (why := _left_alone(module, projs)) is not None:
        return Match(None, why)
    try:
        new = build(module)
    except (TypeError, ValueError) as exc:
        return Match(None, f"{kind}: {exc}")
    new.train(module.training)
    old_keys, new_keys = list(module.state_dict(keep_vars=True)), list(new.state_dict(keep_vars=True))
    if old_keys != new_keys:
        return Match(None, f"{kind}'s state_dict keys {old_keys} would become {new_keys}")
    first = next(iter(projs.values()))
    x = probe_input(first.in_features, first.weight)
    expected = run_probe(module, x)
    if expected is None:
        return Match(None, f"{kind} does not run on a (..., {first.in_features}) probe input")
    act = getattr(new, "activation", "?")
    if not same_output(expected, run_probe(new, x)):
        return Match(None, f"{kind} computes something other than {target}(activation={act!r}) on a probe input")
    return Match(new, f"{kind} ({act}{multipliers_repr(new)}) -> kernel_pytorch.nn.{target}")


def _gated(module: nn.Module) -> nn.Module:
    """GatedMLP.from_module, reading Gemma 2/3's `config.hidden_activation` where there is no
    `config.hidden_act` (the probe still checks the activation is the module's)."""
    config = getattr(module, "config", None)
    act = getattr(config, "hidden_activation", None)
    if getattr(config, "hidden_act", None) is None and isinstance(act, str):
        return kp_nn.GatedMLP.from_module(module, activation=act)
    return kp_nn.GatedMLP.from_module(module)


class HFGatedMLPRule:
    """An HF-style gated MLP (gate_proj/up_proj/down_proj Linears, any class) -> kernel_pytorch.nn.GatedMLP."""

    name = "hf_gated_mlp"
    family = "mlp"
    projections = _GATED

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if isinstance(module, kp_nn.GatedMLP) or (projs := _linears(module, self.projections)) is None:
            return None
        return _swap(module, projs, _gated, "GatedMLP")


class PackedGatedMLPRule(HFGatedMLPRule):
    """A Phi-3-style packed gated MLP (gate_up_proj/down_proj Linears, any class) -> kernel_pytorch.nn.GatedMLP
    with fuse_gate_up=True, holding the packed Parameter as it is."""

    name = "packed_gated_mlp"
    projections = _PACKED


class FcMLPRule:
    """An fc1 -> activation -> fc2 MLP (any class whose Linears carry one of `kernel_pytorch.nn.mlp.LINEAR_NAMES`:
    fc1/fc2, dense_h_to_4h/dense_4h_to_h) -> kernel_pytorch.nn.MLP holding them under the same names."""

    name = "fc_mlp"
    family = "mlp"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if isinstance(module, kp_nn.MLP):
            return None
        for names in LINEAR_NAMES:
            if (projs := _linears(module, names)) is not None:
                return _swap(module, projs, partial(kp_nn.MLP.from_module, names=names), "MLP")
        return None


class MoEBlockRule:
    """A mixture-of-experts block (router child `gate` or `router`, `experts` holding stacked (E, ., .)
    weights, any class): recognised and left alone, with the reason. The block's other children are still
    offered to the rules (a left-alone module's children are), so a shared expert is swapped on its own."""

    name = "moe_block"
    family = "mlp"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        experts = getattr(module, "experts", None)
        router = next((r for r in (getattr(module, "gate", None), getattr(module, "router", None))
                       if isinstance(r, nn.Module)), None)
        if not isinstance(experts, nn.Module) or router is None:
            return None
        stacked = [p for p in experts.parameters(recurse=False) if p.dim() == 3]
        if not stacked:
            return None  # a ModuleList of expert MLPs: each expert is offered to the MLP rules itself
        top_k = getattr(router, "top_k", getattr(module, "top_k", None))
        routing = f"{stacked[0].shape[0]} experts" + (f", top-{top_k}" if isinstance(top_k, int) else "")
        return Match(None, f"MoE expert block ({routing}; {type(router).__name__}, {type(experts).__name__}): "
                           "a grouped-GEMM expert MLP is not part of kernel_pytorch yet, so the router and the "
                           "experts stay as they are")


MLP_RULES = (HFGatedMLPRule(), PackedGatedMLPRule(), FcMLPRule(), MoEBlockRule())

__all__ = ["MLP_RULES", "FcMLPRule", "HFGatedMLPRule", "MoEBlockRule", "PackedGatedMLPRule"]
