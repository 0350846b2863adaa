"""The fp64 reference behind the budget: a copy of the original in float64, run on the inputs cast to
float64.

Some layers refuse float64: transformers' fused MoE experts call `torch._grouped_mm`, which takes fp32,
bf16 and fp16 only. Without a reference the budget is gone and rounding-level differences elsewhere in
the model (a fused loss summing in another order, 2e-5 on an embedding gradient) fail the bare table.
So a layer whose forward raises in float64 runs in float32 inside the copy instead: its parameters
go back to fp32 (the original's own values: fp32 -> fp64 -> fp32 is exact), its inputs are rounded to
fp32 on the way in and its outputs widened to fp64 on the way out. Every other layer stays in float64.
The reference's own error is then the fp32 error of those layers alone, which the original and the
optimized model both make in the same layers (they are not swapped), so the budget (the optimized
model's error against this reference, at most a multiple of the original's) stays a fair test of the rest.
The report's reference label names the layers that ran in fp32.

The failing layer is found by forward pre/post hooks on every submodule of the copy (the innermost
module whose forward was entered and not left when the exception came); the copy is private, so the
hooks touch nothing of the user's.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._tree import map_tensors, tensors
from kernel_pytorch.benchmark.module import infer_device
from kernel_pytorch.validation.runs import GradOutputs, Reference, Run, named, run_model

# how many layers may be moved to fp32 before the reference is given up
MAX_FP32_LAYERS = 64


def to_fp64(t: Tensor) -> Tensor:
    """A floating tensor detached and cast to float64; other tensors as they are."""
    return t.detach().to(torch.float64) if t.is_floating_point() else t


def _cast(obj: Any, src: torch.dtype, dst: torch.dtype) -> Any:
    return map_tensors(lambda t: t.to(dst) if t.dtype == src else t, obj)


class _Innermost:
    """Which submodule's forward was running (entered, not left) when the model raised."""

    def __init__(self, model: nn.Module) -> None:
        self.stack: list[str] = []
        self.handles = []
        for name, sub in model.named_modules():
            self.handles.append(sub.register_forward_pre_hook(lambda m, a, n=name: self._enter(n)))
            self.handles.append(sub.register_forward_hook(lambda m, a, o: self._leave()))

    def _enter(self, name: str) -> None:
        self.stack.append(name)

    def _leave(self) -> None:  # returns None: a forward hook's return value would replace the output
        self.stack.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _run_in_fp32(layer: nn.Module) -> None:
    """Make `layer` compute in fp32 between fp64 neighbours (module docstring)."""
    layer.to(torch.float32)
    down = torch.float64, torch.float32
    layer.register_forward_pre_hook(lambda m, args, kwargs: (_cast(args, *down), _cast(kwargs, *down)),
                                    with_kwargs=True)
    layer.register_forward_hook(lambda m, args, out: _cast(out, torch.float32, torch.float64))


class Fp64Reference:
    """The fp64 copy of the original and the layers inside it that run in fp32 (module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.fp32_layers: list[str] = []

    @property
    def label(self) -> str:
        if not self.fp32_layers:
            return "fp64 copy of the original"
        names = ", ".join(self.fp32_layers[:4]) + (", ..." if len(self.fp32_layers) > 4 else "")
        return (f"fp64 copy of the original, {len(self.fp32_layers)} layer(s) in fp32 as they refuse fp64 "
                f"({names})")

    def run(self, shared: list[str], args: tuple | dict, *, with_grads: bool, seed: int,
            grad_outputs: GradOutputs | None) -> Run:
        """`run_model` of the copy on `args` cast to fp64, moving a layer that raises in fp64 to fp32 and
        trying again; re-raises what no such move explains (a failure outside any submodule, in the
        backward, or in a layer already in fp32)."""
        args64 = map_tensors(to_fp64, args)
        while True:
            tracker = _Innermost(self.module)
            try:
                return run_model(self.module, named(self.module, shared), args64, with_grads=with_grads, seed=seed,
                                 grad_outputs=grad_outputs)
            except Exception:
                failed = tracker.stack[-1] if tracker.stack else ""
                inside = any(failed == n or failed.startswith(n + ".") for n in self.fp32_layers)
                if not failed or inside or len(self.fp32_layers) >= MAX_FP32_LAYERS:
                    raise
                _run_in_fp32(self.module.get_submodule(failed))
                self.fp32_layers.append(failed)
            finally:
                tracker.remove()


def fp64_copy(original: nn.Module, inputs: tuple | dict, mode: Reference) -> tuple[Fp64Reference | None, str]:
    """An fp64 copy of the original for the budget, or None and why not."""
    if mode == "none":
        return None, "none (reference='none'): table only"
    floats = [t for t in list(original.parameters()) + list(original.buffers()) + tensors(inputs)
              if t.is_floating_point()]
    if not floats:
        return None, "none: no floating-point inputs or parameters"
    if mode == "auto" and all(t.dtype == torch.float64 for t in floats):
        return None, "none: the original already runs in fp64 (table only)"
    size = sum(t.numel() for t in list(original.parameters()) + list(original.buffers())) * 8
    dev = infer_device(original, inputs)
    if mode == "auto" and dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        if size > free // 4:  # leave room for activations of three models
            return None, f"none: an fp64 copy ({size / 2**30:.1f} GiB) would not fit comfortably"
    try:
        ref = Fp64Reference(copy.deepcopy(original).to(torch.float64))
    except Exception as exc:
        return None, f"none: the original cannot be copied to fp64 ({type(exc).__name__}: {exc})"
    return ref, ref.label


__all__ = ["MAX_FP32_LAYERS", "Fp64Reference", "fp64_copy", "to_fp64"]
