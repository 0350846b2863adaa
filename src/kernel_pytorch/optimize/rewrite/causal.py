"""A rewritten attention's fill or additive mask carried as `is_causal=True` where it is provably the
causal mask.

A `masked_fill(m, -inf)` masks the keys where m is True; causal attention masks key j > query i. So m is
causal where it is True exactly above the diagonal of a T x T square (leading dims of size 1 aside):

    m = keep == 0            keep: the lower-triangular ones (any dtype), or
    m = ~keep                keep: the lower-triangular True (bool; `~` of an int would mask everywhere)
    m = keep.logical_not()

    keep = buf[:, :, :T, :T]              buf a buffer whose value is exactly tril(ones(n, n)) over the whole
                                          square, leading dims of size 1, sliced top-left with one T twice
    keep = torch.tril(torch.ones(T, T))   built in the forward (or `.tril()`, diagonal 0)

An additive mask `s + mask` is causal where it is 0 on and below the diagonal and -inf above it:

    mask = torch.full((T, T), -inf).triu(1)   (or torch.triu(..., diagonal=1); or torch.ones(T, T) * -inf)
    mask = buf[:, :, :T, :T]                  buf a buffer whose value is exactly that over its whole square

The buffer's values are read when the graph is rewritten (a module's buffer, or the example Dynamo
recorded for a compiled graph's input). Causal attention is the mask only where T equals the query and
key lengths (and T <= n): a module's traced forward does not know them, so its call checks at run time
and otherwise runs the dense mask (rebuilt from T, equal to the written one) and logs so once; a compiled
graph's example shapes prove it, and a size that is symbolic there keeps the dense mask.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch._env import log_once
from kernel_pytorch.optimize.rewrite.attention import (
    ATTENTION_PATTERNS,
    attention_ok,
    kp_attention_op,
    kp_attention_written,
    one_head,
)
from kernel_pytorch.optimize.rewrite.pattern import example


@dataclass(frozen=True)
class Causal:
    """A proven causal mask: `size` T (an int, or a node of a traced forward), `limit` the buffer's side n
    (None: built at T), `lead` its leading dims of size 1, `nodes` its computation, mask first; `additive`
    an additive mask's dtype (None: a fill mask)."""

    size: Any
    limit: int | None
    lead: int
    nodes: tuple[torch.fx.Node, ...]
    additive: torch.dtype | None = None


def _value(node: Any) -> Tensor | None:
    """A buffer's value: a get_attr of the graph's module, or a compiled graph input's recorded example."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.op == "get_attr":
        try:
            value = functools.reduce(getattr, str(node.target).split("."), node.graph.owning_module)
        except AttributeError:
            return None
    elif node.op == "placeholder":  # a compiled graph's input: only a buffer (a user's tensor may change)
        arg = node.meta.get("grapharg")
        if getattr(getattr(getattr(arg, "source", None), "base", None), "member", None) != "_buffers":
            return None
        value = getattr(arg, "example", None)
    else:
        return None
    return value if isinstance(value, Tensor) and not isinstance(value, torch._subclasses.FakeTensor) else None


def _call(node: Any, function: Any, method: str) -> bool:
    if not isinstance(node, torch.fx.Node):
        return False
    return (node.op == "call_function" and node.target is function) or (
        node.op == "call_method" and node.target == method)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
        return a is b
    return type(a) is int and type(b) is int and a == b


def _square(index: Any, dims: int) -> Any:
    """T where `index` takes the top-left [:T, :T] of a `dims`-D tensor, whole along the others; else None."""
    parts = index if isinstance(index, tuple) else (index,)
    if parts and parts[0] is Ellipsis:
        parts = (slice(None),) * (dims - len(parts) + 1) + parts[1:]
    if len(parts) != dims or any(p != slice(None) for p in parts[:-2]):
        return None
    rows, cols = parts[-2:]
    if not all(isinstance(s, slice) and s.start in (None, 0) and s.step in (None, 1) for s in (rows, cols)):
        return None
    return rows.stop if rows.stop is not None and _same(rows.stop, cols.stop) else None


def _sliced(node: torch.fx.Node, expected: Any) -> Causal | None:
    """`node` = buf[..., :T, :T] of a buffer whose (n, n) square equals `expected(n, value)` (None: not the
    buffer's kind), leading dims of size 1."""
    if not (node.op == "call_function" and node.target is operator.getitem and len(node.args) == 2):
        return None
    value = _value(node.args[0])
    if value is None or value.dim() < 2 or any(s != 1 for s in value.shape[:-2]) or value.shape[-1] != value.shape[-2]:
        return None
    n = value.shape[-1]
    want = None if value.is_complex() else expected(n, value)
    size = _square(node.args[1], value.dim())
    if want is None or size is None or not torch.equal(value.reshape(n, n), want):
        return None
    return Causal(size, n, value.dim() - 2, (node,), value.dtype if value.is_floating_point() else None)


def _sliced_buffer(keep: torch.fx.Node, boolean: bool) -> Causal | None:
    def tril(n: int, value: Tensor) -> Tensor | None:
        if boolean and value.dtype != torch.bool:
            return None
        return torch.ones(n, n, dtype=value.dtype, device=value.device).tril()

    found = _sliced(keep, tril)
    return None if found is None else dataclasses.replace(found, additive=None)


def _minus_inf_triu(n: int, value: Tensor) -> Tensor | None:
    if not value.is_floating_point():
        return None
    return torch.full((n, n), -math.inf, dtype=value.dtype, device=value.device).triu(1)


_ONES_KEYWORDS = {"dtype", "device", "requires_grad", "pin_memory"}


def _built(keep: torch.fx.Node, boolean: bool) -> Causal | None:
    if not _call(keep, torch.tril, "tril"):
        return None
    diagonal = keep.args[1] if len(keep.args) > 1 else keep.kwargs.get("diagonal", 0)
    ones = keep.args[0] if keep.args else None
    if diagonal != 0 or set(keep.kwargs) - {"diagonal"} or not _call(ones, torch.ones, ""):
        return None
    sizes = ones.args[0] if len(ones.args) == 1 and isinstance(ones.args[0], (tuple, list)) else ones.args
    if len(sizes) != 2 or not _same(sizes[0], sizes[1]) or set(ones.kwargs) - _ONES_KEYWORDS:
        return None
    dtype = ones.kwargs.get("dtype")
    if (boolean and dtype is not torch.bool) or (dtype is not None and not isinstance(dtype, torch.dtype)):
        return None
    return Causal(sizes[0], None, 0, (keep, ones))


def _minus_inf(value: Any) -> bool:
    return isinstance(value, float) and value == -math.inf


def _minus_inf_square(node: Any) -> tuple[Any, torch.dtype, tuple[torch.fx.Node, ...]] | None:
    """(T, dtype, nodes) of `torch.full((T, T), -inf)` or `torch.ones(T, T) * -inf` (either order)."""
    if _call(node, torch.full, ""):
        sizes = node.args[0] if node.args else node.kwargs.get("size")
        fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        made, nodes = node, (node,)
        if len(node.args) > 2 or set(node.kwargs) - _ONES_KEYWORDS - {"size", "fill_value"} or not _minus_inf(fill):
            return None
    elif _call(node, operator.mul, "mul") and len(node.args) == 2 and not node.kwargs:
        made = next((a for a in node.args if _call(a, torch.ones, "")), None)
        if made is None or not _minus_inf(node.args[1] if node.args[0] is made else node.args[0]):
            return None
        sizes = made.args[0] if len(made.args) == 1 and isinstance(made.args[0], (tuple, list)) else made.args
        nodes = (node, made)
        if set(made.kwargs) - _ONES_KEYWORDS:
            return None
    else:
        return None
    if not isinstance(sizes, (tuple, list)) or len(sizes) != 2 or not _same(sizes[0], sizes[1]):
        return None
    dtype = made.kwargs.get("dtype") or torch.get_default_dtype()
    return (sizes[0], dtype, nodes) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def causal_additive(mask: Any) -> Causal | None:
    """`mask` (an additive mask's node) proven 0 on and below the diagonal and -inf above it; else None."""
    if not isinstance(mask, torch.fx.Node):
        return None
    if _call(mask, torch.triu, "triu") and mask.args:
        diagonal = mask.args[1] if len(mask.args) > 1 else mask.kwargs.get("diagonal", 0)
        found = _minus_inf_square(mask.args[0]) if not set(mask.kwargs) - {"diagonal"} and diagonal == 1 else None
        if found is not None and type(diagonal) is int:
            size, dtype, nodes = found
            return Causal(size, None, 0, (mask, *nodes), dtype)
        return None
    return _sliced(mask, _minus_inf_triu)


def causal_mask(mask: Any) -> Causal | None:
    """`mask` (a fill mask's node: True = masked) proven True exactly above the diagonal; else None."""
    if not isinstance(mask, torch.fx.Node):
        return None
    if _call(mask, operator.eq, "eq") and len(mask.args) == 2 and not mask.kwargs and mask.args[1] in (0, 0.0) \
            and not isinstance(mask.args[1], bool):
        keep, boolean = mask.args[0], False
    elif (_call(mask, operator.invert, "__invert__") or _call(mask, torch.logical_not, "logical_not")) \
            and len(mask.args) == 1 and not mask.kwargs:
        keep, boolean = mask.args[0], True
    else:
        return None
    if not isinstance(keep, torch.fx.Node):
        return None
    found = _sliced_buffer(keep, boolean) or _built(keep, boolean)
    return None if found is None else Causal(found.size, found.limit, found.lead, (mask, *found.nodes))


def _proven(mask: Any, mask_op: str) -> Causal | None:
    return causal_mask(mask) if mask_op == "fill" else causal_additive(mask) if mask_op == "add" else None


def note(values: dict[str, Any]) -> str:
    """The report's words for a match whose mask is causal ("" otherwise); a fill pattern binds `fill`."""
    causal = _proven(values.get("mask"), "fill" if "fill" in values else "add")
    return " (causal mask carried as is_causal=True)" if causal is not None else ""


def _factor(scale: Any, scale_op: str) -> float:
    return 1.0 if scale_op == "none" else float(scale) if scale_op == "mul" else 1.0 / float(scale)


def kp_attention_causal(q: Tensor, k: Tensor, v: Tensor, scale: Any, size: int, limit: int | None, lead: int,
                        scale_op: str, additive: torch.dtype | None = None) -> Tensor:
    """Our attention with `is_causal=True` where q and k are `size` long (within the buffer's `limit`);
    otherwise the written mask, rebuilt: the fill mask True above the diagonal of the [:size, :size]
    square, or (`additive`, its dtype) the additive mask -inf there and 0 elsewhere."""
    number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
    square = isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() >= 2 and k.dim() >= 2 \
        and q.shape[-2] == k.shape[-2] == size and (limit is None or size <= limit)
    if square and attention_ok(q, k, v, None, "none") and (scale_op == "none" or (number and scale != 0)):
        q4, k4, v4, _ = one_head(q, k, v, None)
        out = kp_functional.attention(q4, k4, v4, is_causal=True, scale=_factor(scale, scale_op))
        return out.squeeze(1) if q.dim() == 3 else out
    log_once("kernel_pytorch rewrite: a causal mask's size is not the query and key length here (or the "
             "tensors are not of the form our call takes); the attention runs with the dense mask")
    side = len(range(limit)[:size]) if limit is not None else size
    device = q.device if isinstance(q, Tensor) else None
    mask = torch.ones(side, side, dtype=torch.bool, device=device).triu(1).view((1,) * lead + (side, side))
    if additive is not None:
        mask = torch.zeros(mask.shape, dtype=additive, device=device).masked_fill(mask, -math.inf)
        return kp_attention_written(q, k, v, scale, mask, None, scale_op, "add")
    return kp_attention_written(q, k, v, scale, mask, -math.inf, scale_op, "fill")


def kp_attention_causal_op(q: Tensor, k: Tensor, v: Tensor, scale: Any, scale_op: str) -> Tensor:
    """torch's SDPA with `is_causal=True`, for a compiled graph whose example shapes proved the mask causal."""
    factor = 1.0 if scale_op == "none" else scale if scale_op == "mul" else 1.0 / scale
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=factor)


def _proven_square(causal: Causal, q: Any, k: Any) -> bool:
    """A compiled graph's example shapes: q and k are T long, T an int within the buffer."""
    q, k = example(q), example(k)
    if type(causal.size) is not int or not (isinstance(q, Tensor) and isinstance(k, Tensor)):
        return False
    lengths = (q.shape[-2], k.shape[-2])
    if not all(type(n) is int for n in lengths):
        return False
    return lengths == (causal.size, causal.size) and (causal.limit is None or causal.size <= causal.limit)


def carry_causal(gm: torch.fx.GraphModule, op: bool) -> int:
    """In a rewritten graph, each attention call with a causal fill mask as the causal call (the mask's
    computation erased where nothing else reads it); `op`: a compiled graph's (example shapes proved);
    returns how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not (kp_attention_op if op else kp_attention_written):
            continue
        q, k, v, scale, mask = node.args[:5]
        scale_op, mask_op = node.args[-2:]
        causal = _proven(mask, mask_op)
        if causal is None or (op and not _proven_square(causal, q, k)):
            continue
        with gm.graph.inserting_before(node):
            if op:
                new = gm.graph.call_function(kp_attention_causal_op, (q, k, v, scale, scale_op))
            else:
                new = gm.graph.call_function(kp_attention_causal, (q, k, v, scale, causal.size, causal.limit,
                                                                   causal.lead, scale_op, causal.additive))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        for dead in causal.nodes:
            if not dead.users:
                gm.graph.erase_node(dead)
        done += 1
    if done:
        gm.recompile()
    return done


# the attention patterns with their fill masks carried as causal where proven
CAUSAL_ATTENTION_PATTERNS = tuple(dataclasses.replace(p, note=note, finish=carry_causal) for p in ATTENTION_PATTERNS)

__all__ = ["CAUSAL_ATTENTION_PATTERNS", "Causal", "carry_causal", "causal_additive", "causal_mask",
           "kp_attention_causal", "kp_attention_causal_op", "note"]
