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

from collections.abc import Mapping
from typing import Any

from torch import nn

from kernel_pytorch.assistant.components import component
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.estimates import Bandwidth, copy_bandwidth, fmt_bytes, fmt_seconds
from kernel_pytorch.assistant.findings import Finding, Location, skipped
from kernel_pytorch.assistant.fusion.graph import GraphView, Match
from kernel_pytorch.assistant.fusion.kinds import COMPONENT, KINDS, Instance
from kernel_pytorch.assistant.fusion.patterns import find_all
from kernel_pytorch.assistant.locate import definition_location, function_name, model_location, parse_stack

# this many matches of one attention line in one module per call: a Python loop over positions
LOOP_MIN = 4
_COMPILE_FUSES = "torch.compile fuses such elementwise chains itself; the component also fuses the backward"


def analyze_fusion(ctx: AnalysisContext) -> list[Finding]:
    """The fusion opportunities of the component, one finding per pattern, function and fix."""
    if not ctx.eager.ok:  # nothing to trace (and tracing would only log the same error again)
        return [skipped("fusion", "Fusion opportunities not analysed: the model does not run",
                        "The model fails eagerly on its example inputs (see compilation readiness), so there "
                        "is no graph to read")]
    graphs = [g for g in ctx.trace.graphs if g.nodes]
    if not graphs:
        why = "Dynamo captured no graph" if not ctx.trace.graphs else "the captured graphs' nodes could not be read"
        return [skipped("fusion", "Fusion opportunities not analysed: no graph to read",
                        f"{why} (see compilation readiness), so there are no ops to match")]
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
    comp = COMPONENT.get(kind)
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


__all__ = ["LOOP_MIN", "analyze_fusion"]
