"""Fusion opportunities: the patterns kernel_pytorch's components implement, found in the captured graphs.

Every match of `patterns` in the graphs of the Dynamo trace is located at the user's source line
(the node's stack), in its function, and its module (the node's module path). Matches of one pattern
in one function with one fix are one cause: one finding, with every line and every module they occur
in (RoPE on q and on k, the two residual adds of a decoder layer). Each says what the pattern costs
in eager mode for the example shapes (ops, kernels, bytes read and written), what the fused
replacement moves, and the time the difference is worth at the copy bandwidth of
`estimates.copy_bandwidth` (measured on this device when cached, else a datasheet or assumed figure,
named as such). The suggestion names the component that fixes it, through `components`, so it says
"(in development)" until that component exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from kernel_pytorch.assistant.components import component
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.estimates import Bandwidth, copy_bandwidth, fmt_bytes, fmt_seconds
from kernel_pytorch.assistant.findings import Finding, Location, Severity
from kernel_pytorch.assistant.fusion.graph import LARGE_VOCAB, GraphView, Match
from kernel_pytorch.assistant.fusion.patterns import find_all
from kernel_pytorch.assistant.locate import definition_location, function_name, model_location, parse_stack

# this many matches of one attention line in one module per call: a Python loop over positions
LOOP_MIN = 4
_COMPILE_FUSES = "torch.compile fuses such elementwise chains itself; the component also fuses the backward"


@dataclass(frozen=True)
class Instance:
    """One match, located: its function (as the source names it, else its module's class), its
    module and what it costs (eager) against the fused replacement."""

    match: Match
    location: Location | None
    function: str
    module_path: str
    module_type: str
    ops: int
    kernels: int
    bytes_today: int
    bytes_saved: int

    @property
    def kernels_saved(self) -> int:
        return max(0, self.kernels - self.match.fused_kernels)


def analyze_fusion(ctx: AnalysisContext) -> list[Finding]:
    """The fusion opportunities of the component, one finding per pattern, function and fix."""
    if not ctx.eager.ok:  # nothing to trace (and tracing would only log the same error again)
        return [
            Finding(
                id="fusion.skipped",
                severity=Severity.INFO,
                title="Fusion opportunities not analysed: the model does not run",
                evidence="The model fails eagerly on its example inputs (see compilation readiness), so there "
                "is no graph to read",
            )
        ]
    graphs = [g for g in ctx.trace.graphs if g.nodes]
    if not graphs:
        why = "Dynamo captured no graph" if not ctx.trace.graphs else "the captured graphs' nodes could not be read"
        return [
            Finding(
                id="fusion.skipped",
                severity=Severity.INFO,
                title="Fusion opportunities not analysed: no graph to read",
                evidence=f"{why} (see compilation readiness), so there are no ops to match",
            )
        ]
    modules = dict(ctx.module.named_modules())
    instances = [_instance(GraphView(g), m, ctx.module, modules) for g in graphs for m in find_all(GraphView(g))]
    groups: dict[tuple[Any, ...], list[Instance]] = {}
    for inst in instances:
        file = inst.location.file if inst.location else None
        key = (inst.match.kind, file, inst.function, KINDS[inst.match.kind].fix(inst))
        groups.setdefault(key, []).append(inst)
    bandwidth = copy_bandwidth(ctx.device)
    return [_finding(group, bandwidth) for group in groups.values()]


def _instance(g: GraphView, m: Match, model: nn.Module, modules: Mapping[str, nn.Module]) -> Instance:
    anchor = g[m.anchor]
    location = model_location(parse_stack(anchor.stack), model) if anchor.stack else None
    path = anchor.module_path or ""
    if path not in modules:  # a frame resumed inside a submodule names paths from that submodule
        path = next((name for name in modules if name.endswith("." + path)), path)
    module = modules.get(path, model)
    if location is None:
        location = definition_location(module)
    module_type = anchor.module_type or type(module).__name__
    function = (function_name(location) if location else None) or module_type
    ops, kernels, today = g.cost(m.nodes)
    saved = m.saved_bytes if m.saved_bytes is not None else max(0, today - m.fused_bytes)
    return Instance(m, location, function, path, module_type, ops, kernels, today, saved)


# ----- one finding per pattern, function and fix --------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    title: Callable[[Instance, int], str]
    today: Callable[[Instance], str]
    fix: Callable[[Instance], str]
    severity: Severity = Severity.INFO
    compiles_away: bool = False  # Inductor fuses it under torch.compile (elementwise chains)


def _loop(group: list[Instance]) -> bool:
    """Whether one line runs LOOP_MIN or more times per module: a Python loop, not several calls."""
    lines: dict[Any, list[Instance]] = {}
    for i in group:
        lines.setdefault(i.location.line if i.location else None, []).append(i)
    return any(len(same) >= LOOP_MIN * len({i.module_path for i in same}) for same in lines.values())


def _finding(group: list[Instance], bandwidth: Bandwidth) -> Finding:
    first = group[0]
    kind = first.match.kind
    paths = list(dict.fromkeys(i.module_path for i in group))
    lines: dict[tuple[str, int], Location] = {}
    for i in group:
        if i.location is not None:
            lines.setdefault((i.location.file, i.location.line), i.location)
    places = list(lines.values())
    if kind == "attention" and _loop(group):
        kind = "attention-loop"
    spec = KINDS[kind]
    ops, kernels = sum(i.ops for i in group), sum(i.kernels for i in group)
    today, saved = sum(i.bytes_today for i in group), sum(i.bytes_saved for i in group)
    kernels_saved = sum(i.kernels_saved for i in group)
    seconds = bandwidth.seconds(saved)
    where = ", ".join(f"`{p or '(the model)'}`" for p in paths[:6]) + (
        f" and {len(paths) - 6} more" if len(paths) > 6 else ""
    )
    times = f" {len(group)} times" if len(group) > 1 else ""
    run = f"its {len(places)} lines run" if len(places) > 1 else "this line runs"
    evidence = (
        f"{spec.today(first)}. Per forward, for the example shapes, {run}{times}: {ops} ops in "
        f"{kernels} eager kernels reading and writing {fmt_bytes(today)}; fused, {fmt_bytes(max(0, today - saved))}. "
        f"In {where}."
    )
    if spec.compiles_away:
        evidence += f" ({_COMPILE_FUSES}.)"
    fewer = f" and {kernels_saved} fewer kernel launches" if kernels_saved else ""
    gain = (
        f"about {fmt_bytes(saved)} less memory traffic{fewer} per forward, {fmt_seconds(seconds)} at "
        f"{bandwidth.label} (estimated from the example shapes, not measured)"
    )
    comp = _COMPONENT.get(kind)
    if kind == "gated-act":
        comp = "swiglu" if first.match.details.get("act") == "silu" else "geglu"
    return Finding(
        id=f"fusion.{kind}",
        severity=spec.severity,
        title=spec.title(first, len(group)),
        evidence=evidence,
        location=places[0] if places else None,
        more_locations=tuple(places[1:]),
        suggestion=spec.fix(first),
        estimated_gain=gain,
        data={
            "kind": kind,
            "count": len(group),
            "function": first.function,
            "modules": paths,
            "module_type": first.module_type,
            "ops": ops,
            "kernels": kernels,
            "kernels_saved": kernels_saved,
            "bytes_today": today,
            "bytes_saved": saved,
            "seconds_saved": seconds,
            "bandwidth_gbps": bandwidth.gbps,
            "bandwidth_source": bandwidth.source,
            "measured": False,
            "component": comp,
            "component_available": component(comp).available if comp else None,
            "details": dict(first.match.details),
            **({"fix": _SHARED_FIX[kind]} if kind in _SHARED_FIX else {}),
        },
    )


# fixes another analysis measures on this device (`sdpa`: the attention call with and without it),
# by the key both findings carry in `data["fix"]`
_SHARED_FIX = {"gqa-repeat": "sdpa.enable_gqa"}


def _shape(shape: Any) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")" if shape else "?"


def _in(inst: Instance) -> str:
    return f"in `{inst.function}`"


def _many(n: int) -> str:
    return f" ({n} places)" if n > 1 else ""


def _rms_fix(inst: Instance) -> str:
    d = inst.match.details
    eps = f", eps={d['eps']}" if d.get("eps") is not None else ""
    rms, affine = component("rms_norm"), "" if d.get("weighted") else ", elementwise_affine=False"
    new = (
        f"{rms.short}({d['hidden']}{eps}{affine})" if rms.available else f"torch.nn.RMSNorm({d['hidden']}{eps}{affine})"
    )
    return (
        f"Replace each `{inst.module_type}` with `{new}` (the same `weight`: "
        f"`new.load_state_dict(old.state_dict())`); {rms.named()} runs it as one kernel, forward and backward. "
        "Inline code: `torch.nn.functional.rms_norm(x, (D,), weight, eps)`."
    )


def _ln_fix(inst: Instance) -> str:
    d, ln = inst.match.details, component("layer_norm")
    new = f"{ln.short}({d['hidden']})" if ln.available else f"torch.nn.LayerNorm({d['hidden']})"
    return (
        f"Replace the handwritten norm with `{new}` (weight and bias copied) or call "
        f"`torch.nn.functional.layer_norm(x, (D,), weight, bias, eps)`; {ln.named()} fuses it, forward and backward."
    )


def _pending(key: str, today: str) -> str:
    """The fix naming component `key`: its call when it exists, else what works meanwhile."""
    comp = component(key)
    if comp.available:
        return f"{comp.named()}: `{comp.short}`."
    return f"{today}; {comp.named()} will do it in one kernel."


def _rope_fix() -> str:
    comp = component("rope")
    if not comp.available:
        return _pending("rope", "`model = torch.compile(model)` fuses the chain today")
    return (f"`q, k = kp.functional.apply_rotary(q, k, cos, sin)` rotates q and k in one kernel, forward and "
            f"backward, from the same cos/sin ({comp.named()} makes them).")


def _act_fix(inst: Instance) -> str:
    act = inst.match.details.get("act")
    key = "swiglu" if act == "silu" else "geglu"
    comp = component(key)
    if comp.available:
        mlp = component("gated_mlp").short
        return f"`{comp.short}(gate, up)` in place of `{act}(gate) * up` (or `{mlp}.from_module(mlp)`)."
    return (
        f"`model = torch.compile(model)` fuses `{act}(gate) * up` today; {comp.named()} also recomputes "
        f"{act} in the backward instead of saving it ({component('gated_mlp').named()} wraps the whole MLP)."
    )


def _attention_fix(inst: Instance) -> str:
    d = inst.match.details
    mask = ", attn_mask=mask" if d.get("masked") else ""
    scale = ", scale=scale" if d.get("scaled") else ""
    return (
        f"`out = torch.nn.functional.scaled_dot_product_attention(q, k, v{mask}{scale})` (`is_causal=True` in "
        f"place of a causal mask) never materialises the scores; {component('attention').named()} wraps it."
    )


def _loop_fix(inst: Instance) -> str:
    return (
        "Attend for every position at once: `out = torch.nn.functional.scaled_dot_product_attention(q, k, v, "
        f"is_causal=True)` over the whole sequence, in one call instead of one per position; "
        f"{component('attention').named()} does this with a static KV cache for decoding."
    )


def _ce_fix(inst: Instance) -> str:
    comp = component("linear_cross_entropy")
    if comp.available:
        return f"`loss = {comp.short}()(hidden, lm_head.weight, targets)` computes the loss without the logits."
    return (
        f"{comp.named()} computes the loss chunk by chunk without ever holding the logits; meanwhile "
        "`torch.compile` of the loss fuses the fp32 cast and the softmax but still writes the logits."
    )


def _bias_fix(inst: Instance) -> str:
    act = inst.match.details.get("act")
    if inst.match.details.get("linear_without_bias"):
        return (
            f"Give the Linear its bias (`nn.Linear(in_features, out_features, bias=True)`): the GEMM adds it in "
            f"its epilogue and `{act}` runs alone; {component('bias_act').named()} fuses bias and {act} too."
        )
    return _pending("bias_act", f"`model = torch.compile(model)` fuses the bias add into `{act}` today")


_COMPONENT = {
    "rms-norm": "rms_norm",
    "layer-norm": "layer_norm",
    "rope": "rope",
    "attention": "attention",
    "attention-loop": "attention",
    "gqa-repeat": "attention",
    "residual-norm": "add_rms_norm",
    "bias-act": "bias_act",
    "linear-cross-entropy": "linear_cross_entropy",
}

KINDS: dict[str, _Kind] = {
    "rms-norm": _Kind(
        lambda i, n: f"Handwritten RMSNorm {_in(i)}{_many(n)}: one fused kernel does its {i.kernels} kernels",
        lambda i: f"mean of squares, rsqrt and scale written out over the last dim ({i.match.details['hidden']})",
        _rms_fix,
        compiles_away=True,
    ),
    "layer-norm": _Kind(
        lambda i, n: f"Handwritten LayerNorm {_in(i)}{_many(n)}: one fused kernel does its {i.kernels} kernels",
        lambda i: f"mean, variance and normalisation written out over the last dim ({i.match.details['hidden']})",
        _ln_fix,
        compiles_away=True,
    ),
    "gated-act": _Kind(
        lambda i, n: f"`{i.match.details['act']}(gate) * up` {_in(i)}{_many(n)}: a gated MLP in two kernels",
        lambda i: (
            f"the activation's output {_shape(i.match.details.get('shape'))} is written, then read back by the multiply"
        ),
        _act_fix,
        compiles_away=True,
    ),
    "rope": _Kind(
        lambda i, n: f"Rotate-half rotary embedding {_in(i)}{_many(n)}: {i.kernels} kernels per tensor",
        lambda i: (
            f"`x * cos + rotate_half(x) * sin` on x {_shape(i.match.details.get('shape'))}: a negated "
            "copy, a concatenation, two multiplies and an add"
        ),
        lambda i: _rope_fix(),
        compiles_away=True,
    ),
    "attention": _Kind(
        lambda i, n: (
            f"Attention written out {_in(i)}{_many(n)}: the scores "
            f"{_shape(i.match.details.get('scores'))} are materialised"
        ),
        lambda i: (
            "`softmax(q @ k.T"
            + (" scaled" if i.match.details.get("scaled") else "")
            + (" + mask" if i.match.details.get("masked") else "")
            + ") @ v` writes and reads the full score matrix"
        ),
        _attention_fix,
        severity=Severity.WARNING,
    ),
    "attention-loop": _Kind(
        lambda i, n: f"Attention computed one position at a time {_in(i)} ({n} iterations per forward)",
        lambda i: (
            f"the same `softmax(q @ k.T) @ v` runs once per position (scores {_shape(i.match.details.get('scores'))} "
            "each), a Python loop Dynamo unrolls into one small subgraph per position"
        ),
        _loop_fix,
        severity=Severity.WARNING,
    ),
    "gqa-repeat": _Kind(
        lambda i, n: f"K/V repeated x{i.match.details['n_rep']} to the query's head count {_in(i)}{_many(n)}",
        lambda i: (
            f"grouped-query attention copies K and V {_shape(i.match.details.get('kv_shape'))} to "
            f"{i.match.details['n_rep']}x the heads, and attention then reads every copy"
        ),
        lambda i: (
            "Pass the un-repeated K and V with `torch.nn.functional.scaled_dot_product_attention(q, k, v, "
            f"enable_gqa=True)` (torch >= 2.5); {component('attention').named()} does GQA without the copy."
        ),
    ),
    "residual-norm": _Kind(
        lambda i, n: f"Residual add followed by an RMSNorm {_in(i)}{_many(n)}",
        lambda i: "the sum is written, then read back by the norm",
        lambda i: (
            f"`hidden, residual = {component('add_rms_norm').short}({i.match.details['hidden']}"
            + (f", eps={i.match.details['eps']}" if i.match.details.get("eps") is not None else "")
            + f")(hidden, residual)` in place of the add and the norm ({component('add_rms_norm').named()}; "
            "same `weight` as the norm it replaces)."
        ),
        compiles_away=True,
    ),
    "bias-act": _Kind(
        lambda i, n: f"Bias added before `{i.match.details['act']}` {_in(i)}{_many(n)}: two passes for one",
        lambda i: (
            f"`{i.match.details['act']}(x + bias)` on x {_shape(i.match.details.get('shape'))} writes the "
            "sum, then reads it back"
        ),
        _bias_fix,
        compiles_away=True,
    ),
    "linear-cross-entropy": _Kind(
        lambda i, n: f"Logits over a {i.match.details['vocab']}-word vocabulary materialised for the loss {_in(i)}",
        lambda i: (
            f"the ({i.match.details['tokens']}, {i.match.details['vocab']}) logits "
            f"({fmt_bytes(i.match.details['logits_bytes'])}) are written, cast and read by cross-entropy (vocabularies "
            f"from {LARGE_VOCAB} words up are worth never materialising)"
        ),
        _ce_fix,
        severity=Severity.WARNING,
    ),
}


__all__ = ["KINDS", "LOOP_MIN", "analyze_fusion"]
