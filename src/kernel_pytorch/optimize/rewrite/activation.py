"""Activation family rewrites: a gated activation written out -> `kernel_pytorch.functional.gated_act`.

    h = act(gate) * up        gate, up: (..., I) of one shape and dtype; act SiLU, GELU or GELU-tanh

Spellings covered: `torch.nn.functional.silu(gate)`, `F.gelu(gate)`, `F.gelu(gate, approximate="tanh")`,
on either side of the multiply. Both round as Hugging Face's MLPs do (the activation rounded to the
input dtype, then the product), so the replacement computes the same function.
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


def kp_swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, ours (one node in a rewritten graph)."""
    return kp_functional.gated_act(gate, up, "silu")


def kp_geglu(gate: Tensor, up: Tensor) -> Tensor:
    """gelu(gate) * up, ours (one node in a rewritten graph)."""
    return kp_functional.gated_act(gate, up, "gelu")


def kp_geglu_tanh(gate: Tensor, up: Tensor) -> Tensor:
    """gelu(gate, approximate="tanh") * up, ours (one node in a rewritten graph)."""
    return kp_functional.gated_act(gate, up, "gelu_tanh")


torch.fx.wrap("kp_swiglu")
torch.fx.wrap("kp_geglu")
torch.fx.wrap("kp_geglu_tanh")


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


def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return kp_swiglu(gate, up)


def _geglu(gate: Tensor, up: Tensor) -> Tensor:
    return kp_geglu(gate, up)


def _geglu_tanh(gate: Tensor, up: Tensor) -> Tensor:
    return kp_geglu_tanh(gate, up)


_ACTS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor, Tensor], Tensor]]] = {
    "silu": (lambda g: F.silu(g), _swiglu),
    "gelu": (lambda g: F.gelu(g), _geglu),
    "gelu_tanh": (lambda g: F.gelu(g, approximate="tanh"), _geglu_tanh),
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
        replace=replace,
        op=_op(name),
        anchor="mul",
        what=f"kernel_pytorch.functional.gated_act(activation={name!r})",
        fits=fits,
    )
    for name, (act, replace) in _ACTS.items()
    for left in (True, False)
)

__all__ = ["ACTIVATION_PATTERNS", "fits", "kp_geglu", "kp_geglu_tanh", "kp_swiglu"]
