"""The correctness gate a provider passes before it is timed.

Forward and backward (with a fixed upstream gradient) on random inputs of the benchmark's own shape,
so the very kernels and compiled graphs that are then timed are the ones checked, against
kernel_pytorch.reference run in the input dtype and in fp64:

* outputs and input gradients: the tolerance table, else the fp64-derived budget against the reference
  rounded to this dtype (eager) or against eager's own error (every other provider);
* parameter gradients, which sum over every row: eager's are PyTorch's own accumulation and so define
  the budget; every other provider's must meet it.

Providers run on copies of the inputs, so one that writes into them (in place) is still checked
against the reference on the inputs as drawn.

The checks run in float64 on the host, so large tensors of rows (anything with 2+ dims: (rows, cols),
(batch, heads, tokens, head_dim)) are checked on an evenly spaced sample of rows of their last dim;
1-d tensors (weight and bias gradients) are checked whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch._tree import tensors
from kernel_pytorch.benchmark.module import upstream_gradients
from kernel_pytorch.benchmark.suites.providers import Impl, bind
from kernel_pytorch.benchmark.suites.spec import OpBench, Shape
from kernel_pytorch.validation.compare import TensorCheck, check_tensor

GATE_MAX_ELEMENTS = 1 << 22
GATE_MIN_ROWS = 8
GATE_SEED = 1234

GateResult = tuple[list[Tensor], list[Tensor | None]]
"""A provider's (outputs, gradients) from the gate: eager's are the others' yardstick."""


def gate_rows(rows: int, cols: int) -> list[int] | None:
    """Row indices the gate checks of a (rows, cols) tensor (None: all), at most ~4M elements' worth."""
    n = max(GATE_MIN_ROWS, GATE_MAX_ELEMENTS // cols)
    if rows <= n:
        return None
    # evenly spaced, first and last included: every program of a row-parallel grid gets looked at
    return sorted({round(k * (rows - 1) / (n - 1)) for k in range(n)})


def tensor_rows(t: Tensor) -> list[int] | None:
    """`gate_rows` of a tensor seen as rows of its last dim (None for 0-d and 1-d tensors)."""
    if t.dim() < 2 or t.numel() == 0:
        return None
    return gate_rows(t.numel() // t.shape[-1], t.shape[-1])


def _unravel(flat: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The index into `sizes` of row `flat` of the flattened leading dims."""
    index = []
    for size in reversed(sizes):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def check_sampled(name: str, actual: Tensor, expected: Tensor, base: Tensor | None, hi: Tensor,
                  rows: list[int] | None) -> TensorCheck:
    """`check_tensor` on rows `rows` of the last dim only (all when None); the worst index and the
    shape reported are those of the full tensor."""
    if rows is None:
        return check_tensor(name, actual, expected, baseline_lowp=base, reference_hi=hi)
    lead = actual.shape[:-1]
    idx = torch.tensor(rows, device=actual.device)

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.reshape(-1, t.shape[-1]).index_select(0, idx.to(t.device))

    c = check_tensor(name, pick(actual), pick(expected), baseline_lowp=pick(base), reference_hi=pick(hi))
    where = c.worst_index
    if where:
        where = (*_unravel(rows[where[0]], tuple(lead)), *where[1:])
    n_rows = actual.numel() // actual.shape[-1]
    note = f"{len(rows)} of {n_rows} rows checked" + (f"; {c.note}" if c.note else "")
    return dataclasses.replace(c, worst_index=where, shape=tuple(actual.shape), note=note)


def _expected(spec: OpBench, t: dict[str, Tensor], ups: list[Tensor], cast: Callable[[Tensor], Tensor]) -> GateResult:
    """The reference's outputs and gradients on `t` cast by `cast` (identity, or to fp64)."""
    ref_in = {}
    for k in spec.arg_names:
        v = t[k].detach()
        v = cast(v) if v.is_floating_point() else v
        ref_in[k] = v.requires_grad_(True) if k in spec.grad_names else v
    with torch.enable_grad():
        outs = tensors(spec.reference(*(ref_in[k] for k in spec.arg_names)))
    if not spec.grad_names:  # forward only
        return [o.detach() for o in outs], []
    up = [u.to(o.dtype) for u, o in zip(ups, outs)]
    grads = torch.autograd.grad(outs, [ref_in[n] for n in spec.grad_names], up)
    return [o.detach() for o in outs], list(grads)


def gate(spec: OpBench, impl: Impl | Callable[..., Any], shape: Shape, dtype: torch.dtype, device: torch.device,
         eager_result: GateResult | None, seed: int = GATE_SEED) -> tuple[list[TensorCheck], GateResult]:
    """Forward and backward of a provider against kernel_pytorch.reference on random inputs.

    Args:
        spec: the op benchmark.
        impl: the provider's code (`Impl`, or a plain callable taking the inputs positionally).
        shape: the benchmark shape to run at.
        eager_result: eager's (outputs, grads) on the same inputs (the budget's yardstick); None when
            the provider is eager itself.
    Returns:
        (checks, (outputs, grads)) of this provider.
    """
    impl = impl if isinstance(impl, Impl) else Impl(impl)
    op = spec.name
    t = spec.make_inputs(shape, dtype, device, seed)
    # the provider gets copies and the reference sees the inputs as drawn: a provider may write into its
    # inputs (Liger's rope rotates q and k in place, its cross-entropy writes the gradient over the
    # logits; an in-place backward, Liger's SwiGLU or ours with inplace_backward, writes over them)
    bound = bind(spec, impl, {k: v.clone() for k, v in t.items()}, grad=True)
    with torch.enable_grad():
        outs = tensors(bound.call())
    ups = upstream_gradients(outs, seed)
    # clones: an in-place backward (Liger's default) may overwrite the upstream gradient it is given;
    # an op with no grad_names (a decoding step) is gated forward only
    grads = list(torch.autograd.grad(outs, bound.wrt, [g.clone() for g in ups], allow_unused=True)
                 if spec.grad_names else [])
    outs = [o.detach() for o in outs]
    del bound

    # the reference computes in fp64 when given fp64: the budget's high-precision yardstick
    (lo_out, lo_grad), (hi_out, hi_grad) = (_expected(spec, t, ups, c) for c in (lambda v: v, lambda v: v.double()))
    if eager_result is not None:
        base_out, base_grad = eager_result
    else:
        # eager itself: outputs and input gradients are held to the reference (table, or the budget
        # measured against the reference rounded to this dtype); its parameter gradients, sums over
        # every row, are PyTorch's own accumulation and so define the budget rather than face it
        base_out = None
        base_grad = [g if n in spec.param_names else None for n, g in zip(spec.grad_names, grads)]
    checks: list[TensorCheck] = []
    for i, name in enumerate(spec.out_names):
        checks.append(check_sampled(f"{op} {name}", outs[i], lo_out[i], base_out[i] if base_out else None,
                                    hi_out[i], tensor_rows(outs[i])))
    for i, name in enumerate(spec.grad_names):
        if grads[i] is None:
            checks.append(TensorCheck(f"{op} d{name}", False, "structure", note="no gradient"))
            continue
        checks.append(check_sampled(f"{op} d{name}", grads[i], lo_grad[i], base_grad[i], hi_grad[i],
                                    tensor_rows(grads[i])))
    return checks, (outs, [g.detach() if g is not None else None for g in grads])


__all__ = ["GATE_MAX_ELEMENTS", "GATE_MIN_ROWS", "GATE_SEED", "GateResult", "check_sampled", "gate", "gate_rows",
           "tensor_rows"]
