"""`Pattern`: one spelling of a hand-written computation, in plain torch, and the call of ours that
replaces it, both as functions `torch.fx.subgraph_rewriter` traces.

A pattern matches a traced forward when the forward calls the same torch functions, methods and
operators with the same constants; its arguments (placeholders) match any value, a number included
(an `eps` written as `self.eps` is traced as its value). Spellings differ in the graph
(`x.pow(2)`, `x ** 2`, `x * x`), so a family lists each spelling it covers as its own pattern.

Slices (`x[..., :half]`) are literals to the matcher, compared by value, so one holding a node (a split
point computed from `x.shape`) or a pattern argument never matches: a pattern that indexes with slices
(`Pattern.slices`) is matched on a graph whose slices are nodes of their own (`prepared`), put back
after. Keywords are compared by name, and Dynamo records only those a call wrote where symbolic tracing
records every one (`F.cross_entropy`): a pattern's such functions (`Pattern.keywords`) are called with
all their keywords, defaults written out, in the graph it is matched on.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch.fx
from torch.fx.operator_schemas import normalize_function


@dataclass(frozen=True)
class Pattern:
    """One spelling and its replacement.

    Attributes:
        name: unique, e.g. "rms_norm.llama.pow.rsqrt.weight_left".
        kind: the analyser's fusion kind it implements ("rms-norm", "gated-act"): its finding names the
            same source line as the rewrite.
        family: the family name of every layer ("norm", "activation", "rope", "cross_entropy"), as
            `optimize(rewrite=...)` takes it.
        search: the plain-torch spelling, a function of the pattern's inputs.
        replace: the same inputs to our call (a function `torch.fx.wrap` keeps as one node).
        anchor: the name of the search graph's node that locates a match, the analyser's anchor (`mean`
            for a norm, `add` for the residual add before one, `mul` for a gated activation's multiply).
        weight: the search argument that must be a 1-D parameter or buffer of the module in a graph
            without shapes (a norm's weight, an activation's bias); None: no such argument.
        what: the report's words for the replacement.
        op: the replacement as the registered op itself, for graphs torch.compile traces on (the
            functional layer picks its path in eager Python, which a compiled graph has left).
        fits: on the example values of the search arguments (a compiled graph's node metadata), whether
            the op takes them (shapes, dtypes); in a graph without example values validation judges.
        dtype: the search argument that is a dtype literal (`.to(torch.bfloat16)`, as Dynamo folds
            `.to(x.dtype)`): matched only where it is x's own dtype, read from the example values.
        proof: on the bound arguments (literals as themselves, nodes as their example values, None in a
            graph without them), whether a match is the computation the replacement does; checked in every
            graph (a split point Dynamo folded to a literal is proven only by the example shapes, so such a
            pattern matches only in a compiled graph). None: the structure is the proof.
        slices: the search indexes with slices (matched on a graph whose slices are nodes: `prepared`).
        keywords: functions the search calls with every keyword: their calls in a graph get theirs too.
    """

    name: str
    kind: str
    family: str
    search: Callable[..., Any]
    replace: Callable[..., Any]
    op: Callable[..., Any]
    anchor: str
    what: str
    fits: Callable[[Mapping[str, Any]], bool]
    weight: str | None = None
    dtype: str | None = None
    proof: Callable[[Mapping[str, Any]], bool] | None = None
    slices: bool = False
    keywords: tuple[Callable[..., Any], ...] = ()

    @functools.cached_property
    def graph(self) -> torch.fx.Graph:
        """The search function, traced once (its slices as nodes where `slices`)."""
        graph = torch.fx.symbolic_trace(self.search).graph
        if self.slices:
            _slices_as_nodes(graph)
        return graph

    @functools.cached_property
    def replacement(self) -> torch.fx.Graph:
        """The replacement function, traced once (our call is one node: `torch.fx.wrap`)."""
        return torch.fx.symbolic_trace(self.replace).graph

    @functools.cached_property
    def op_replacement(self) -> torch.fx.Graph:
        """The registered-op replacement, traced once (the ops must be registered: `kernels_ready()`)."""
        return torch.fx.symbolic_trace(self.op).graph

    @functools.cached_property
    def calls(self) -> frozenset[str]:
        """The names the search graph calls: a graph lacking one cannot match (slices are not calls)."""
        return frozenset(target_name(n) for n in self.graph.nodes) - {"", "slice"}


def target_name(node: torch.fx.Node) -> str:
    """The name a node calls: a method's name, a function's `__name__`, "" for other nodes."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return ""


def arguments(match: Any) -> dict[str, Any]:
    """The search arguments a match bound (an `InternalMatch`): name -> graph node or literal."""
    return {pn.target: gn for pn, gn in match.nodes_map.items() if pn.op == "placeholder"}


def example(value: Any) -> Any:
    """A bound argument's example value: a node's `example_value` (Dynamo) or `val` (after it) metadata,
    a literal as itself; None for a node without one (a graph `torch.fx.symbolic_trace` made)."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("example_value", value.meta.get("val"))
    return value


def proven(pattern: Pattern, bound: Mapping[str, Any]) -> bool:
    """`pattern.proof` on a match's bound arguments (True for a pattern without one)."""
    return pattern.proof is None or pattern.proof({k: example(v) for k, v in bound.items()})


def _slices_as_nodes(graph: torch.fx.Graph) -> None:
    """Each slice in a getitem's index becomes a `slice(start, stop, step)` node the matcher walks."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
            continue
        index = node.args[1]
        parts = index if isinstance(index, tuple) else (index,)
        if not any(isinstance(p, slice) for p in parts):
            continue
        with graph.inserting_before(node):
            new = tuple(graph.call_function(builtins.slice, (p.start, p.stop, p.step)) if isinstance(p, slice)
                        else p for p in parts)
        node.args = (node.args[0], new if isinstance(index, tuple) else new[0])


def _slices_as_literals(graph: torch.fx.Graph) -> None:
    """`_slices_as_nodes` undone: each slice node back into the indexes that read it as a literal."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not builtins.slice:
            continue
        value = slice(*node.args)
        for user in list(node.users):
            index = user.args[1]
            parts = index if isinstance(index, tuple) else (index,)
            new = tuple(value if p is node else p for p in parts)
            user.args = (user.args[0], new if isinstance(index, tuple) else new[0])
        graph.erase_node(node)


def _all_keywords(graph: torch.fx.Graph, functions: tuple[Callable[..., Any], ...]) -> None:
    """Calls of `functions` with every keyword after the tensors, as symbolic tracing records them."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in functions:
            continue
        normal = normalize_function(node.target, node.args, node.kwargs)
        if normal is not None:  # None: a signature it cannot bind, left as it is
            node.args, node.kwargs = tuple(normal.args), dict(normal.kwargs)


@contextlib.contextmanager
def prepared(gm: torch.fx.GraphModule, pattern: Pattern) -> Iterator[None]:
    """`gm` in the form `pattern` is matched on while it is: slices as nodes (literals again after), the
    keywords of `pattern.keywords`' calls written out (the same calls: kept)."""
    _all_keywords(gm.graph, pattern.keywords)
    if not pattern.slices:
        yield
        return
    _slices_as_nodes(gm.graph)
    try:
        yield
    finally:
        _slices_as_literals(gm.graph)


def dtype_ok(pattern: Pattern, bound: Mapping[str, Any]) -> bool:
    """For a pattern with a dtype literal: whether it is x's own dtype (known only from example values)."""
    if pattern.dtype is None:
        return True
    x = example(bound.get("x"))
    return isinstance(x, torch.Tensor) and bound.get(pattern.dtype) == x.dtype


__all__ = ["Pattern", "arguments", "dtype_ok", "example", "prepared", "proven", "target_name"]
