"""One op call on DTensors checked against the same call on whole tensors: the outputs' and gradients'
placements, their values within the tolerance table, and no collective on the way (tests/ops/test_sharding.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch.tolerances import compare, compare_reordered


@dataclass(frozen=True)
class Case:
    """One op on DTensors of a 1-D mesh.

    Fields:
        name: what the failure names.
        call: the op call, `call(*args)` -> an output or a tuple of them.
        make: `make(device)` -> the whole arguments (tensors and plain values), the same on every rank.
        placements: each argument's placement (None: passed as it is).
        outputs: each output's expected placement (None: not checked).
        grads: each argument's expected gradient placement (None or absent: no gradient).
        diff: the outputs that carry gradients.
    """

    name: str
    call: Callable[..., Any]
    make: Callable[[torch.device], tuple]
    placements: Sequence[Any]
    outputs: Sequence[Any]
    grads: Sequence[Any] = ()
    diff: Sequence[int] = (0,)


def randn(*shape: int, device: torch.device, seed: int = 0) -> Tensor:
    """Random values, the same on every rank (a generator of its own)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _outputs(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _check(name: str, actual: Tensor, expected: Tensor, summed: bool) -> None:
    if not actual.is_floating_point():
        assert torch.equal(actual, expected), name
        return
    # a Partial sum adds the ranks' partial sums: the whole sum in another order
    result = (compare_reordered if summed else compare)(actual, expected)
    assert result.passed, result.message(name)


def run_case(case: Case, mesh: Any) -> None:
    """`case` on DTensors of `mesh` against whole tensors (module docstring)."""
    from torch.distributed.tensor import Partial, Replicate, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    device = torch.device(mesh.device_type, torch.cuda.current_device()) if mesh.device_type == "cuda" else "cpu"
    args = case.make(torch.device(device))
    grads = tuple(case.grads) + (None,) * (len(args) - len(case.grads))
    whole = [a.detach().clone().requires_grad_(g is not None) if isinstance(a, Tensor) else a
             for a, g in zip(args, grads)]
    expected = _outputs(case.call(*whole))
    upstream = [randn(*expected[i].shape, device=device, seed=100 + i) for i in case.diff]
    if any(g is not None for g in grads):
        torch.autograd.backward([expected[i] for i in case.diff], upstream)

    sharded = [a if p is None else distribute_tensor(a.detach(), mesh, [p]).requires_grad_(g is not None)
               for a, p, g in zip(args, case.placements, grads)]
    # a Partial output's gradient is Replicate, as torch hands it back
    up = [distribute_tensor(u, mesh, [Replicate() if isinstance(case.outputs[i], Partial) else case.outputs[i]])
          for u, i in zip(upstream, case.diff)]
    with CommDebugMode() as comm:
        got = _outputs(case.call(*sharded))
        if any(g is not None for g in grads):
            torch.autograd.backward([got[i] for i in case.diff], up)
    assert comm.get_total_counts() == 0, f"{case.name}: collectives {dict(comm.get_comm_counts())}"
    for i, (out, want) in enumerate(zip(got, case.outputs)):
        if want is None:
            continue
        assert tuple(out.placements) == (want,), f"{case.name}: output {i} is {out.placements}, not ({want},)"
        _check(f"{case.name} output {i}", out.full_tensor(), expected[i], isinstance(want, Partial))
    for i, want in enumerate(grads):
        if want is None:
            continue
        grad = sharded[i].grad
        assert tuple(grad.placements) == (want,), f"{case.name}: grad {i} is {grad.placements}, not ({want},)"
        _check(f"{case.name} grad {i}", grad.full_tensor(), whole[i].grad, isinstance(want, Partial))
