"""Attention family rewrites: attention written out -> `kernel_pytorch.functional.attention` (torch's
scaled_dot_product_attention underneath: the scores are never materialised).

    s = q @ k.transpose(-2, -1)                  q: (B, H, Q, D), k: (B, H, K, D), v: (B, H, K, Dv)
    s = s * scale   or   s / c                   (or neither: scale 1)
    s = s + mask    or   s.masked_fill(m, -inf)  (or neither)
    p = softmax(s, dim=-1)
    p = dropout(p, p=0) (or in eval)             (optional)
    out = p @ v                                  (B, H, Q, Dv)

q, k and v may also be 3-D, one head without its dim: (B, Q, D), (B, K, D), (B, K, Dv).

Spellings: `@` or `torch.matmul` (the same for both products); the transpose of the last two dims
(`transpose(-2, -1)`, or `(2, 3)` where k's example value shows it is 4-D); softmax as `F.softmax(s,
dim=-1)`, `torch.softmax(s, -1)` or `s.softmax(-1)` (each positional or by keyword), over the last dim
only; dropout as `F.dropout` or an `nn.Dropout` child, the identity there (p = 0, or `training=False` in
a compiled graph of a model in eval).

The scale and the mask are carried exactly: the scale is the number written (1 / c for `/ c`:
`/ math.sqrt(d)`, `* self.scale`, `* q.size(-1) ** -0.5`), whatever its value, so nothing about it needs
proving but that it is a number (a tensor, a learned temperature, leaves the code alone); an additive
mask is passed as the float mask it is, and a `masked_fill(m, -inf)` as the boolean mask `~m` (either one
proven causal becomes `is_causal=True` after the replacement: causal.py). A fill value other than -inf (`-1e9`,
`finfo.min`: not the same where a whole row is masked), a softmax over another dim, a softmax with a
dtype, or a mask of another kind do not match. A row whose every key is masked, NaN as written, stays
NaN. Where, at run time, the tensors are not of the form our call takes (4-D q, k, v, or 3-D for one
head, of one float dtype with q's heads and batch, Q <= K, a mask of q's dtype broadcasting to the
scores), the written code runs and a log line says so once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch import functional as kp_functional
from kernel_pytorch._env import log_once
from kernel_pytorch.optimize.rewrite.pattern import Pattern

SCALES = ("none", "mul", "div")
MASKS = ("none", "add", "fill")
MATMULS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "at": lambda a, b: a @ b,
    "matmul": lambda a, b: torch.matmul(a, b),
}
SOFTMAXES: dict[str, Callable[[Tensor, Any], Tensor]] = {
    "F": lambda s, dim: F.softmax(s, dim=dim),
    "torch": lambda s, dim: torch.softmax(s, dim),
    "torch_dim": lambda s, dim: torch.softmax(s, dim=dim),
    "method": lambda s, dim: s.softmax(dim),
    "method_dim": lambda s, dim: s.softmax(dim=dim),
}


def attention_ok(q: Any, k: Any, v: Any, mask: Any, mask_op: str) -> bool:
    """Whether our call computes the written attention on these values: q (B, H, Q, D), k (B, H, K, D),
    v (B, H, K, Dv) of one float dtype and device, Q <= K, or the same without H (one head: (B, Q, D), ...);
    an additive mask of q's dtype, a fill mask boolean, either broadcasting to the scores (B, H, Q, K)."""
    if not all(isinstance(t, Tensor) for t in (q, k, v)) or not q.is_floating_point():
        return False
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim() or q.dtype != k.dtype or q.dtype != v.dtype:
        return False
    lead = q.dim() - 2  # batch (and heads)
    if k.shape[:lead] != q.shape[:lead] or v.shape[:lead + 1] != k.shape[:lead + 1] or k.shape[-1] != q.shape[-1] \
            or q.shape[-2] > k.shape[-2]:
        return False
    if not q.device == k.device == v.device:
        return False
    if mask_op == "none":
        return True
    if not isinstance(mask, Tensor) or mask.device != q.device or mask.dim() > q.dim():
        return False
    if mask.dtype != (q.dtype if mask_op == "add" else torch.bool):
        return False
    scores = (*q.shape[:-1], k.shape[-2])
    try:
        return tuple(torch.broadcast_shapes(mask.shape, scores)) == scores
    except RuntimeError:
        return False


def one_head(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """3-D q, k, v (one head) as 4-D ones with a head dim of 1 (a 3-D mask too, a 2-D one broadcasts as it is);
    4-D ones as they are."""
    if q.dim() != 3:
        return q, k, v, mask
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)
    return q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), mask


def _written(q: Tensor, k: Tensor, v: Tensor, scale: Any, mask: Any, fill: Any, scale_op: str, mask_op: str
             ) -> Tensor:
    s = q @ k.transpose(-2, -1)
    s = s * scale if scale_op == "mul" else s / scale if scale_op == "div" else s
    s = s + mask if mask_op == "add" else s.masked_fill(mask, fill) if mask_op == "fill" else s
    return s.softmax(-1) @ v


def _nan_rows(out: Tensor, keep: Tensor, mask_op: str) -> Tensor:
    """A row whose every key is masked is NaN as written (softmax of -inf); torch's SDPA gives 0 there."""
    if mask_op != "fill":
        return out
    return out.masked_fill(~keep.any(-1, keepdim=True), float("nan"))


def kp_attention_written(q: Tensor, k: Tensor, v: Tensor, scale: Any, mask: Any, fill: Any, scale_op: str,
                         mask_op: str) -> Tensor:
    """Our attention with the written scale and mask (one node in a rewritten graph); the written code where
    the values are not of the form it takes."""
    number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
    if not (attention_ok(q, k, v, mask, mask_op) and (scale_op == "none" or (number and scale != 0))):
        log_once("kernel_pytorch rewrite: an attention's tensors are not of the form our call takes (4-D q, k, "
                 "v or 3-D of one float dtype, q's batch and heads, a number scale, a mask of q's dtype or a "
                 "boolean fill mask broadcasting to the scores); the written code runs")
        return _written(q, k, v, scale, mask, fill, scale_op, mask_op)
    factor = 1.0 if scale_op == "none" else float(scale) if scale_op == "mul" else 1.0 / float(scale)
    q4, k4, v4, keep = one_head(q, k, v, ~mask if mask_op == "fill" else mask)
    out = _nan_rows(kp_functional.attention(q4, k4, v4, mask=keep, scale=factor), keep, mask_op)
    return out.squeeze(1) if q.dim() == 3 else out


def kp_attention_op(q: Tensor, k: Tensor, v: Tensor, scale: Any, mask: Any, scale_op: str, mask_op: str) -> Tensor:
    """torch's SDPA with the written scale and mask, for a graph torch.compile traces on (`fits` judged
    the example values)."""
    factor = 1.0 if scale_op == "none" else scale if scale_op == "mul" else 1.0 / scale
    keep = ~mask if mask_op == "fill" else mask
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=factor)
    return _nan_rows(out, keep, mask_op)


torch.fx.wrap("kp_attention_written")
torch.fx.wrap("kp_attention_op")

# every argument a search may take, in order; each spelling's search keeps those it uses
ARGUMENTS = ("q", "k", "v", "d0", "d1", "scale", "mask", "fill", "dim", "p", "training", "inplace")


def _body(matmul: Callable, softmax: Callable, scale_op: str, mask_op: str, dropout: bool) -> Callable[..., Tensor]:
    def search(q: Tensor, k: Tensor, v: Tensor, d0: Any, d1: Any, scale: Any, mask: Any, fill: Any, dim: Any,
               p: Any, training: Any, inplace: Any) -> Tensor:
        s = matmul(q, k.transpose(d0, d1))
        if scale_op == "mul":
            s = s * scale
        elif scale_op == "div":
            s = s / scale
        if mask_op == "add":
            s = s + mask
        elif mask_op == "fill":
            s = s.masked_fill(mask, fill)
        a = softmax(s, dim)
        if dropout:
            a = F.dropout(a, p=p, training=training, inplace=inplace)
        return matmul(a, v)
    return search


def _pruned(fn: Callable[..., Any], keep: tuple[str, ...]) -> torch.fx.GraphModule:
    """`fn` traced, with only the arguments `keep` (the others unused by it)."""
    gm = torch.fx.symbolic_trace(fn)
    for node in list(gm.graph.nodes):
        if node.op == "placeholder" and node.target not in keep:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _replacement(scale_op: str, mask_op: str, op: bool) -> Callable[..., Tensor]:
    # by their global names, which torch.fx.wrap patches while a replacement is traced
    def replace(q: Tensor, k: Tensor, v: Tensor, d0: Any, d1: Any, scale: Any, mask: Any, fill: Any, dim: Any,
                p: Any, training: Any, inplace: Any) -> Tensor:
        sc = None if scale_op == "none" else scale
        m = None if mask_op == "none" else mask
        if op:
            return kp_attention_op(q, k, v, sc, m, scale_op, mask_op)
        return kp_attention_written(q, k, v, sc, m, None if mask_op != "fill" else fill, scale_op, mask_op)
    return replace


def _last_two(values: Mapping[str, Any]) -> bool:
    """The transpose swaps k's last two dims: (-2, -1) in either order, or (2, 3) of a 4-D k's example."""
    pair, k = {values.get("d0"), values.get("d1")}, values.get("k")
    if pair == {-2, -1}:
        return True
    return isinstance(k, Tensor) and pair == {k.dim() - 2, k.dim() - 1}


def proof(values: Mapping[str, Any]) -> bool:
    """The softmax is over the scores' last dim, the transpose of k's last two, a fill value -inf, a
    dropout the identity (p = 0, or training False) and an additive mask a tensor (not a literal)."""
    q, k, dim = values.get("q"), values.get("k"), values.get("dim")
    last = dim == -1 or (isinstance(q, Tensor) and isinstance(k, Tensor) and dim == max(q.dim(), k.dim()) - 1)
    if not (last and not isinstance(dim, bool) and _last_two(values)):
        return False
    if "fill" in values and not (isinstance(values["fill"], float) and values["fill"] == -math.inf):
        return False
    if "p" in values and not (values["p"] == 0 or values.get("training") is False):
        return False
    return "mask" not in values or not isinstance(values["mask"], (int, float, bool))


def _fits(mask_op: str) -> Callable[[Mapping[str, Any]], bool]:
    def fits(values: Mapping[str, Any]) -> bool:
        """`attention_ok` on the example values (a scale that is not 0 where it divides)."""
        scale = values.get("scale")
        return attention_ok(values.get("q"), values.get("k"), values.get("v"), values.get("mask"), mask_op) and (
            "scale" not in values or scale != 0)
    return fits


def _patterns() -> tuple[Pattern, ...]:
    out = []
    for (mm, matmul), (sm, softmax), scale_op, mask_op, dropout in itertools.product(
            MATMULS.items(), SOFTMAXES.items(), SCALES, MASKS, (False, True)):
        body = _body(matmul, softmax, scale_op, mask_op, dropout)
        used = tuple(n.target for n in torch.fx.symbolic_trace(body).graph.nodes
                     if n.op == "placeholder" and n.users)
        out.append(Pattern(
            name=f"attention.{mm}.{scale_op}.{mask_op}.softmax_{sm}{'.dropout' if dropout else ''}",
            kind="attention",
            family="attention",
            search=_pruned(body, used),
            replace=_pruned(_replacement(scale_op, mask_op, False), used),
            op=_pruned(_replacement(scale_op, mask_op, True), used),
            anchor="matmul",  # q @ k^T, the line the analyser's finding names
            what="kernel_pytorch.functional.attention",
            fits=_fits(mask_op),
            proof=proof,
            keywords=(F.softmax, F.dropout),  # Dynamo records only the keywords written
            modules=(nn.Dropout,) if dropout else (),
            numbers=("scale",) if scale_op != "none" else (),
        ))
    return tuple(out)


ATTENTION_PATTERNS = _patterns()

__all__ = ["ATTENTION_PATTERNS", "attention_ok", "kp_attention_op", "kp_attention_written", "one_head", "proof"]
