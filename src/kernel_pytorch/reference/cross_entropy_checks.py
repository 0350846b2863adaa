"""Argument checks for the cross-entropy family, each raising an error that names the argument.

The cheap checks (types, shapes, dtypes, option ranges) read only metadata; `check_target_range` and
`check_finite_loss` read values, which costs a host sync, so a caller runs them in eager mode only, and
`check_finite_loss` only on request (`check_finite=True`).

Non-finite logits: NaN or +inf anywhere in a row makes that row's loss NaN (and -inf logits are legal:
masked classes; a row of only -inf is NaN, as in torch), so the loss itself carries the report at no
cost. Checking the logits up front would read them all once more (as many bytes as the loss's own
forward); instead `check_finite_loss` looks at the loss, and only when it is not finite reads the first
bad row's logits to say why.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference.cross_entropy import REDUCTIONS, CrossEntropyOptions

# torch.nn.functional.cross_entropy takes class indices as int64 ("Long") or uint8 ("Byte").
TARGET_DTYPES = (torch.int64, torch.uint8)


def check_logits(logits: Tensor, name: str = "logits") -> None:
    """A floating-point tensor (..., V) with V >= 1."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"{name} must be a tensor (got {type(logits).__name__})")
    if not logits.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {logits.dtype})")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (class) dimension (got shape {tuple(logits.shape)})")


def check_target(target: Tensor, rows_shape: torch.Size, device: torch.device, name: str = "target") -> None:
    """Class indices: int64 or uint8, of shape `rows_shape` (the logits' leading dims), on `device`."""
    if not isinstance(target, Tensor):
        raise TypeError(f"{name} must be a tensor (got {type(target).__name__})")
    if target.is_floating_point():
        raise TypeError(f"{name} holds class probabilities ({target.dtype}); only class-index targets "
                        "(int64) are supported: use torch.nn.functional.cross_entropy for soft targets")
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"{name} must be int64 (or uint8) class indices, as torch requires (got {target.dtype})")
    if target.shape != rows_shape:
        raise ValueError(f"{name} must have shape {tuple(rows_shape)}, one class index per row of logits "
                         f"(got {tuple(target.shape)})")
    if target.device != device:
        raise ValueError(f"{name} is on {target.device} but the logits are on {device}; move them together")


def check_class_weight(weight: Tensor | None, n_classes: int, device: torch.device, name: str = "weight") -> None:
    """None, or a floating-point (V,) tensor on `device`."""
    if weight is None:
        return
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of class weights or None")
    if weight.shape != (n_classes,):
        raise ValueError(f"{name} must have shape ({n_classes},), one weight per class (got {tuple(weight.shape)})")
    if weight.device != device:
        raise ValueError(f"{name} is on {weight.device} but the logits are on {device}; move them together")


def check_options(options: CrossEntropyOptions) -> None:
    """reduction in REDUCTIONS, label_smoothing in [0, 1] (torch's rule), lse_square_scale >= 0 and
    finite, softcap None or > 0 and finite, ignore_index an int, each return_* flag a bool (a tensor or
    a string there is a misplaced argument)."""
    o = options
    if o.reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS} (got {o.reduction!r})")
    if not 0.0 <= float(o.label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0 (got {o.label_smoothing})")
    if not 0.0 <= float(o.lse_square_scale) < float("inf"):
        raise ValueError(f"lse_square_scale must be finite and >= 0 (got {o.lse_square_scale})")
    if o.softcap is not None and not 0.0 < float(o.softcap) < float("inf"):
        raise ValueError(f"softcap must be None or finite and > 0 (got {o.softcap})")
    if isinstance(o.ignore_index, bool) or not isinstance(o.ignore_index, int):
        raise TypeError(f"ignore_index must be an int (got {type(o.ignore_index).__name__})")
    for name in ("return_z_loss", "return_token_accuracy", "return_predicted_tokens"):
        if not isinstance(getattr(o, name), bool):
            raise TypeError(f"{name} must be True or False (got {type(getattr(o, name)).__name__})")


def check_cross_entropy_args(logits: Tensor, target: Tensor, weight: Tensor | None,
                             options: CrossEntropyOptions) -> None:
    """Every metadata check of a cross-entropy call (no host sync)."""
    check_logits(logits)
    check_target(target, logits.shape[:-1], logits.device)
    check_class_weight(weight, logits.shape[-1], logits.device)
    check_options(options)


def check_token_scale(token_scale: Tensor | None, target: Tensor, name: str = "token_scale") -> None:
    """None, or a floating-point tensor of target's shape on target's device: one factor per row."""
    if token_scale is None:
        return
    if not isinstance(token_scale, Tensor) or not token_scale.is_floating_point():
        got = token_scale.dtype if isinstance(token_scale, Tensor) else type(token_scale).__name__
        raise TypeError(f"{name} must be a floating-point tensor of per-token factors or None (got {got})")
    if token_scale.shape != target.shape:
        raise ValueError(f"{name} must have the target's shape {tuple(target.shape)}, one factor per token "
                         f"(got {tuple(token_scale.shape)})")
    if token_scale.device != target.device:
        raise ValueError(f"{name} is on {token_scale.device} but the target is on {target.device}; move them together")


def check_linear_args(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """The fused linear cross-entropy's x (..., H), weight (V, H) and bias (V,): one float dtype and
    device (the chunk GEMMs take no mixed dtypes)."""
    check_logits(x, "x")
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must have shape (V, {x.shape[-1]}) to match x's last dim (got {shape})")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != x.dtype:
            raise TypeError(f"{name} must have x's dtype {x.dtype} (got {t.dtype})")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; move them together")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},) (got {tuple(bias.shape)})")


def check_target_range(target: Tensor, n_classes: int, ignore_index: int) -> None:
    """Every target is ignore_index or in [0, n_classes). Reads the targets (a host sync): eager only. Skipped
    while a CUDA graph is captured on the current stream, which forbids the read: a replayed graph runs on
    whatever its target buffer then holds, unchecked."""
    if target.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    t = target.reshape(-1)
    bad = (t != ignore_index) & ((t < 0) | (t >= n_classes))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        where = tuple(int(k) for k in torch.unravel_index(torch.tensor(i), target.shape)) if target.dim() else ()
        raise ValueError(f"target {int(t[i])} at index {where} is out of range for {n_classes} classes and is "
                         f"not ignore_index ({ignore_index})")


def explain_row(logits_row: Tensor) -> str:
    """Why a row of logits gives a non-finite loss, or that they are finite."""
    if bool(torch.isnan(logits_row).any()):
        return "its logits hold NaN"
    if bool(torch.isposinf(logits_row).any()):
        return "its logits hold +inf"
    if bool(torch.isneginf(logits_row).all()):
        return "its logits are all -inf"
    return "its logits are finite (an overflow, or a weighted mean over targets whose weights sum to 0)"


def check_finite_loss(row_loss: Tensor, logits: Tensor | None = None) -> None:
    """Raise FloatingPointError naming the first row whose loss is not finite, and why (from its logits,
    when given: pass them before an in-place gradient overwrites them). A host sync: eager, on request.

    Args:
        row_loss: (N,) per-row losses (or any loss tensor; a 0-d loss names no row).
        logits: (..., V) the logits the loss came from, or None.
    """
    flat = row_loss.reshape(-1)
    bad = ~torch.isfinite(flat)
    if not bool(bad.any()):
        return
    i = int(bad.nonzero()[0, 0])
    if row_loss.dim() == 0:
        raise FloatingPointError(f"the loss is {float(flat[0])}")
    why = f": {explain_row(logits.reshape(-1, logits.shape[-1])[i])}" if logits is not None else ""
    raise FloatingPointError(f"the loss of row {i} is {float(flat[i])}{why}")
