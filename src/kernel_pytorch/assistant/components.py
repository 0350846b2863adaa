"""The kernel_pytorch components the analyser's suggestions name, and whether each exists yet.

One table, component -> (import path, what it is). Whether a component is available is checked at run
time by importing it, so a suggestion says "kernel_pytorch's fused SwiGLU (in development)" until
`kernel_pytorch.functional.swiglu` lands and names the import from then on, with no change here.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Component:
    """A kernel_pytorch component a suggestion can name.

    Attributes:
        key: the table's key ("swiglu").
        path: its import path ("kernel_pytorch.functional.swiglu").
        what: what it is, for a sentence ("kernel_pytorch's fused SwiGLU").
    """

    key: str
    path: str
    what: str

    @property
    def available(self) -> bool:
        """Whether `path` imports in this installation."""
        return importable(self.path)

    @property
    def short(self) -> str:
        """The import path as code is written with `import kernel_pytorch as kp`: "kp.nn.RMSNorm"."""
        return "kp." + self.path.removeprefix("kernel_pytorch.")

    def named(self) -> str:
        """How a sentence names it: "`kp.nn.RMSNorm` (kernel_pytorch's fused RMSNorm)" when it exists,
        else "kernel_pytorch's fused SwiGLU (in development)"."""
        return f"`{self.short}` ({self.what})" if self.available else f"{self.what} (in development)"


COMPONENTS: dict[str, Component] = {
    c.key: c
    for c in (
        Component("rms_norm", "kernel_pytorch.nn.RMSNorm", "kernel_pytorch's fused RMSNorm"),
        Component("layer_norm", "kernel_pytorch.nn.LayerNorm", "kernel_pytorch's fused LayerNorm"),
        Component("add_rms_norm", "kernel_pytorch.nn.FusedAddRMSNorm", "kernel_pytorch's fused residual add + RMSNorm"),
        Component("swiglu", "kernel_pytorch.functional.swiglu", "kernel_pytorch's fused SwiGLU"),
        Component("geglu", "kernel_pytorch.functional.geglu", "kernel_pytorch's fused GeGLU"),
        Component("gated_mlp", "kernel_pytorch.nn.GatedMLP", "kernel_pytorch's gated MLP"),
        Component("bias_act", "kernel_pytorch.nn.MLP", "kernel_pytorch's MLP with fused bias + activation"),
        Component("rope", "kernel_pytorch.nn.RotaryEmbedding", "kernel_pytorch's fused RoPE"),
        Component("attention", "kernel_pytorch.nn.Attention", "kernel_pytorch's attention module"),
        Component(
            "linear_cross_entropy",
            "kernel_pytorch.nn.FusedLinearCrossEntropyLoss",
            "kernel_pytorch's fused linear + cross-entropy",
        ),
    )
}


def component(key: str) -> Component:
    """The table's entry for `key` (KeyError for an unknown one)."""
    return COMPONENTS[key]


@functools.cache
def importable(path: str) -> bool:
    """Whether `package.module.Name` imports: the module, then the attribute on it."""
    module, _, name = path.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


__all__ = ["COMPONENTS", "Component", "component", "importable"]
