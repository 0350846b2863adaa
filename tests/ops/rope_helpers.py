"""Shared inputs of the rotary-embedding tests: q/k in either layout, cos/sin rows or tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernel_pytorch.reference.rope_tables import cos_sin, cos_sin_table, default_inv_freq
from tests.grid import randn


@dataclass(frozen=True)
class RopeCase:
    """One shape of the grid: batch, tokens, q heads, k heads, head dim, rotary dim, how q/k are laid
    out ("bhtd", "bthd", or "bthd_as_bhtd": (B, T, H, D) memory seen as (B, H, T, D), transformers'
    usual view) and cos/sin's leading dims ("1": (1, T, r), "b": (B, T, r), "2d": (T, r))."""

    b: int
    t: int
    hq: int
    hk: int
    d: int
    r: int
    layout: str = "bhtd"
    cos_lead: str = "1"

    @property
    def unsqueeze_dim(self) -> int:
        return 2 if self.layout == "bthd" else 1

    def __str__(self) -> str:
        return f"B{self.b}T{self.t}q{self.hq}k{self.hk}D{self.d}r{self.r}-{self.layout}-cos{self.cos_lead}"


def make_heads(case: RopeCase, heads: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    """Random q or k of `heads` heads in the case's layout (never zeros)."""
    if case.layout == "bhtd":
        return randn(case.b, heads, case.t, case.d, dtype=dtype, device=device, scale=scale)
    x = randn(case.b, case.t, heads, case.d, dtype=dtype, device=device, scale=scale)
    return x if case.layout == "bthd" else x.transpose(1, 2)


def make_rows(case: RopeCase, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cos/sin rows of the case's leading dims (random, not a rotation: the op is elementwise
    in cos/sin, so the kernels must not assume a pair's entries agree)."""
    lead = {"1": (1, case.t), "b": (case.b, case.t), "2d": (case.t,)}[case.cos_lead]
    return (randn(*lead, case.r, dtype=dtype, device=device, offset=0.5),
            randn(*lead, case.r, dtype=dtype, device=device, offset=-0.5))


def rotation_table(n_positions: int, r: int, dtype: torch.dtype, device: str, interleaved: bool = False):
    """True rotation tables (P, r) from the default frequencies (theta 10000)."""
    inv = default_inv_freq(10000.0, r, device)
    return cos_sin_table(inv, n_positions, 1.0, dtype, interleaved)


def rotation_rows(position_ids: torch.Tensor, r: int, dtype: torch.dtype, interleaved: bool = False):
    """transformers-layout rows (B, T, r) of true rotations at `position_ids` (B, T)."""
    inv = default_inv_freq(10000.0, r, position_ids.device)
    return cos_sin(inv, position_ids, 1.0, dtype, interleaved)
