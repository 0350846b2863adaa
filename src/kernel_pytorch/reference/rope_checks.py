"""Argument checks for the rotary embedding, each raising an error that names the argument.

The reference (reference/rope.py) calls `check_rope_args`; the functional entry point
(functional/rope.py) calls it once in eager mode before dispatching, plus `check_dtypes` with the kernel
dtypes and, where a host sync is acceptable, `check_position_range`. Shape checks read only metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RopeShape:
    """What the checks established: batch, tokens, q and k heads, head dim, rotary dim, table rows
    (0 when cos/sin are per-token rows rather than a table)."""

    batch: int
    seq_len: int
    heads_q: int
    heads_k: int
    head_dim: int
    rotary_dim: int
    n_positions: int


def check_qk(q: Tensor, k: Tensor, unsqueeze_dim: int, names: tuple[str, str] = ("q", "k")) -> tuple[int, ...]:
    """q and k: 4-D float tensors of one dtype and device, heads at `unsqueeze_dim` (1: (B, H, T, D),
    2: (B, T, H, D)), equal batch, tokens and head dim. Returns (B, T, Hq, Hk, D)."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 ((B, H, T, D)) or 2 ((B, T, H, D)), got {unsqueeze_dim}")
    for name, t in zip(names, (q, k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor (got {type(t).__name__})")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, T, D) or (B, T, H, D), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (got {t.dtype})")
    nq, nk = names
    if q.dtype != k.dtype:
        raise TypeError(f"{nq} and {nk} must share a dtype (got {q.dtype} and {k.dtype})")
    if q.device != k.device:
        raise ValueError(f"{nq} and {nk} must be on one device (got {q.device} and {k.device})")
    t_dim = 3 - unsqueeze_dim  # the token dim: 2 for (B, H, T, D), 1 for (B, T, H, D)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{nq} and {nk} head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    if q.shape[0] != k.shape[0] or q.shape[t_dim] != k.shape[t_dim]:
        raise ValueError(
            f"{nq} and {nk} must agree in batch and tokens (unsqueeze_dim={unsqueeze_dim}): "
            f"shapes {tuple(q.shape)} and {tuple(k.shape)}"
        )
    return q.shape[0], q.shape[t_dim], q.shape[unsqueeze_dim], k.shape[unsqueeze_dim], q.shape[-1]


def check_cos_sin(
    cos: Tensor, sin: Tensor, batch: int, seq_len: int, head_dim: int, device: torch.device, table: bool
) -> int:
    """cos/sin: float tensors of one shape on `device` with an even last dim r <= head_dim.
    Per-token rows (table=False): (B or 1, T, r) or (T, r). A table (with position ids): (P, r).
    Returns r."""
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor (got {type(t).__name__})")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (got {t.dtype})")
        if t.device != device:
            raise ValueError(f"{name} must be on the device of q ({device}), got {t.device}")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin shapes differ: {tuple(cos.shape)} vs {tuple(sin.shape)}")
    r = cos.shape[-1] if cos.dim() else 0
    if table:
        if cos.dim() != 2:
            raise ValueError(
                f"with position_ids, cos/sin must be (positions, rotary_dim) tables, got {tuple(cos.shape)}"
            )
    elif cos.dim() not in (2, 3):
        raise ValueError(f"cos/sin must be (B or 1, T, rotary_dim) or (T, rotary_dim), got {tuple(cos.shape)}")
    else:
        lead = (1,) + tuple(cos.shape[:-1]) if cos.dim() == 2 else tuple(cos.shape[:-1])
        if lead[1] != seq_len:
            raise ValueError(
                f"cos/sin cover {lead[1]} tokens but q and k have {seq_len} (cos shape {tuple(cos.shape)})"
            )
        if lead[0] not in (1, batch):
            raise ValueError(f"cos/sin batch {lead[0]} is neither 1 nor q's batch {batch}")
    if r == 0 or r % 2:
        raise ValueError(f"rotary_dim (cos.shape[-1]) must be even and positive, got {r}")
    if r > head_dim:
        raise ValueError(f"rotary_dim (cos.shape[-1]) {r} exceeds the head dim {head_dim}")
    return r


def check_position_ids(position_ids: Tensor, batch: int, seq_len: int, device: torch.device) -> None:
    """position_ids: an integer (T,), (1, T) or (B, T) tensor on `device`."""
    if not isinstance(position_ids, Tensor):
        raise TypeError(f"position_ids must be a tensor (got {type(position_ids).__name__})")
    if position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool:
        raise TypeError(f"position_ids must be an integer tensor (got {position_ids.dtype})")
    if position_ids.device != device:
        raise ValueError(f"position_ids must be on the device of q ({device}), got {position_ids.device}")
    shape = tuple(position_ids.shape)
    ok = (position_ids.dim() == 1 and shape[0] == seq_len) or (
        position_ids.dim() == 2 and shape[1] == seq_len and shape[0] in (1, batch)
    )
    if not ok:
        raise ValueError(f"position_ids must be (T,), (1, T) or (B, T) with B={batch}, T={seq_len}; got {shape}")


def check_position_range(position_ids: Tensor, n_positions: int) -> None:
    """Every position id in [0, n_positions). Reads the values: a host sync for CUDA tensors, so the
    functional layer runs it only where that is acceptable. (The kernels never read outside the table
    either way: an out-of-range position gives NaN rows.)"""
    if position_ids.numel() == 0:
        return
    lo, hi = int(position_ids.min()), int(position_ids.max())
    if lo < 0 or hi >= n_positions:
        raise ValueError(
            f"position_ids must lie in [0, {n_positions}) (the rows of the cos/sin table), got [{lo}, {hi}]"
        )


def check_dtypes(allowed: tuple[torch.dtype, ...], **tensors: Tensor) -> None:
    """Each named tensor's dtype is one of `allowed` (the kernels' dtypes)."""
    for name, t in tensors.items():
        if t.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise TypeError(f"{name} has dtype {t.dtype}; the kernels take {names}")


def check_rope_args(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
    names: tuple[str, str] = ("q", "k"),
) -> RopeShape:
    """All metadata checks of one rope call (no host sync). Returns the shapes they established."""
    b, t, hq, hk, d = check_qk(q, k, unsqueeze_dim, names)
    table = position_ids is not None
    if table:
        check_position_ids(position_ids, b, t, q.device)
    r = check_cos_sin(cos, sin, b, t, d, q.device, table)
    return RopeShape(b, t, hq, hk, d, r, cos.shape[0] if table else 0)
