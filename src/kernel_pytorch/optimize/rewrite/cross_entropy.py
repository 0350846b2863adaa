"""Cross-entropy family rewrites: a linear layer's logits straight into cross-entropy ->
`kernel_pytorch.functional.fused_linear_cross_entropy`, which never holds the logits.

    logits = F.linear(h, W)   or   h @ W.T   or   lm_head(h)  h: (..., H), W: (V, H) of h's dtype
    logits = logits.float()                                    (optional: the loss in fp32)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1),
                           ignore_index=i, reduction="mean" | "sum", label_smoothing=s)

or the same without the views on 2-D h (N, H) and labels (N,); `lm_head` an `nn.Linear` without bias (its
call read as `F.linear(h, lm_head.weight)`, its forward hooks not run by the rewritten forward). The options
are matched as literals: another reduction, class weights or the deprecated `size_average`/`reduce` leave
the loss alone. Our loss is fp32; the replacement rounds it to the logits' dtype, as torch's loss is. Where,
at run time, the tensors are not of that form (integer labels, one row per label, W (V, H) of h's dtype),
the written code runs and a log line says so once. In a compiled graph, where Dynamo has folded
`logits.size(-1)` to a literal, the example shapes prove it is V (so that spelling matches only there).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch import functional as kp_functional
from kernel_pytorch._env import log_once
from kernel_pytorch.functional._dispatch import KERNEL_DTYPES
from kernel_pytorch.optimize.rewrite.pattern import Pattern

REDUCTIONS = ("mean", "sum")


def ce_ok(h: Any, w: Any, target: Any, flat: bool) -> bool:
    """Whether our op computes the written loss on these values: h (..., H) (2-D unless `flat`), W (V, H) of
    h's kernel dtype and device, integer labels, one per row."""
    if not all(isinstance(t, Tensor) for t in (h, w, target)):
        return False
    rows = h.numel() // h.shape[-1] if h.dim() and h.shape[-1] else -1
    return ((flat or (h.dim() == 2 and target.dim() == 1)) and w.dim() == 2 and w.shape[1] == h.shape[-1]
            and target.numel() == rows and not target.is_floating_point() and not target.is_complex()
            and h.dtype == w.dtype and h.dtype in KERNEL_DTYPES and h.device == w.device == target.device
            and h.device.type in ("cuda", "cpu"))


def kp_linear_cross_entropy(h: Tensor, w: Tensor, target: Tensor, ignore_index: int, reduction: str,
                            label_smoothing: float, upcast: bool, flat: bool) -> Tensor:
    """Our fused linear cross-entropy, in the written loss's dtype (one node in a rewritten graph)."""
    if not ce_ok(h, w, target, flat):
        log_once("kernel_pytorch rewrite: a linear + cross-entropy's tensors are not of the form our op takes "
                 "(W (V, H) of h's dtype, integer labels, one per row); the written code runs")
        logits = F.linear(h, w)
        logits = logits.float() if upcast else logits
        if flat:
            logits, target = logits.view(-1, logits.size(-1)), target.view(-1)
        return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    loss = kp_functional.fused_linear_cross_entropy(
        h.reshape(-1, h.shape[-1]), w, target.reshape(-1), ignore_index=int(ignore_index), reduction=reduction,
        label_smoothing=float(label_smoothing))
    return loss.to(torch.float32 if upcast else h.dtype)


def kp_linear_cross_entropy_op(h: Tensor, w: Tensor, target: Tensor, ignore_index: int, reduction: str,
                               label_smoothing: float, upcast: bool) -> Tensor:
    """The registered op's loss, for a graph torch.compile traces on (autograd's needs read there)."""
    grad = torch.is_grad_enabled()
    out = torch.ops.kernel_pytorch.fused_linear_cross_entropy_fwd(
        h.reshape(-1, h.shape[-1]), w, target.reshape(-1), None, None, int(ignore_index), reduction,
        float(label_smoothing), 0.0, 0.0, grad and h.requires_grad, grad and w.requires_grad, False, None, False)
    return out[0].to(torch.float32 if upcast else h.dtype)


torch.fx.wrap("kp_linear_cross_entropy")
torch.fx.wrap("kp_linear_cross_entropy_op")

LOGITS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "linear": lambda h, w: F.linear(h, w),
    "matmul_t": lambda h, w: h @ w.T,
}


# how the logits become rows: not at all (2-D already), `.view(-1, logits.size(-1))`, or `.view(-1, V)`
# with V a literal (Dynamo's folding of the size; proven by the example shapes)
FLATS = ("rows", "view", "view_literal")


def _search(logits_of: Callable[[Tensor, Tensor], Tensor], upcast: bool, flat: str) -> Callable[..., Tensor]:
    def loss(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any, label_smoothing: Any,
             vocab: Any) -> Tensor:
        logits = logits_of(h, w)
        if upcast:
            logits = logits.float()
        if flat != "rows":
            rows = logits.view(-1, vocab) if flat == "view_literal" else logits.view(-1, logits.size(-1))
            logits, target = rows, target.view(-1)
        return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)

    def search(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any, label_smoothing: Any
               ) -> Tensor:
        return loss(h, w, target, ignore_index, reduction, label_smoothing, None)

    def search_literal(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any,
                       label_smoothing: Any, vocab: Any) -> Tensor:
        return loss(h, w, target, ignore_index, reduction, label_smoothing, vocab)
    return search_literal if flat == "view_literal" else search


def _replace(upcast: bool, flat: str) -> Callable[..., Tensor]:
    # by its global name, which torch.fx.wrap patches while a replacement is traced
    def replace(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any, label_smoothing: Any
                ) -> Tensor:
        return kp_linear_cross_entropy(h, w, target, ignore_index, reduction, label_smoothing, upcast,
                                       flat != "rows")

    def replace_literal(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any,
                        label_smoothing: Any, vocab: Any) -> Tensor:
        return kp_linear_cross_entropy(h, w, target, ignore_index, reduction, label_smoothing, upcast, True)
    return replace_literal if flat == "view_literal" else replace


def _op(upcast: bool, flat: str) -> Callable[..., Tensor]:
    def op(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any, label_smoothing: Any) -> Tensor:
        return kp_linear_cross_entropy_op(h, w, target, ignore_index, reduction, label_smoothing, upcast)

    def op_literal(h: Tensor, w: Tensor, target: Tensor, ignore_index: Any, reduction: Any, label_smoothing: Any,
                   vocab: Any) -> Tensor:
        return kp_linear_cross_entropy_op(h, w, target, ignore_index, reduction, label_smoothing, upcast)
    return op_literal if flat == "view_literal" else op


def options_supported(values: Mapping[str, Any]) -> bool:
    """The written options are ours: an int ignore_index, reduction "mean" or "sum", 0 <= smoothing < 1."""
    ii, red, ls = values.get("ignore_index"), values.get("reduction"), values.get("label_smoothing")
    return (isinstance(ii, int) and not isinstance(ii, bool) and red in REDUCTIONS
            and isinstance(ls, (int, float)) and not isinstance(ls, bool) and 0.0 <= ls < 1.0)


def vocab_proven(values: Mapping[str, Any]) -> bool:
    """`options_supported`, and a literal row width is V of W's example value (none without shapes)."""
    w, vocab = values.get("w"), values.get("vocab")
    return (options_supported(values) and isinstance(w, Tensor) and w.dim() == 2 and isinstance(vocab, int)
            and vocab == w.shape[0])


def _fits(flat: str) -> Callable[[Mapping[str, Any]], bool]:
    def fits(values: Mapping[str, Any]) -> bool:
        return ce_ok(values.get("h"), values.get("w"), values.get("target"), flat != "rows")
    return fits


def _patterns() -> tuple[Pattern, ...]:
    out = []
    for (name, logits_of), upcast, flat in itertools.product(LOGITS.items(), (False, True), FLATS):
        out.append(Pattern(
            name=f"linear_cross_entropy.{name}.{'float' if upcast else 'as_is'}.{flat}",
            kind="linear-cross-entropy",
            family="cross_entropy",
            search=_search(logits_of, upcast, flat),
            replace=_replace(upcast, flat),
            op=_op(upcast, flat),
            anchor="cross_entropy",  # the loss call, the line the analyser's finding names
            what="kernel_pytorch.functional.fused_linear_cross_entropy",
            fits=_fits(flat),
            proof=vocab_proven if flat == "view_literal" else options_supported,
            keywords=(F.cross_entropy, F.linear),  # Dynamo records only the keywords written, and a bias of None
            modules=(nn.Linear,),  # `self.lm_head(h)`, a Linear without bias, read as F.linear(h, lm_head.weight)
        ))
    return tuple(out)


CROSS_ENTROPY_PATTERNS = _patterns()

__all__ = ["CROSS_ENTROPY_PATTERNS", "FLATS", "ce_ok", "kp_linear_cross_entropy", "kp_linear_cross_entropy_op",
           "options_supported", "vocab_proven"]
