"""Several Linears of one input (an attention block's q/k/v, a gated MLP's gate/up), whose backward sums
the input's gradient inside the GEMMs.

    shared_input_linears(x, (W_1, ..., W_n), (b_1, ..., b_n)) = (x @ W_1.T + b_1, ..., x @ W_n.T + b_n)

Composed of n Linears, autograd (and Inductor, under torch.compile) computes dx as n GEMMs into n
buffers and then adds them: an elementwise pass that reads n (N, H) tensors and writes one, after each
GEMM wrote its own. Here the backward writes the first product into dx and adds each further product
to it inside the GEMM (cuBLAS's beta = 1 epilogue reads dx as it writes it: ops/_common/gemm_into.py, an op
declaring its mutation, so compile keeps it in place): no add kernel, no n - 1 product buffers, and
each product rounds once, into the running sum, where the composed graph rounds each product and each
add. At an 8-layer Llama's 4 x 2048 tokens and H = 2048 that removes, per layer, a 3-input add over
32 MiB tensors (q/k/v) and a 2-input one (gate/up).

The weight gradients are the composed graph's: dW_i = d_i.T @ x, db_i = d_i summed over rows. What is
kept for the backward is x and the weights, as for n Linears (a norm output x is made again in the
backward where nn/_recompute.py arranges it: this function's saved x is a saved tensor like any).

An output that gets no gradient adds nothing in eager mode (its weight's gradient is None, as for a
Linear); inside a compiled graph its gradient is zeros, so its weight's gradient is zeros too.

Taken where gradients are recorded, x and every weight and bias are plain tensors of one dtype and
device, autocast is off and torch.export is not tracing (an exported program has no backward);
anywhere else the n Linears run as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch._env import is_plain_tensor
from kernel_pytorch.functional._dispatch import _exporting, _fusable


def _fused(x: Tensor, params: Sequence[Tensor | None]) -> bool:
    """The gated MLP's op-path condition (functional/mlp._recompute_h), for a plain x."""
    return is_plain_tensor(x) and _fusable(x, params) and not _exporting()


def _accumulate(dx: Tensor, d: Tensor, w: Tensor) -> Tensor:
    """dx += d @ w in the GEMM: in place in eager mode; traced, the registered op that compile keeps in
    place (an out-of-place addmm where kernel_pytorch.ops cannot load, without Triton)."""
    if not torch.compiler.is_compiling():
        return dx.addmm_(d, w)
    try:
        from kernel_pytorch.ops._common.gemm_into import gemm_into
    except ImportError:
        return torch.addmm(dx, d, w)
    return gemm_into(dx, d, w, True)


class _SharedInputLinears(torch.autograd.Function):
    """(x, n, W_1..W_n, b_1..b_n) -> (x W_1^T + b_1, ..., x W_n^T + b_n); module docstring."""

    @staticmethod
    def forward(ctx, x: Tensor, n: int, *params: Tensor | None) -> tuple[Tensor, ...]:  # type: ignore[override]
        weights, biases = params[:n], params[n:]
        ctx.save_for_backward(x, *weights)
        ctx.set_materialize_grads(False)  # an output without a gradient adds nothing (no GEMM of zeros)
        ctx.n = n
        ctx.has_bias = tuple(b is not None for b in biases)
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, *weights = ctx.saved_tensors
        n = ctx.n
        needs = ctx.needs_input_grad  # x, n, W_1..W_n, b_1..b_n
        x2 = x.reshape(-1, x.shape[-1])
        ds = [None if g is None else g.reshape(-1, g.shape[-1]) for g in grads]
        dx = None
        if needs[0]:
            for d, w in zip(ds, weights):
                if d is None:
                    continue
                dx = d @ w if dx is None else _accumulate(dx, d, w)
            dx = torch.zeros_like(x) if dx is None else dx.view(x.shape)
        dws = [d.t() @ x2 if d is not None and needs[2 + i] else None for i, d in enumerate(ds)]
        dbs = [d.sum(0) if d is not None and ctx.has_bias[i] and needs[2 + n + i] else None
               for i, d in enumerate(ds)]
        return (dx, None, *dws, *dbs)


def shared_input_linears(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None,
                         ) -> tuple[Tensor, ...]:
    """`F.linear(x, W_i, b_i)` for each i, the input's gradient summed inside the GEMMs (module docstring).

    Args:
        x: (..., H) input.
        weights: n (O_i, H) weights; biases: n (O_i,) biases or None (default: no bias).
    Returns:
        n tensors (..., O_i), as F.linear gives them.
    """
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    if len(biases) != len(weights):
        raise ValueError(f"biases must give one entry per weight ({len(weights)}; got {len(biases)})")
    params = (*weights, *biases)
    if len(weights) < 2 or not _fused(x, params):
        return tuple(F.linear(x, w, b) for w, b in zip(weights, biases))
    return _SharedInputLinears.apply(x, len(weights), *params)


__all__ = ["shared_input_linears"]
