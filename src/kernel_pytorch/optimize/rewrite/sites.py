"""Finding and applying rewrites: trace each module's own forward (every child a leaf, so a module's
code is rewritten where it is written), match the patterns, and give the module instance a forward
made from the rewritten graph. Nothing here edits a class: the new forward is an attribute of the
instance, bound to it (its children, parameters and buffers are the module's own, so a later swap of a
child is seen), and a revert deletes it. A module whose instance already holds a forward of its own (a
hook library's wrapper) is not looked at.

A rewrite (`Site`) is one pattern kind at one source line of one module's forward (every match there:
a line in a loop runs several times). Applying a set of sites re-traces each module involved and keeps
only the matches of the sites in the set, so any one can be reverted alone.

A module is traced with `torch.fx.symbolic_trace`'s rules: its forward must not branch on tensor
values, and Python state it reads is frozen at its value when traced. `self.training` is checked: a
module whose traced graph differs between train and eval is left alone.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch.fx
from torch import nn
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.findings import Location
from kernel_pytorch.assistant.locate import model_location, parse_stack
from kernel_pytorch.optimize.report import Rewrite
from kernel_pytorch.optimize.rewrite.pattern import (
    Pattern,
    arguments,
    dtype_ok,
    prepared,
    proven,
    stand_in_calls,
    target_name,
)

# stateless activation modules traced into (`F.silu(x, inplace=False)`), so `self.act_fn(gate) * up`
# reads as the functional spelling the patterns match (hooks on such a module are not called by a
# rewritten forward): torch's, and transformers' ACT2FN classes (SiLUActivation, GELUActivation ...)
_INLINED = (nn.SiLU, nn.GELU, nn.ReLU)
_ACTIVATION_MODULES = "transformers.activations"


def _inlined(m: nn.Module) -> bool:
    if type(m) in _INLINED:
        return True
    stateless = next(m.parameters(), None) is None and next(m.buffers(), None) is None
    return type(m).__module__ == _ACTIVATION_MODULES and stateless and next(m.children(), None) is None


class _OwnCode(torch.fx.Tracer):
    """Traces one module's forward only: every child module is one call_module node, but activations."""

    record_stack_traces = True
    proxy_buffer_attributes = True  # a buffer sliced by a size (`self.bias[:, :, :T, :T]`) is a node, not a constant

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return not _inlined(m)


@dataclass
class Site:
    """One rewrite: pattern `kind` at `location` in the forward of the module at `path`; `record` is
    its report row."""

    path: str
    kind: str
    file: str | None
    line: int | None
    record: Rewrite
    patterns: tuple[Pattern, ...]

    @property
    def key(self) -> tuple[str, str, str | None, int | None]:
        return self.path, self.kind, self.file, self.line


def _ours_or_torch(module: nn.Module) -> bool:
    """Modules whose forward holds no hand-written pattern worth tracing: torch's and our drop-ins
    (our reference models, written in plain torch, are looked at)."""
    name = type(module).__module__
    return name.startswith(("torch.", "kernel_pytorch.")) and not name.startswith("kernel_pytorch.models.")


def _trace(module: nn.Module) -> torch.fx.GraphModule:
    """`module`'s own forward as a graph (its class's forward, whatever the instance holds)."""
    own = module.__dict__.pop("forward", None)
    before = set(vars(module))
    try:
        graph = _OwnCode().trace(module)
        gm = torch.fx.GraphModule(module, graph)  # copies what the graph reads, constants included
    finally:
        for name in set(vars(module)) - before:  # the tracer keeps tensors made in forward on the module
            del module.__dict__[name]
        if own is not None:
            module.__dict__["forward"] = own
    # attribute reads first (they take no inputs): a replacement with several outputs goes where the
    # first of them was, which may precede the read of a weight it takes
    first = next((n for n in graph.nodes if n.op != "placeholder"), None)
    for node in [n for n in graph.nodes if n.op == "get_attr"]:
        if first is not None and node is not first:
            first.prepend(node)
    gm.recompile()
    return gm


def _traced(module: nn.Module) -> tuple[torch.fx.GraphModule | None, str]:
    """(the graph, "") or (None, why not): untraceable, or a graph that depends on `self.training`."""
    try:
        gm = _trace(module)
        was = module.training
        module.training = not was
        try:
            other = _trace(module)
        finally:
            module.training = was
    except Exception as exc:
        return None, f"its forward does not trace with torch.fx ({short_error(exc, 200)})"
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            try:
                functools.reduce(getattr, str(node.target).split("."), module)
            except AttributeError:  # a tensor made in the forward, which the trace keeps as a constant
                return None, f"its forward makes a tensor constant ({node.target}) the module does not hold"
    if gm.code != other.code:
        return None, "its forward differs between train() and eval() (a traced forward would freeze one)"
    return gm, ""


def _location(node: torch.fx.Node, model: nn.Module) -> Location | None:
    return model_location(parse_stack(node.stack_trace), model) if node.stack_trace else None


def _anchor(pattern: Pattern, match: InternalMatch) -> torch.fx.Node | None:
    for pn, gn in match.nodes_map.items():
        if isinstance(gn, torch.fx.Node) and pn.name == pattern.anchor and pn.op != "placeholder":
            return gn
    return None


def _weight_ok(pattern: Pattern, match: InternalMatch, module: nn.Module) -> bool:
    """A norm's weight or an activation's bias must be a 1-D parameter or buffer of the module: a traced
    graph has no shapes, and a residual `relu(x + y)` reads as a bias add otherwise."""
    if pattern.weight is None:
        return True
    node = arguments(match).get(pattern.weight)
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return False
    try:
        value = functools.reduce(getattr, str(node.target).split("."), module)
    except AttributeError:
        return False
    return isinstance(value, torch.Tensor) and value.dim() == 1


_Key = tuple[str, "str | None", "int | None"]  # (kind, file, line)


def _rewrite(gm: torch.fx.GraphModule, module: nn.Module, model: nn.Module, patterns: Sequence[Pattern],
             accept: set[_Key] | None, found: dict[_Key, tuple[Pattern, Location | None, int, str]]) -> None:
    """Rewrite `gm`, `module`'s traced forward, with `patterns`, keeping the matches whose (kind, file,
    line) is in `accept` (None: all), each counted in `found`."""
    names = {target_name(n) for n in gm.graph.nodes} | stand_in_calls(gm)
    for p in patterns:
        if not p.calls <= names:
            continue

        def keep(match: InternalMatch, original: torch.fx.Graph, pattern_graph: torch.fx.Graph,
                 p: Pattern = p) -> bool:
            anchor = _anchor(p, match)
            loc = _location(anchor, model) if anchor is not None else None
            key = (p.kind, loc.file if loc else None, loc.line if loc else None)
            if (accept is not None and key not in accept) or not _weight_ok(p, match, module):
                return False
            if not (dtype_ok(p, arguments(match)) and proven(p, arguments(match))):
                return False
            _, _, n, _ = found.get(key, (p, loc, 0, ""))
            found[key] = (p, loc, n + 1, p.note(arguments(match)) if p.note else "")
            return True

        with prepared(gm, p):
            replace_pattern_with_filters(gm, p.graph, p.replacement, [keep])
    for finish in dict.fromkeys(p.finish for p in patterns if p.finish is not None):
        finish(gm, False)
    gm.recompile()


def plan(model: nn.Module, patterns: Sequence[Pattern]) -> tuple[list[Site], list[str]]:
    """(the rewrites `patterns` find in `model`, notes on what could not be looked at). Changes nothing:
    every rewrite starts "applied" in its record but is installed by `apply`."""
    sites: list[Site] = []
    notes: list[str] = []
    seen: set[int] = set()
    for path, module in model.named_modules():
        if id(module) in seen or _ours_or_torch(module):
            continue
        seen.add(id(module))
        if "forward" in vars(module):  # someone's instance forward (a hook library's wrapper): kept as it is
            if not path:
                notes.append("rewrite: the model's own forward not looked at: the instance holds a forward of "
                             "its own (a wrapper's), which a rewrite would replace")
            continue
        found: dict[_Key, tuple[Pattern, Location | None, int, str]] = {}
        gm, why = _traced(module)
        if gm is None:
            if not path:  # the model's own forward; submodules that do not trace are many and quiet
                notes.append(f"rewrite: the model's own forward ({type(module).__name__}) not looked at: {why}")
            continue
        _rewrite(gm, module, model, patterns, None, found)
        for (kind, file, line), (p, loc, n, note) in found.items():
            where = str(loc) if loc else "(no source line)"
            record = Rewrite(path, kind, p.family, type(module).__name__, p.what + note, where, n, "applied",
                             f"{kind} -> {p.what}{note}")
            sites.append(Site(path, kind, file, line, record, tuple(patterns)))
    return sites, notes


def _sync(model: nn.Module, paths: Iterable[str], sites: Sequence[Site]) -> None:
    """Give each module at `paths` the forward holding its sites whose record says "applied" (none: its
    class's forward)."""
    for path in dict.fromkeys(paths):
        module = model.get_submodule(path)
        active = [s for s in sites if s.path == path and s.record.status == "applied"]
        module.__dict__.pop("forward", None)
        if not active:
            continue
        gm, _ = _traced(module)
        if gm is not None:  # traced in `plan`; a module that stopped tracing keeps its own forward
            _rewrite(gm, module, model, active[0].patterns, {s.key[1:] for s in active}, {})
            module.forward = types.MethodType(type(gm).forward, module)


def apply(model: nn.Module, sites: Sequence[Site], every: Sequence[Site]) -> None:
    """Mark `sites` applied and install them beside the applied ones among `every` (all planned)."""
    for s in sites:
        s.record.status, s.record.detail = "applied", ""
    _sync(model, [s.path for s in sites], every)


def revert(model: nn.Module, sites: Sequence[Site], every: Sequence[Site], detail: str) -> None:
    """Mark `sites` reverted (with `detail`, the reason) and take them out of the model; the other
    applied sites of `every` in the same modules stay."""
    for s in sites:
        s.record.status, s.record.detail = "reverted", detail
    _sync(model, [s.path for s in sites], every)


__all__ = ["Site", "apply", "plan", "revert"]
