"""The LM head's loss with its weight split over the vocabulary (tensor parallelism): each rank computes its
classes' logits chunk by chunk, and the ranks exchange O(rows) statistics, never the logits.

    vocab_parallel_linear_cross_entropy(x, weight, target, bias, *, group, mesh_dim, shard_sizes, **options)

weight is a DTensor Shard(0) over one dim of its mesh (what `parallelize_module` with ColwiseParallel on
the LM head leaves; call the loss on the head's weight instead of the head, so its output is never
made), or this rank's rows as a plain tensor with the group they are split over (`group=<ProcessGroup>`,
or a DeviceMesh and `mesh_dim`) and, optionally, every rank's row count (`shard_sizes`; by default one
all-gather of R integers finds them). Uneven splits are fine: torch's Shard(0) gives ceil(V / R) rows to
each rank, the last fewer. x, target and token_scale are the same on every rank of the group: plain
tensors or replicated DTensors. The loss (a plain tensor, the same on every rank) is
fused_linear_cross_entropy's over the whole vocabulary: the options of CrossEntropyOptions except class
weights and the argmax extras (return_z_loss is there).

Collectives, all over the vocabulary's group, through torch.distributed._functional_collectives
(functional all-reduces: they run on gloo and NCCL alike, and torch.compile traces them):
    forward, per chunk of rows: all_reduce max of (C,) row maxima, then all_reduce sum of (2, C) (3 with
        label smoothing): rescaled sums of exponentials, target logits (and logit sums).
        (reference/vocab_parallel_cross_entropy.py gives the math; a shard's chunks are C = 256 MiB of
        its logits wide, so at most a few.)
    backward: all_reduce sum of grad_x (x's shape and dtype): each rank's dz_r @ W_r is one term of it.
    grad_weight (and grad_bias) stay on their rank: each rank's rows are its own.
The upstream gradient must be the same on every rank (the loss is: every rank calls backward on it).

Paths: on CUDA with Triton (backend "auto" or "triton") each rank runs the chunked kernels of
ops/cross_entropy/vocab_parallel.py, which compute "mean"/"sum" gradients in the forward (the backward
scales them, in place on the eager path: a second backward through the same graph raises); elsewhere
the reference, chunk-free, recomputing the logits in the backward (logged once). torch.compile traces
the autograd function with its collectives (fullgraph); there a plain weight needs `shard_sizes`, since
gathering them reads the sizes on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from kernel_pytorch.functional._dispatch import Backend, _resolve, kernels
from kernel_pytorch.functional._vocab_shards import Group, Layout, resolve_layout
from kernel_pytorch.functional.cross_entropy import linear_grads_needed
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions
from kernel_pytorch.reference.cross_entropy_checks import (
    check_linear_args,
    check_options,
    check_target,
    check_target_range,
    check_token_scale,
)
from kernel_pytorch.reference.cross_entropy_extras import LossOutput, loss_output
from kernel_pytorch.reference.vocab_parallel_cross_entropy import (
    Reduce,
    VocabShard,
    no_reduce,
)
from kernel_pytorch.reference.vocab_parallel_cross_entropy import (
    vocab_parallel_linear_cross_entropy as reference_forward,
)
from kernel_pytorch.reference.vocab_parallel_cross_entropy import (
    vocab_parallel_linear_cross_entropy_backward as reference_backward,
)

NAME = "vocab_parallel_linear_cross_entropy"


def all_reduce(group: Any) -> Reduce:
    """The group's all-reduce as a functional collective (a new tensor; `no_reduce` for a group of one)."""
    if group is None:
        return no_reduce
    import torch.distributed._functional_collectives as funcol

    def reduce(t: Tensor, op: str) -> Tensor:
        out = funcol.all_reduce(t, op, group)
        return out.wait() if isinstance(out, funcol.AsyncCollectiveTensor) else out

    return reduce


class _Run(NamedTuple):
    """What the autograd function needs beside the tensors."""

    shard: VocabShard
    group: Any
    options: CrossEntropyOptions
    kernels: bool  # the chunked kernels (else the reference)
    eager: bool  # launch the kernels directly (not through wrap_triton)
    needs: tuple[bool, bool, bool]  # gradients of (x, weight, bias)


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    """loss, lse = f(x, weight, bias, target, token_scale) on this rank's shard; backward all-reduces grad_x."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,  # noqa: ANN001
                token_scale: Tensor | None, run: _Run) -> tuple[Tensor, Tensor]:
        reduce, o = all_reduce(run.group), run.options
        ctx.run, ctx.grads = run, None
        if run.kernels:
            k = kernels().cross_entropy
            args = k.FusedLinearArgs(weight, target, bias, None, token_scale)
            out = k.vocab_parallel.vocab_parallel_fwd(x, args, run.shard, reduce, o, needs=run.needs, eager=run.eager)
            loss, lse = out.loss, out.lse
            if o.reduction != "none":  # the gradients for an upstream gradient of 1, this backward's alone
                ctx.grads = (out.grad_x, out.grad_w, out.grad_b)
        else:
            loss, lse = reference_forward(x, weight, target, bias, shard=run.shard, reduce=reduce, options=o,
                                          token_scale=token_scale)
        ctx.save_for_backward(x, weight, bias, target, token_scale, lse)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss: Tensor, _dlse: Tensor | None) -> tuple:  # noqa: ANN001
        run = ctx.run
        x, weight, bias, target, token_scale, lse = ctx.saved_tensors
        if ctx.grads is not None:
            grads, ctx.grads = ctx.grads, None
            scale = kernels().cross_entropy.scale_grad_ if run.eager else kernels().cross_entropy.scaled_grad
            grads = tuple(scale(g, dloss, eager=run.eager) if g is not None else None for g in grads)
        elif run.kernels:
            if run.options.reduction != "none":
                raise RuntimeError("vocab_parallel_linear_cross_entropy can run its backward once only (the forward's "
                                   "gradients were scaled in place and handed out)")
            k = kernels().cross_entropy
            args = k.FusedLinearArgs(weight, target, bias, None, token_scale)
            grads = k.vocab_parallel.vocab_parallel_bwd(dloss, x, args, run.shard, lse, run.options, needs=run.needs,
                                                        eager=run.eager)
        else:
            grads = reference_backward(dloss, x, weight, target, lse, bias, shard=run.shard, options=run.options,
                                       token_scale=token_scale)
        dx, dw, db = (g if need else None for g, need in zip(grads, run.needs))
        if dx is not None:  # each rank's dz_r @ W_r is one term of grad_x
            dx = all_reduce(run.group)(dx, "sum")
        return dx, dw, db, None, None, None


def _check(layout: Layout, options: CrossEntropyOptions) -> None:
    """The metadata checks of the family on the local tensors, and the targets' range (a host sync)."""
    x, target = layout.x, layout.target
    check_linear_args(x, layout.weight, layout.bias)
    check_target(target, x.shape[:-1], x.device)
    check_options(options)
    check_token_scale(layout.token_scale, target)
    check_target_range(target, layout.shard.vocab, options.ignore_index)


def _check_extras(options: CrossEntropyOptions) -> None:
    """No argmax extras (a check of the options alone: it runs under compile too, where the call would
    otherwise return what it cannot compute)."""
    if options.return_token_accuracy or options.return_predicted_tokens:
        name = "return_token_accuracy" if options.return_token_accuracy else "return_predicted_tokens"
        raise ValueError(f"{name}: the vocabulary-parallel loss returns the loss and return_z_loss only (an argmax "
                         "over the whole vocabulary would take another all-reduce)")


def vocab_parallel_linear_cross_entropy(
    x: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    group: Group = None,
    mesh_dim: int | str | None = None,
    shard_sizes: Sequence[int] | None = None,
    token_scale: Tensor | None = None,
    backend: Backend = "auto",
    **options: Any,
) -> Tensor | LossOutput:
    """cross_entropy(x @ weight.T + bias, target) over a vocabulary split by rows over a group of ranks,
    no rank holding all the logits (module docstring).

    Args:
        x: (..., H) fp32/bf16/fp16, the same on every rank (plain, or a replicated DTensor).
        weight: (V, H) DTensor Shard(0) over one mesh dim, or this rank's (V_r, H) rows; x's dtype.
        target: (...) global class indices or ignore_index, the same on every rank.
        bias: (V,) DTensor of weight's placements, or this rank's (V_r,) rows, or None.
        group: for a plain weight, the ProcessGroup of its shards, or a DeviceMesh (with mesh_dim when it has
            several dims); None in a single process. For a DTensor weight, None or its mesh.
        mesh_dim: the mesh dim (name or index) the vocabulary is split over; for a DTensor weight a check.
        shard_sizes: for a plain weight, every rank's row count in group rank order (default: gathered).
        token_scale, backend: as in fused_linear_cross_entropy.
        options: the fields of `CrossEntropyOptions` by name, as in fused_linear_cross_entropy, but for
            return_token_accuracy and return_predicted_tokens (a ValueError: module docstring).
    Returns:
        fp32 loss (fp64 for fp64 x): 0-d, or target's shape for "none"; a LossOutput with return_z_loss.
    """
    options = CrossEntropyOptions.from_keywords(NAME, options)
    return vocab_parallel_linear_cross_entropy_with(x, weight, target, bias, options, group=group, mesh_dim=mesh_dim,
                                                    shard_sizes=shard_sizes, token_scale=token_scale, backend=backend)


def vocab_parallel_linear_cross_entropy_with(
    x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, options: CrossEntropyOptions, *,
    group: Group = None, mesh_dim: int | str | None = None, shard_sizes: Sequence[int] | None = None,
    token_scale: Tensor | None = None, backend: Backend = "auto",
) -> Tensor | LossOutput:
    """`vocab_parallel_linear_cross_entropy` with its options as one object (the arguments as there)."""
    _check_extras(options)
    compiling = torch.compiler.is_compiling()
    layout = resolve_layout(x, weight, bias, target, token_scale, group, mesh_dim, shard_sizes)
    if not compiling:
        _check(layout, options)
    path = _resolve(backend, NAME, layout.x, compiling)
    use_kernels = path == "eager" or (path == "op" and layout.x.is_cuda)
    needs = linear_grads_needed(x, weight, bias)
    run = _Run(layout.shard, layout.group, options, use_kernels, path == "eager", needs)
    loss, lse = _VocabParallelLinearCrossEntropy.apply(layout.x, layout.weight, layout.bias, layout.target,
                                                       layout.token_scale, run)
    if not options.extras:
        return loss
    return loss_output(loss, lse, None, layout.target, options, layout.token_scale)


__all__ = ["vocab_parallel_linear_cross_entropy", "vocab_parallel_linear_cross_entropy_with"]
