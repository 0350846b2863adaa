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
all their keywords, defaults written out, in the graph it is matched on (Dynamo's `linear(h, W, None)`
of a Linear without bias as `linear(h, W)`).

A child module is one node of a traced forward (`self.lm_head(h)`); the modules a pattern reads in their
functional form (`Pattern.modules`: an `nn.Linear` without bias as `F.linear(h, lm_head.weight)`, an
`nn.Dropout` as `F.dropout`) are matched as that form and put back where no match took them.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch.fx
import torch.nn.functional as F
from torch import nn
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
        modules: child module types the search reads in their functional form (`STAND_INS`).
        numbers: search arguments that must be Python numbers (a literal, or computed from sizes), not tensors.
        note: on a match's bound arguments (graph nodes, literals), words the report adds to `what` ("": none).
        finish: a step on the whole graph after the replacements, (graph, compiled graph?) -> how many
            replacements it changed (the attention's causal mask: `causal.carry_causal`).
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
    modules: tuple[type[nn.Module], ...] = ()
    numbers: tuple[str, ...] = ()
    note: Callable[[Mapping[str, Any]], str] | None = None
    finish: Callable[[torch.fx.GraphModule, bool], int] | None = None

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
    """`pattern.proof` on a match's bound arguments (True for a pattern without one), and its `numbers`
    numbers."""
    if not all(is_number(bound.get(name)) for name in pattern.numbers):
        return False
    return pattern.proof is None or pattern.proof({k: example(v) for k, v in bound.items()})


# what a number computed from sizes is made of in a graph without example values (`q.size(-1) ** -0.5`)
_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.pow,
               operator.neg, operator.getitem, math.sqrt, builtins.float, builtins.int, builtins.getattr}


def is_number(value: Any) -> bool:
    """Whether a bound argument is a Python number: a literal int or float, a node whose example value is
    one, or (no example values) a node computed only from `size()` / `.shape` reads and literals."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float, torch.SymInt, torch.SymFloat)):
        return True
    if not isinstance(value, torch.fx.Node):
        return isinstance(value, (tuple, torch.Size)) and all(is_number(v) for v in value)
    known = example(value)
    if known is not None:
        return is_number(known) and not isinstance(known, (tuple, torch.Size))
    return _sized(value)


def _sized(node: Any) -> bool:
    """A value (no example values) computed only from sizes and literals."""
    if not isinstance(node, torch.fx.Node):
        return isinstance(node, (int, float, str, tuple)) and not isinstance(node, bool)
    if node.op == "call_method" and node.target == "size":
        return True
    if node.op == "call_function" and node.target is builtins.getattr:
        return node.args[1:] == ("shape",)
    if node.op != "call_function" or node.target not in _ARITHMETIC:
        return False
    return all(_sized(a) for a in node.args)


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


# functions symbolic tracing records with their first argument alone positional
_FIRST_POSITIONAL = (F.dropout,)


def _all_keywords(graph: torch.fx.Graph, functions: tuple[Callable[..., Any], ...]) -> None:
    """Calls of `functions` with every keyword after the tensors, as symbolic tracing records them."""
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in functions:
            continue
        if node.target is F.linear:  # Dynamo's form of a Linear without bias: linear(h, W, None)
            if len(node.args) == 3 and node.args[2] is None and not node.kwargs:
                node.args = node.args[:2]
            continue
        if node.target in _FIRST_POSITIONAL:
            normal = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
            if normal is not None:
                kwargs = dict(normal.kwargs)
                node.args, node.kwargs = (kwargs.pop("input"),), kwargs
            continue
        normal = normalize_function(node.target, node.args, node.kwargs)
        if normal is not None:  # None: a signature it cannot bind, left as it is
            node.args, node.kwargs = tuple(normal.args), dict(normal.kwargs)


def _stand_in(module: nn.Module) -> tuple[Callable[..., Any], str | None, dict[str, Any]] | None:
    """(function, the weight it reads or None, its keywords): a module's functional form; None: none."""
    if type(module) is nn.Linear and module.bias is None:
        return F.linear, "weight", {}
    if type(module) is nn.Dropout:
        # training=True: a traced forward serves both modes, so only p == 0 is the identity in both
        return F.dropout, None, {"p": module.p, "training": True, "inplace": module.inplace}
    return None


STAND_INS = (nn.Linear, nn.Dropout)
_STAND_IN = "kernel_pytorch_stand_in"  # node.meta key: the module call a functional node stands for


def _modules_as_functions(gm: torch.fx.GraphModule, types: tuple[type[nn.Module], ...]) -> None:
    """Each call of a child module of `types` (one tensor argument) as its functional form."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        try:
            module = gm.get_submodule(str(node.target))
        except AttributeError:
            continue
        form = _stand_in(module) if isinstance(module, types) else None
        if form is None:
            continue
        fn, weight, kwargs = form
        with graph.inserting_before(node):
            args = (node.args[0], graph.get_attr(f"{node.target}.{weight}")) if weight else node.args
            new = graph.call_function(fn, args, kwargs)
        new.meta = {**node.meta, _STAND_IN: str(node.target)}
        node.replace_all_uses_with(new)
        graph.erase_node(node)


def _functions_as_modules(gm: torch.fx.GraphModule) -> None:
    """`_modules_as_functions` undone where no match took the functional form."""
    graph = gm.graph
    for node in list(graph.nodes):
        target = node.meta.get(_STAND_IN)
        if target is None or node.op != "call_function":
            continue
        with graph.inserting_before(node):
            call = graph.call_module(target, (node.args[0],))
        call.meta = {k: v for k, v in node.meta.items() if k != _STAND_IN}
        node.replace_all_uses_with(call)
        weight = node.args[1] if len(node.args) > 1 else None
        graph.erase_node(node)
        if isinstance(weight, torch.fx.Node) and not weight.users:
            graph.erase_node(weight)


def stand_in_calls(gm: torch.fx.GraphModule) -> set[str]:
    """The function names `gm`'s child module calls read as (`_stand_in`), for `Pattern.calls` checks."""
    names = set()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            try:
                form = _stand_in(gm.get_submodule(str(node.target)))
            except AttributeError:
                continue
            if form is not None:
                names.add(form[0].__name__)
    return names


@contextlib.contextmanager
def prepared(gm: torch.fx.GraphModule, pattern: Pattern) -> Iterator[None]:
    """`gm` in the form `pattern` is matched on while it is: slices as nodes (literals again after), the
    keywords of `pattern.keywords`' calls written out (the same calls: kept), child modules of
    `pattern.modules` as their functional form (module calls again where no match took them)."""
    _all_keywords(gm.graph, pattern.keywords)
    if pattern.modules:
        _modules_as_functions(gm, pattern.modules)
        _all_keywords(gm.graph, pattern.keywords)
    if pattern.slices:
        _slices_as_nodes(gm.graph)
    try:
        yield
    finally:
        if pattern.slices:
            _slices_as_literals(gm.graph)
        if pattern.modules:
            _functions_as_modules(gm)


def dtype_ok(pattern: Pattern, bound: Mapping[str, Any]) -> bool:
    """For a pattern with a dtype literal: whether it is x's own dtype (known only from example values)."""
    if pattern.dtype is None:
        return True
    x = example(bound.get("x"))
    return isinstance(x, torch.Tensor) and bound.get(pattern.dtype) == x.dtype


__all__ = ["STAND_INS", "Pattern", "arguments", "dtype_ok", "example", "is_number", "prepared", "proven",
           "stand_in_calls", "target_name"]
