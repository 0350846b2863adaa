"""`Pattern`: one spelling of a hand-written computation, in plain torch, and the call of ours that
replaces it, both as functions `torch.fx.subgraph_rewriter` traces.

A pattern matches a traced forward when the forward calls the same torch functions, methods and
operators with the same constants; its arguments (placeholders) match any value, a number included
(an `eps` written as `self.eps` is traced as its value). Spellings differ in the graph
(`x.pow(2)`, `x ** 2`, `x * x`), so a family lists each spelling it covers as its own pattern.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
        anchor: the method or function name of the node that locates a match (the analyser's anchor:
            `mean` for a norm, the final multiply for a gated activation).
        weight: the search argument that must be a 1-D parameter or buffer when it is one (a 2-D
            attribute is no norm weight); None: no such argument.
        what: the report's words for the replacement.
    """

    name: str
    kind: str
    family: str
    search: Callable[..., Any]
    replace: Callable[..., Any]
    anchor: str
    what: str
    weight: str | None = None

    @functools.cached_property
    def graph(self) -> torch.fx.Graph:
        """The search function, traced once."""
        return torch.fx.symbolic_trace(self.search).graph

    @functools.cached_property
    def replacement(self) -> torch.fx.Graph:
        """The replacement function, traced once (our call is one node: `torch.fx.wrap`)."""
        return torch.fx.symbolic_trace(self.replace).graph


def target_name(node: torch.fx.Node) -> str:
    """The name a node calls: a method's name, a function's `__name__`, "" for other nodes."""
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return ""


__all__ = ["Pattern", "target_name"]
