"""Which rotary kernel runs, with what launch, for given inputs: `launch` (the launchers' body) and the
eager plan cache.

`build_plan` picks the kernel from the `RopeConfig` in force (config.py): `schedule` wherever it
applies ("flat" needs q, k and their outputs dense in (B, H, T, D) or (B, T, H, D) order), else the
config's fallback for the pairing; the kernel module's `plan` then gives (kernel, grid, scalars,
constexprs). Eager calls remember the plan by the inputs' shapes and strides, the flags and the config
object (a decode step meets the same key every call): planning costs tens of microseconds of Python per
call, the lookup a few.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.ops.rope import flat, tile, token
from kernel_pytorch.ops.rope.call import Flags, Operands, Options, Sizes
from kernel_pytorch.ops.rope.config import RopeConfig

# Eager launch plans by key (see the module docstring): a cache, emptied when full, never tuning state.
_PLANS: dict[tuple, tuple | None] = {}
MAX_PLANS = 1024


def _bthd_strides(x: Tensor, unsqueeze_dim: int) -> tuple[int, int, int, int]:
    """(batch, token, head, feature) strides of a (B, H, T, D) (unsqueeze_dim=1) or (B, T, H, D) tensor."""
    s = x.stride()
    return (s[0], s[2], s[1], s[3]) if unsqueeze_dim == 1 else s


def _row_strides(t: Tensor, table: bool) -> tuple[int, int]:
    """The (batch, row) strides of cos or sin (unit last stride, which `launch` makes sure of): batch
    0 where it broadcasts; a table's rows are indexed by position (batch stride unused)."""
    if table or t.dim() == 2:
        return 0, t.stride(0)
    return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)


def launch(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, options: Options, eager: bool,
    config: RopeConfig,
) -> tuple[Tensor, Tensor]:
    """Rotate q and k (or their gradients, `options.backward`) with `config`'s kernels; arguments as
    `kernel_pytorch.ops.rope.rope_fwd`'s. Returns (q_out, k_out): new tensors, or q and k in place."""
    qo = q if options.inplace else torch.empty_like(q)
    ko = k if options.inplace else torch.empty_like(k)
    if cos.stride(-1) != 1:
        cos = cos.contiguous()  # (rows, r) of cos/sin: small next to q and k
    if sin.stride(-1) != 1:
        sin = sin.contiguous()
    pos = position_ids
    ops = Operands(q, k, qo, ko, cos, sin, pos)
    if not eager:  # traced (compile, export): sizes may be symbolic, nothing to cache
        plan = build_plan(ops, options, config)
    else:
        key = (
            q.shape, q.stride(), k.shape, k.stride(), qo.stride(), ko.stride(), cos.shape, cos.stride(), sin.shape,
            sin.stride(), None if pos is None else (pos.shape, pos.stride()), options, config,
        )
        plan = _PLANS.get(key, False)
        if plan is False:
            plan = build_plan(ops, options, config)
            if len(_PLANS) >= MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan is not None:
        kernel, grid, scalars, meta = plan
        kernel(grid, q, k, qo, ko, cos, sin, cos if pos is None else pos, *scalars, **meta, eager=eager)
    return qo, ko


def build_plan(ops: Operands, options: Options, config: RopeConfig) -> tuple | None:
    """(kernel, grid, the scalar arguments after the tensors, constexprs and warps) for these inputs'
    shapes and strides, or None when there is nothing to rotate; cos and sin have a unit last stride."""
    q, k, qo, ko, cos, sin, position_ids = ops
    unsqueeze_dim = options.unsqueeze_dim
    batch, seq_len, d = q.shape[0], q.shape[3 - unsqueeze_dim], q.shape[-1]
    heads_q, heads_k = q.shape[unsqueeze_dim], k.shape[unsqueeze_dim]
    if batch * seq_len * (heads_q + heads_k) == 0:
        return None
    table = position_ids is not None
    scb, sct = _row_strides(cos, table)
    ssb, sst = _row_strides(sin, table)
    if table:
        pos = position_ids
        spb, spt = (0, pos.stride(0)) if pos.dim() == 1 else (pos.stride(0) if pos.shape[0] > 1 else 0, pos.stride(1))
    else:
        spb, spt = 0, 0
    half = cos.shape[-1] // 2
    n_pass = d - 2 * half
    copy_pass = not options.inplace and n_pass > 0
    sq = _bthd_strides(q, unsqueeze_dim)
    strides = (*sq, *_bthd_strides(k, unsqueeze_dim), *_bthd_strides(qo, unsqueeze_dim),
               *_bthd_strides(ko, unsqueeze_dim), scb, sct, ssb, sst, spb, spt)
    n_positions = cos.shape[0] if table else 0
    flags = Flags(options.interleaved, table, copy_pass, options.backward, options.hf_rounding)
    schedule = config.schedule
    if schedule == "flat":
        planned = flat.plan(ops, unsqueeze_dim, half, strides[-6:], n_positions, flags, config.flat)
        if planned is not None:
            return planned
        schedule = config.fallback(options.interleaved)  # not dense in one of the two orders
    sizes = Sizes(batch, seq_len, heads_q, heads_k, half, n_pass, n_positions)
    if schedule == "token":
        kernel, grid, scalars, meta = token.plan(sizes, flags, config.token)
    else:
        kernel, grid, scalars, meta = tile.plan(sizes, sq[2] < sq[1], flags, config.tile)
    return kernel, grid, (*strides, *scalars), meta
