"""Rotary position embeddings: `apply_rotary` rotates q and k together (one kernel launch on CUDA).

Semantics are transformers' `apply_rotary_pos_emb` (reference/rope.py is the specification), extended
to cos/sin tables indexed by position_ids, the interleaved (GPT-J) pairing and partial rotary widths.
The argument checks run once per eager call (reference/rope_checks.py); the backend is resolved as for
every family (functional/_dispatch.py).

In place. The registered op `kernel_pytorch::rope_fwd` is out of place: it returns new tensors, so
compile and export see a functional op and no aliasing needs declaring. `inplace=True` writes the
rotation back into q and k. On the eager CUDA path that is `_RopeInplace` below, a plain
autograd.Function that launches the kernel in place (no new tensors; `mark_dirty`, so autograd
versions q and k), except for views that record gradients: autograd lets no Function dirty two view
inputs, so those (q and k of a fused QKV projection) take the out-of-place kernel and a copy. On every
other path (the registered op under compile/export and on CPU, the reference) the out-of-place result
is copied into q and k, which is what a functionalised graph does with an in-place op anyway. The
in-place variant is not a registered op because an op that mutates two inputs, possibly overlapping
views of one fused QKV tensor, would have to declare both in `mutates_args`, and two mutated views of
one base are beyond what such an op can promise under functionalisation; the copy has no such question.

DTensor q and k (tensor parallelism's head-sharded attention) run the registered op, whose sharding rule
rotates each rank's heads (ops/rope/__init__.py). cos, sin and position ids given as plain tensors are
taken as replicated (every rank computes the same tables from the same positions).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch._env import is_dtensor
from kernel_pytorch.functional._dispatch import Backend, _records_grad, _resolve, kernels, replicated_like
from kernel_pytorch.reference.rope_checks import RopeShape, check_position_range, check_rope_args

# Argument signatures that passed `check_rope_args` (types, shapes, dtypes, devices, layout): a decode
# loop meets one signature every step, and the checks cost tens of microseconds of Python per call
# where the signature's lookup costs a few. Failures are never stored: a bad call raises every time.
_CHECKED: dict[tuple, RopeShape] = {}
MAX_CHECKED = 1024


def _checked_shape(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int
) -> RopeShape:
    """check_rope_args, remembered per argument signature (everything the checks read)."""
    try:
        key = (
            type(q), type(k), type(cos), type(sin), q.shape, k.shape, cos.shape, sin.shape, q.dtype, k.dtype,
            cos.dtype, sin.dtype, q.device, k.device, cos.device, sin.device, unsqueeze_dim,
            None if position_ids is None else (type(position_ids), position_ids.shape, position_ids.dtype,
                                               position_ids.device),
        )
        shape = _CHECKED.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable argument: the checks name it
        return check_rope_args(q, k, cos, sin, position_ids, unsqueeze_dim)
    if shape is None:
        shape = check_rope_args(q, k, cos, sin, position_ids, unsqueeze_dim)
        if len(_CHECKED) >= MAX_CHECKED:
            _CHECKED.clear()
        _CHECKED[key] = shape
    return shape


class _RopeInplace(torch.autograd.Function):
    """Eager CUDA in-place rotation: the launchers with inplace=True; backward: the inverse rotation
    of the upstream gradients into new tensors (they may be shared or read elsewhere)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding):  # noqa: ANN001
        launch = kernels().rope
        launch.rope_fwd(q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding, inplace=True, eager=True)
        ctx.mark_dirty(q, k)
        ctx.save_for_backward(cos, sin, position_ids)
        ctx.options = (interleaved, unsqueeze_dim, hf_rounding)
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):  # noqa: ANN001
        cos, sin, position_ids = ctx.saved_tensors
        dq, dk = kernels().rope.rope_bwd(dq, dk, cos, sin, position_ids, *ctx.options, eager=True)
        return dq, dk, None, None, None, None, None, None


def apply_rotary(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    *,
    position_ids: Tensor | None = None,
    interleaved: bool = False,
    unsqueeze_dim: int = 1,
    inplace: bool = False,
    hf_rounding: bool = False,
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor]:
    """Rotate q and k by the rotary position embedding (both in one kernel launch on CUDA).

    Args:
        q: (B, Hq, T, D) (unsqueeze_dim=1, transformers' attention layout) or (B, T, Hq, D)
            (unsqueeze_dim=2), fp32/bf16/fp16, any strides (views of a fused QKV projection too).
        k: the same layout and dtype with Hk heads (GQA: Hk may differ from Hq).
        cos, sin: without position_ids, transformers' rows (B or 1, T, r) or (T, r), as its
            RotaryEmbedding returns them; with position_ids, (P, r) tables (row p: position p), as
            `kernel_pytorch.nn.RotaryEmbedding.table` returns them. r <= D and even: the first r
            features of each head rotate, the rest pass through (partial rotary). Any float dtype.
        position_ids: None, or integer (T,), (1, T) or (B, T) rows of the tables (packed sequences,
            left padding, decoding offsets). Out-of-range ids raise on CPU; on CUDA (no host sync)
            the kernel writes NaN rows for them instead of reading outside the table.
        interleaved: pairs (2i, 2i + 1) (GPT-J, Meta's original code) instead of rotate-half
            (i, i + r/2); cos/sin must be laid out to match (`RotaryEmbedding(interleaved=True)`).
        unsqueeze_dim: where the heads are, as in transformers' apply_rotary_pos_emb.
        inplace: write the result into q and k (and return them); their autograd stays correct.
            q and k must then not be leaves that require grad, as for any in-place op.
        hf_rounding: round each product to q's dtype as transformers' eager code does (bitwise its
            result) instead of fp32 math rounded once.
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
    Returns:
        (q_embed, k_embed) with q's and k's shapes and dtypes.
    Raises:
        TypeError/ValueError naming the argument: head dims that differ, an odd or too wide rotary
        dim, cos/sin of the wrong length, position ids of the wrong shape or (CPU) beyond the table.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        shape = _checked_shape(q, k, cos, sin, position_ids, unsqueeze_dim)
        if position_ids is not None and position_ids.device.type != "cuda":
            check_position_range(position_ids, shape.n_positions)
    path = _resolve(backend, "apply_rotary", q, compiling)
    if is_dtensor(q):
        cos, sin, position_ids = replicated_like(q, cos, sin, position_ids)
    if path == "eager":
        if inplace and not (_records_grad(q, k) and (q._is_view() or k._is_view())):
            return _RopeInplace.apply(q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding)
        # a Function that dirties a view input may return only one tensor (autograd's rule), so views
        # that record gradients (q and k of a fused QKV projection) take the out-of-place kernel and a copy
        qo, ko = kernels().rope_eager(q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding)
        return (q.copy_(qo), k.copy_(ko)) if inplace else (qo, ko)
    if path == "op":
        qo, ko = torch.ops.kernel_pytorch.rope_fwd(
            q, k, cos, sin, position_ids, interleaved, unsqueeze_dim, hf_rounding
        )
    else:
        qo, ko = reference.rope(q, k, cos, sin, position_ids, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim,
                                hf_rounding=hf_rounding)
    if inplace:
        return q.copy_(qo), k.copy_(ko)
    return qo, ko
