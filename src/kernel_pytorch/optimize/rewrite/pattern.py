"""`Pattern`: one spelling of a hand-written computation, in plain torch, and the call of ours that
replaces it, both as functions `torch.fx.subgraph_rewriter` traces.

A pattern matches a traced forward when the forward calls the same torch functions, methods and
operators with the same constants; its arguments (placeholders) match any value, a number included
(an `eps` written as `self.eps` is traced as its value). Spellings differ in the graph
(`x.pow(2)`, `x ** 2`, `x * x`), so a family lists each spelling it covers as its own pattern.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch.fx


@dataclass(frozen=True)
class Pattern:
    """One spelling and its replacement.

    Attributes:
        name: unique, e.g. "rms_norm.llama.pow.rsqrt.weight_left".
        kind: the analyser's fusion kind it implements ("rms-norm", "gated-act"): its finding names the
            same source line as the rewrite.
        family: the family name of every layer ("norm", "activation"), as `optimize(rewrite=...)` takes it.
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

    @functools.cached_property
    def graph(self) -> torch.fx.Graph:
        """The search function, traced once."""
        return torch.fx.symbolic_trace(self.search).graph

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
        """The names the search graph calls: a graph lacking one cannot match."""
        return frozenset(target_name(n) for n in self.graph.nodes) - {""}


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


def dtype_ok(pattern: Pattern, bound: Mapping[str, Any]) -> bool:
    """For a pattern with a dtype literal: whether it is x's own dtype (known only from example values)."""
    if pattern.dtype is None:
        return True
    x = example(bound.get("x"))
    return isinstance(x, torch.Tensor) and bound.get(pattern.dtype) == x.dtype


__all__ = ["Pattern", "arguments", "dtype_ok", "example", "target_name"]
