"""A captured FX graph indexed for pattern matching, and what its nodes cost in eager mode.

A `GraphView` indexes one `GraphInfo` (nodes by name, their users, op kinds that merge `torch.mul`,
`operator.mul` and `Tensor.mul` into "mul"); `patterns` finds the `Match`es in it. Costs come
from the nodes' example values: an op that launches a kernel reads each tensor input and writes its
output once; views (a reshape of a contiguous tensor, transpose, slicing, a cast to the same dtype)
launch nothing and move nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel_pytorch.assistant.records import GraphInfo, NodeInfo, NodeRef

# the op kinds of FX targets: torch functions, Tensor methods and operators alike
_KINDS: dict[str, str] = {
    **{t: "mul" for t in ("mul", "mul_", "imul", "multiply")},
    **{t: "add" for t in ("add", "add_", "iadd")},
    **{t: "sub" for t in ("sub", "sub_", "isub", "subtract")},
    **{t: "div" for t in ("truediv", "div", "div_", "itruediv", "divide")},
    **{t: "neg" for t in ("neg", "neg_", "negative")},
    **{t: "pow" for t in ("pow", "pow_", "square")},
    **{t: "matmul" for t in ("matmul", "bmm", "imatmul")},
    **{t: "softmax" for t in ("softmax", "_softmax")},
    **{t: "cat" for t in ("cat", "concat", "concatenate")},
    **{t: "cast" for t in ("to", "float", "half", "bfloat16", "type_as", "type", "double")},
    **{t: "view" for t in ("view", "reshape", "flatten", "unflatten", "view_as", "reshape_as")},
    **{t: "layout" for t in ("transpose", "permute", "t", "unsqueeze", "squeeze", "expand", "expand_as", "detach")},
    "contiguous": "contiguous",
    "getitem": "getitem",
    "chunk": "split",
    "split": "split",
    "unbind": "split",
    "narrow": "layout",
    "gelu": "gelu",
    "silu": "silu",
    "relu": "relu",
    "relu_": "relu",
    "masked_fill_": "masked_fill",
}
# op kinds that never launch a kernel (a cast or a reshape may: see `launches_kernel`)
_NO_KERNEL = {"layout", "getitem", "split"}
_ACTIVATIONS = ("gelu", "silu", "relu")

# a vocabulary from which the logits of one step are worth never materialising
LARGE_VOCAB = 32768


@dataclass(frozen=True)
class Match:
    """One occurrence of a fusable pattern in a graph.

    Attributes:
        kind: the pattern ("rms-norm", "layer-norm", "gated-act", "rope", "attention", "gqa-repeat",
            "residual-norm", "bias-act", "linear-cross-entropy").
        anchor: the node that locates it (its stack gives the source line, its module path the module).
        nodes: every node of the pattern.
        fused_bytes: what the fused replacement reads and writes.
        fused_kernels: kernels of the fused replacement.
        details: what the suggestion needs (sizes, eps, the activation, the repeat factor).
        saved_bytes: bytes saved when that is not today's minus the fused traffic (None: it is).
    """

    kind: str
    anchor: str
    nodes: frozenset[str]
    fused_bytes: int
    fused_kernels: int = 1
    details: Mapping[str, Any] = field(default_factory=dict)
    saved_bytes: int | None = None


class GraphView:
    """Index of one captured graph for pattern matching."""

    def __init__(self, graph: GraphInfo) -> None:
        self.nodes: dict[str, NodeInfo] = {n.name: n for n in graph.nodes}
        self.order: dict[str, int] = {n.name: i for i, n in enumerate(graph.nodes)}
        self.users: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
        for n in graph.nodes:
            for i in dict.fromkeys(n.inputs):
                if i in self.users:
                    self.users[i].append(n.name)

    def __getitem__(self, name: str) -> NodeInfo:
        return self.nodes[name]

    def kind(self, node: NodeInfo | None) -> str | None:
        """The op kind of a call node ("mul", "cast", "view", or the target's own name); None otherwise."""
        if node is None or node.op not in ("call_function", "call_method", "call_module"):
            return None
        return _KINDS.get(node.target, node.target)

    def of_kind(self, *kinds: str) -> Iterator[NodeInfo]:
        """The call nodes of these kinds, in graph order."""
        for n in self.nodes.values():
            if self.kind(n) in kinds:
                yield n

    def tensor_inputs(self, node: NodeInfo) -> list[NodeInfo]:
        """The tensor-valued nodes among `node`'s arguments, in argument order."""
        out = [self.nodes[i] for i in node.inputs if i in self.nodes]
        return [n for n in out if n.shape is not None]

    def users_of(self, node: NodeInfo) -> list[NodeInfo]:
        return [self.nodes[u] for u in self.users.get(node.name, ())]

    def arg(self, node: NodeInfo, index: int, name: str | None = None) -> Any:
        """Argument `index` (or keyword `name`) of `node`, a NodeInfo for node arguments; None if absent."""
        value = node.args[index] if index < len(node.args) else (node.kwargs.get(name) if name else None)
        return self.nodes.get(value.name) if isinstance(value, NodeRef) else value

    def launches_kernel(self, node: NodeInfo) -> bool:
        """Whether eager mode runs a kernel for `node`: views and same-dtype casts do not."""
        kind = self.kind(node)
        if kind is None or kind in _NO_KERNEL or node.shape is None:
            return False
        src = next(iter(self.tensor_inputs(node)), None)
        if kind == "cast":
            return src is not None and src.dtype != node.dtype
        if kind in ("view", "contiguous"):
            return src is not None and src.contiguous is False
        return True

    def kernel_bytes(self, node: NodeInfo) -> int:
        """What `node`'s kernel reads (each distinct tensor input once) and writes; 0 without a kernel."""
        if not self.launches_kernel(node):
            return 0
        ins = {i.name: i.nbytes for i in self.tensor_inputs(node)}
        return sum(ins.values()) + node.nbytes

    def cost(self, names: Iterable[str]) -> tuple[int, int, int]:
        """(ops, kernels, bytes read + written) of the nodes `names` in eager mode."""
        nodes = [self.nodes[n] for n in names]
        ops = [n for n in nodes if self.kind(n) is not None and self.kind(n) != "getitem"]
        return len(ops), sum(self.launches_kernel(n) for n in nodes), sum(self.kernel_bytes(n) for n in nodes)

    def boundary_bytes(self, names: Iterable[str]) -> int:
        """What one fused kernel doing the nodes `names` moves: each tensor entering them read once,
        each value they compute that is used elsewhere (or by nothing: the graph's result) written once."""
        inside = set(names)
        reads = {i.name: i.nbytes for n in inside for i in self.tensor_inputs(self.nodes[n]) if i.name not in inside}
        writes = sum(
            self.nodes[n].nbytes
            for n in inside
            if self.launches_kernel(self.nodes[n])
            and (not self.users[n] or any(u not in inside for u in self.users[n]))
        )
        return sum(reads.values()) + writes

    def base(self, node: NodeInfo | None) -> NodeInfo | None:
        """`node` before any casts (`x.float()` -> x): two values of one tensor compare equal here."""
        return self.up(node, ("cast",))[0]

    def up(self, node: NodeInfo | None, through: Iterable[str]) -> tuple[NodeInfo | None, list[NodeInfo]]:
        """Follow `node`'s first tensor input while the node is of a kind in `through`: (the first node
        of another kind, the nodes passed on the way, `node` first)."""
        kinds, passed = set(through), []
        while node is not None and self.kind(node) in kinds:
            passed.append(node)
            node = next(iter(self.tensor_inputs(node)), None)
        return node, passed

    def only_user(self, node: NodeInfo, through: Iterable[str] = ()) -> tuple[NodeInfo | None, list[NodeInfo]]:
        """The single user of `node` (None if it has several or none), skipping users of a kind in
        `through` that themselves have one user: (that user, the nodes skipped)."""
        kinds, passed = set(through), []
        while True:
            users = self.users_of(node)
            if len(users) != 1:
                return None, passed
            node = users[0]
            if self.kind(node) not in kinds:
                return node, passed
            passed.append(node)


def last_dim(node: NodeInfo, value: Any) -> bool:
    """Whether a reduction's `dim` argument is the last dim of a tensor of `node`'s rank."""
    rank = len(node.shape or ())
    dims = value if isinstance(value, tuple) else (value,)
    return len(dims) == 1 and isinstance(dims[0], int) and dims[0] in (-1, rank - 1)


def is_constant(value: Any, *numbers: float) -> bool:
    """Whether `value` is a Python number (one of `numbers` when given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not numbers or any(abs(value - n) < 1e-12 for n in numbers)


def other_operand(g: GraphView, node: NodeInfo, one: NodeInfo) -> Any:
    """For a binary op, the argument that is not `one` (a NodeInfo or a constant)."""
    a, b = g.arg(node, 0, "input"), g.arg(node, 1, "other")
    return b if a is one else a
