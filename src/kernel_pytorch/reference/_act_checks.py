"""Argument checks of the activation family (gated activations, bias + activation), for the
functional entry points to run once in eager mode. Each raises TypeError or ValueError naming the
argument at fault; none copies or touches tensor data."""

from __future__ import annotations

import math
import numbers

from torch import Tensor

from kernel_pytorch.reference._activations import ACTIVATIONS, HF_NAMES


def check_activation(act: str) -> str:
    """Our name for `act` (ours, or transformers' ACT2FN name such as "gelu_pytorch_tanh")."""
    if act in ACTIVATIONS:
        return act
    if isinstance(act, str) and act in HF_NAMES:
        return HF_NAMES[act]
    known = ", ".join(repr(a) for a in (*ACTIVATIONS, *sorted(set(HF_NAMES) - set(ACTIVATIONS))))
    raise ValueError(f"activation must be one of {known} (got {act!r})")


def check_multiplier(name: str, value: object) -> float:
    """`value` as a float: a real number (not a bool, not a tensor: the ops take it as a Python float),
    finite (a NaN or infinite multiplier turns every output into NaN or inf)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (got {type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite (got {value})")
    return value


def check_float(name: str, t: Tensor) -> None:
    """`t` is a floating-point tensor with at least one dimension."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor (got {type(t).__name__})")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {t.dtype})")
    if t.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (got a scalar)")


def check_gated(gate: Tensor, up: Tensor) -> None:
    """gate and up: floating tensors of one shape, dtype and device."""
    check_float("gate", gate)
    check_float("up", up)
    if up.shape != gate.shape:
        raise ValueError(f"up must have gate's shape {tuple(gate.shape)} (got {tuple(up.shape)})")
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype} (got {up.dtype})")
    if up.device != gate.device:
        raise ValueError(f"up is on {up.device} but gate is on {gate.device}; move them together")


def check_gated_packed(gate_up: Tensor) -> None:
    """gate_up: a floating tensor whose last dim holds [gate | up], so is even."""
    check_float("gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(
            f"gate_up's last dim holds [gate | up] and must be even (got shape {tuple(gate_up.shape)})"
        )


def check_bias_act(x: Tensor, bias: Tensor | None) -> None:
    """x: a floating tensor (..., D); bias: None or (D,) of x's dtype and device."""
    check_float("x", x)
    if bias is None:
        return
    check_float("bias", bias)
    if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"bias must have shape ({x.shape[-1]},) to match the last dim of x {tuple(x.shape)} "
            f"(got {tuple(bias.shape)})"
        )
    if bias.dtype != x.dtype:
        raise TypeError(f"bias must have x's dtype {x.dtype} (got {bias.dtype})")
    if bias.device != x.device:
        raise ValueError(f"bias is on {bias.device} but x is on {x.device}; move them together")
