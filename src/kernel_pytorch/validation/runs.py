"""Running the two models for validation: one forward (and backward) with gradients keyed by what they
differentiate, and parameters matched by name (each seed's inputs come from `inputs.py`, the fp64 copy
of the original from `reference64.py`).

Nothing here judges a result; `checks.py` compares the runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._tree import bitwise_equal, call, flatten, map_tensors
from kernel_pytorch.benchmark.module import upstream_gradients, with_input_grads
from kernel_pytorch.validation.options import Reference

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


__all__ = [
    "GradOutputs", "InputsArg", "Reference", "Run", "bitwise_equal", "matched_params", "named", "run_model",
]
