"""Running the two models for validation: one forward (and backward) with gradients keyed by what they
differentiate, fresh inputs per seed, the fp64 copy of the original, and parameters matched by name.

Nothing here judges a result; `checks.py` compares the runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from kernel_pytorch._tree import as_inputs, call, flatten, map_tensors, tensors
from kernel_pytorch.benchmark.module import infer_device, upstream_gradients, with_input_grads

Reference = Literal["auto", "fp64", "none"]
InputsArg = Any  # tuple | list | dict | Tensor | Callable[[int], those]
GradOutputs = list[tuple[str, torch.dtype]]  # (output name, dtype its upstream gradient is rounded to)


@dataclass(frozen=True)
class Run:
    """One model's outputs (detached) and gradients on one seed's inputs."""

    outputs: Any
    grads: dict[str, Tensor | None]  # "grad(input[0])", "grad(param 'w')" -> gradient
    missing_grad_outputs: list[str]  # outputs asked for that carried no gradient
    differentiated: GradOutputs  # outputs whose upstream gradient was fed in


def _float_leaves(out: Any) -> list[tuple[str, Tensor]]:
    return [(n, t) for n, t in flatten(out, "output")
            if isinstance(t, Tensor) and (t.is_floating_point() or t.is_complex())]


def run_model(
    model: Callable[..., Any],
    named_params: Sequence[tuple[str, nn.Parameter]],
    inputs: tuple | dict,
    *,
    with_grads: bool,
    seed: int,
    grad_outputs: Sequence[tuple[str, torch.dtype]] | None,
) -> Run:
    """One forward (and backward): outputs detached, gradients keyed by what they differentiate.

    Args:
        model: the module (or a compiled wrapper of it).
        named_params: (name, parameter) pairs to differentiate, named as in the report.
        inputs: positional args (tuple) or keyword args (dict); floating tensors get requires_grad.
        with_grads: also run the backward.
        seed: picks the fixed upstream gradient of each output.
        grad_outputs: (output name, dtype the upstream gradient is rounded to) to differentiate;
            None means every differentiable output (the original's run decides this list).
    """
    args = with_input_grads(inputs) if with_grads else inputs
    with torch.enable_grad() if with_grads else torch.no_grad():
        out = call(model, args)
    grads: dict[str, Tensor | None] = {}
    missing: list[str] = []
    used: GradOutputs = []
    if with_grads:
        leaves = dict(_float_leaves(out))
        wanted = grad_outputs if grad_outputs is not None else [
            (n, t.dtype) for n, t in leaves.items() if t.requires_grad]
        outs, dtypes = [], []
        for name, dtype in wanted:
            t = leaves.get(name)
            if t is None or not t.requires_grad:
                missing.append(name)
                continue
            outs.append(t)
            dtypes.append(dtype)
            used.append((name, dtype))
        in_leaves = [(f"grad({n})", t) for n, t in flatten(args, "input")
                     if isinstance(t, Tensor) and t.requires_grad]
        param_leaves = [(f"grad(param {n!r})", p) for n, p in named_params]
        wrt = [t for _, t in in_leaves] + [p for _, p in param_leaves]
        if outs and wrt:
            # one fixed upstream gradient per output, a function of (seed, output order, shape) only
            upstream = upstream_gradients(outs, 10_000 + seed, round_to=dtypes)
            got = torch.autograd.grad(outs, wrt, upstream, allow_unused=True)
            for (name, _), g in zip(in_leaves + param_leaves, got):
                grads[name] = g.detach() if g is not None else None
    return Run(map_tensors(lambda t: t.detach(), out), grads, missing, used)


def redraw(example: tuple | dict, seed: int) -> tuple | dict:
    """Fresh random inputs shaped like `example`: floats keep the example's mean and spread, integers
    stay within its range, bools and non-tensors are reused."""
    gen = torch.Generator().manual_seed(seed)

    def draw(t: Tensor) -> Tensor:
        if t.is_floating_point():
            ref = t.detach().float()
            mean = float(ref.mean()) if ref.numel() else 0.0
            std = float(ref.std()) if ref.numel() > 1 else 0.0
            if not std > 0:
                std = max(abs(mean), 1.0)
            new = torch.randn(t.shape, generator=gen) * std + mean
            return new.to(dtype=t.dtype, device=t.device)
        if t.dtype == torch.bool or t.is_complex() or t.numel() == 0:
            return t.clone()
        lo, hi = int(t.min()), int(t.max())
        return torch.randint(lo, hi + 1, t.shape, generator=gen).to(dtype=t.dtype, device=t.device)

    return map_tensors(draw, example)


def inputs_for(inputs: InputsArg, seed: int, first_seed: int) -> tuple | dict:
    """The inputs of `seed`: a callable's `inputs(seed)`; else the example itself for the first seed
    and a `redraw` of it for the others."""
    if callable(inputs) and not isinstance(inputs, (Tensor, nn.Module)):
        return as_inputs(inputs(seed))
    base = as_inputs(inputs)
    return base if seed == first_seed else redraw(base, seed)


def to_fp64(t: Tensor) -> Tensor:
    """A floating tensor detached and cast to float64; other tensors as they are."""
    return t.detach().to(torch.float64) if t.is_floating_point() else t


def fp64_copy(original: nn.Module, inputs: tuple | dict, mode: Reference) -> tuple[nn.Module | None, str]:
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
        return copy.deepcopy(original).to(torch.float64), "fp64 copy of the original"
    except Exception as exc:
        return None, f"none: the original cannot be copied to fp64 ({type(exc).__name__}: {exc})"


def matched_params(original: nn.Module, optimized: nn.Module) -> tuple[list[str], list[str]]:
    """Names of trainable parameters both modules have with the same shape; and notes on the rest."""
    orig = {n: p for n, p in original.named_parameters() if p.requires_grad}
    opt = {n: p for n, p in optimized.named_parameters() if p.requires_grad}
    shared = [n for n in orig if n in opt and orig[n].shape == opt[n].shape]
    notes = []
    only_orig = [n for n in orig if n not in shared]
    only_opt = [n for n in opt if n not in shared]
    if only_orig or only_opt:
        notes.append(
            f"gradients not compared for parameters without a same-named, same-shaped twin: "
            f"original {only_orig[:5]}{'...' if len(only_orig) > 5 else ''}, "
            f"optimized {only_opt[:5]}{'...' if len(only_opt) > 5 else ''}"
        )
    return shared, notes


def named(module: nn.Module, names: Sequence[str]) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of `module` for each of `names`."""
    params = dict(module.named_parameters())
    return [(n, params[n]) for n in names]


def bitwise_equal(a: Tensor, b: Tensor) -> bool:
    """Same shape, dtype and bytes (NaNs with the same bits compare equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.detach().reshape(-1).contiguous().view(torch.uint8),
                       b.detach().reshape(-1).contiguous().view(torch.uint8))


__all__ = [
    "GradOutputs", "InputsArg", "Reference", "Run", "bitwise_equal", "fp64_copy", "inputs_for", "matched_params",
    "named", "redraw", "run_model", "to_fp64",
]
