"""Activation family rewrites: a gated activation written out -> `kernel_pytorch.functional.gated_act`,
and a bias added before an activation -> `kernel_pytorch.functional.bias_act`.

    h = act(gate) * up        gate, up: (..., I) of one shape and dtype; act SiLU, GELU or GELU-tanh
    y = act(x + bias)         x: (..., D), bias: (D,) of x's dtype; act SiLU, GELU, GELU-tanh or ReLU

Spellings covered: `torch.nn.functional.silu(gate)`, `F.gelu(gate)`, `F.gelu(gate, approximate="tanh")`,
on either side of the multiply; `F.silu`, `F.gelu` (both forms), `F.relu` or `torch.relu` of `x + bias`
or `bias + x`. Both round as the written code does (the sum, then the activation, each rounded to the
input dtype; the product likewise), so the replacement computes the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch import functional as kp_functional
from kernel_pytorch.functional._dispatch import KERNEL_DTYPES
from kernel_pytorch.optimize.rewrite.pattern import Pattern


def kp_gated_act(gate: Tensor, up: Tensor, activation: str) -> Tensor:
    """act(gate) * up, ours (one node in a rewritten graph; the activation's name a constant argument)."""
    return kp_functional.gated_act(gate, up, activation)


def kp_bias_act(x: Tensor, bias: Tensor, activation: str) -> Tensor:
    """act(x + bias), ours (one node in a rewritten graph; the activation's name a constant argument)."""
    return kp_functional.bias_act(x, bias, activation)


torch.fx.wrap("kp_gated_act")
torch.fx.wrap("kp_bias_act")


def fits(values: Mapping[str, Any]) -> bool:
    """Whether our op takes these example values: gate and up of one shape, dtype (a kernel dtype) and device."""
    gate, up = values.get("gate"), values.get("up")
    return (isinstance(gate, Tensor) and isinstance(up, Tensor) and gate.shape == up.shape and gate.dim() >= 1
            and gate.dtype == up.dtype and gate.dtype in KERNEL_DTYPES and gate.device == up.device
            and gate.device.type in ("cuda", "cpu"))


def _op(act: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The replacement as the registered op (Pattern.op)."""
    def op(gate: Tensor, up: Tensor) -> Tensor:
        return torch.ops.kernel_pytorch.gated_act_fwd(gate, up, act, 1.0)
    return op


def _replace(act: str) -> Callable[[Tensor, Tensor], Tensor]:
    # by its global name, which torch.fx.wrap patches while a replacement is traced
    def replace(gate: Tensor, up: Tensor) -> Tensor:
        return kp_gated_act(gate, up, act)
    return replace


_ACTS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": lambda g: F.silu(g),
    "gelu": lambda g: F.gelu(g),
    "gelu_tanh": lambda g: F.gelu(g, approximate="tanh"),
}


def _search(act: Callable[[Tensor], Tensor], left: bool) -> Callable[[Tensor, Tensor], Tensor]:
    def search(gate: Tensor, up: Tensor) -> Tensor:
        return act(gate) * up if left else up * act(gate)
    return search


ACTIVATION_PATTERNS = tuple(
    Pattern(
        name=f"gated_act.{name}.{'act_left' if left else 'act_right'}",
        kind="gated-act",
        family="activation",
        search=_search(act, left),
        replace=_replace(name),
        op=_op(name),
        anchor="mul",
        what=f"kernel_pytorch.functional.gated_act(activation={name!r})",
        fits=fits,
    )
    for name, act in _ACTS.items()
    for left in (True, False)
)

def bias_fits(values: Mapping[str, Any]) -> bool:
    """Whether our op takes these example values: x (..., D) of a kernel dtype, bias (D,) of x's dtype and device."""
    x, bias = values.get("x"), values.get("bias")
    return (isinstance(x, Tensor) and isinstance(bias, Tensor) and x.dim() >= 2 and bias.dim() == 1
            and bias.shape[0] == x.shape[-1] and x.dtype == bias.dtype and x.dtype in KERNEL_DTYPES
            and x.device == bias.device and x.device.type in ("cuda", "cpu"))


def _bias_replace(act: str) -> Callable[[Tensor, Tensor], Tensor]:
    # by its global name, which torch.fx.wrap patches while a replacement is traced
    def replace(x: Tensor, bias: Tensor) -> Tensor:
        return kp_bias_act(x, bias, act)
    return replace


def _bias_op(act: str) -> Callable[[Tensor, Tensor], Tensor]:
    def op(x: Tensor, bias: Tensor) -> Tensor:
        return torch.ops.kernel_pytorch.bias_act_fwd(x, bias, act)
    return op


# (our activation name, the call's name as the graph shows it, the spelling)
_BIAS_ACTS: tuple[tuple[str, str, Callable[[Tensor], Tensor]], ...] = (
    ("silu", "silu", lambda v: F.silu(v)),
    ("gelu", "gelu", lambda v: F.gelu(v)),
    ("gelu_tanh", "gelu", lambda v: F.gelu(v, approximate="tanh")),
    ("relu", "relu", lambda v: F.relu(v)),
    ("relu", "relu", lambda v: torch.relu(v)),
)


def _bias_search(act: Callable[[Tensor], Tensor], x_first: bool) -> Callable[[Tensor, Tensor], Tensor]:
    def search(x: Tensor, bias: Tensor) -> Tensor:
        return act(x + bias) if x_first else act(bias + x)
    return search


BIAS_ACT_PATTERNS = tuple(
    Pattern(
        name=f"bias_act.{name}.{i}.{'x_first' if x_first else 'bias_first'}",
        kind="bias-act",
        family="activation",
        search=_bias_search(act, x_first),
        replace=_bias_replace(name),
        op=_bias_op(name),
        anchor=call,
        what=f"kernel_pytorch.functional.bias_act(activation={name!r})",
        fits=bias_fits,
        weight="bias",
    )
    for i, (name, call, act) in enumerate(_BIAS_ACTS)
    for x_first in (True, False)
)

__all__ = ["ACTIVATION_PATTERNS", "BIAS_ACT_PATTERNS", "bias_fits", "fits", "kp_bias_act", "kp_gated_act"]
