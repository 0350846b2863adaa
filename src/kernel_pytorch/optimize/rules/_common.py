"""Helpers every rule family uses: guards on what may be swapped, moving parameters into a
replacement, a quick behavioural probe that tells which computation a module does, and `DropInRule`,
the shape of every rule that swaps a torch module for our subclass of it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.tolerances import TOLERANCES, compare


def blocked(module: nn.Module) -> str | None:
    """Why `module` must not be swapped whatever it computes, or None: hooks would be lost with the
    instance, and parameters on the meta device cannot be probed."""
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks:
        return "has forward/backward hooks, which a new instance would not carry"
    if any(p.is_meta for p in module.parameters(recurse=False)):
        return "parameters on the meta device (not materialised)"
    return None


def build_on_meta(make: Callable[[], nn.Module], old: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """`make()` (which should build on the meta device), then hand it `old`'s parameter objects under
    `names`, so the replacement shares storage, dtype, device, ties and optimizer state with the model."""
    new = make()
    for n in names:
        value = getattr(old, n, None)
        if value is None or isinstance(value, nn.Parameter):
            setattr(new, n, value)
        else:
            raise TypeError(f"{n} of {type(old).__name__} is a {type(value).__name__}, not a Parameter")
    new.train(old.training)
    return new


def probe_input(width: int, like: Tensor | None, rows: int = 6) -> Tensor:
    """A (2, rows // 2, width) probe of `like`'s dtype and device (fp32 where that dtype has no table
    entry), drawn from a private generator so the caller's RNG stream is untouched."""
    dtype = like.dtype if like is not None and like.dtype in TOLERANCES else torch.float32
    device = like.device if like is not None else torch.device("cpu")
    g = torch.Generator().manual_seed(1234)
    return torch.randn(2, rows // 2, width, generator=g).to(device=device, dtype=dtype)


def same_output(a: Tensor, b: Tensor) -> bool:
    """Whether `b` is `a` under the tolerance table (shape and dtype included)."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return compare(b, a).passed


def run_probe(module: nn.Module, x: Tensor) -> Tensor | None:
    """`module(x)` without gradients, or None when it raises (the module is then not of this kind)."""
    try:
        with torch.no_grad():
            return module(x)
    except Exception:
        return None


# Linear subclasses whose forward is x @ W.T + b with the bias added after the product is rounded (Falcon
# keeps its training's extra rounding in bf16): the same map, so the replacement may read their weights
PLAIN_LINEARS = frozenset({"transformers.models.falcon.modeling_falcon.FalconLinear"})


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def projections_left_alone(module: nn.Module, projs: dict[str, nn.Linear]) -> str | None:
    """Why a module built around the projections `projs` cannot be rebuilt from their parameters: the module
    or a projection is blocked (`blocked`), a projection has a forward of its own (LoRA, quantized), or the
    module holds parameters or buffers of its own, which a replacement would drop. None: it can be."""
    if (why := blocked(module)) is not None:
        return why
    for name, proj in projs.items():
        if (why := blocked(proj)) is not None:
            return f"{name}: {why}"
        if type(proj).forward is not nn.Linear.forward and _qualname(type(proj)) not in PLAIN_LINEARS:
            return f"{name} is a {type(proj).__name__} with its own forward (LoRA, quantized, ...)"
    if [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
        return "holds parameters or buffers of its own, which the replacement would drop"
    return None


class DropInRule:
    """A torch module (`base`, or a subclass keeping its forward) -> our drop-in subclass `ours`, built on
    the meta device around the module's own parameters (STYLE rule 4: same constructor, parameter names,
    `state_dict` keys). A subclass overriding `forward`, or a module `left_alone` names a reason for, is
    left alone with that reason. Subclasses say what to build and how to describe the swap."""

    name: str
    family: str
    base: type[nn.Module]
    ours: type[nn.Module]

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if not isinstance(module, self.base) or isinstance(module, self.ours):
            return None
        kind = type(module).__name__
        if type(module).forward is not self.base.forward:
            return Match(None, f"{kind} overrides torch.nn.{self.base.__name__}.forward")
        if (why := self.left_alone(module)) is not None:
            return Match(None, why)
        new = build_on_meta(lambda: self.build(module), module, self.parameters(module))
        return Match(self.finish(new), self.describe(kind))

    def left_alone(self, module: nn.Module) -> str | None:
        """Why `module` must stay as it is whatever it computes (default: `blocked`), or None."""
        return blocked(module)

    def parameters(self, module: nn.Module) -> tuple[str, ...]:
        """The names of `module`'s Parameters the replacement holds: its `weight` and `bias`, those it has."""
        return tuple(n for n in ("weight", "bias") if getattr(module, n, None) is not None)

    def build(self, module: nn.Module) -> nn.Module:
        """The replacement, on the meta device, without parameters of its own to keep."""
        raise NotImplementedError

    def finish(self, new: nn.Module) -> nn.Module:
        """The replacement once it holds the parameters (default: as it is)."""
        return new

    def describe(self, kind: str) -> str:
        """The report's reason for swapping a `kind` module."""
        return f"torch.nn.{self.base.__name__} -> kernel_pytorch.nn.{self.ours.__name__}"
