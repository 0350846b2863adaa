"""The norm family's launch config (RMSNorm, LayerNorm, fused add + RMSNorm), registered as "norm".

`NormConfig` holds the row schedules' limits (`rows`, ops/_common/rows.RowsConfig) and each op's own
choices (`rms_norm`, `layer_norm`, a `NormOpConfig` each; add + RMSNorm runs RMSNorm's kernels and
takes its choices). The launchers read `tuning.current("norm")` or take `config=`; benchmarks, probes
and tests change it with `tuning.override(norm=...)` / `tuning.changed("norm", ...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.rows import RowsConfig, RowTiling


@dataclass(frozen=True)
class NormOpConfig:
    """One row-wise op's launch choices.

    Fields:
        fwd_elements_per_thread, bwd_elements_per_thread: elements each thread holds (the forward one
            row, the backward dy, x, weight and accumulators); at least one 16-byte vector is used.
        fwd_max_fused_cols, bwd_max_fused_cols: widest row kept whole in registers by this op's forward
            and backward (None: the rows config's `max_fused_cols` alone).
        bwd_tiling: the row-mode backward's tile and programs per SM.
        bwd_tilings: (block, tiling) pairs overriding `bwd_tiling` for rows of that block.
        paired_partials: LayerNorm's row-mode backward with more programs than SMs shares partial rows
            in pairs (ops/_common/partials.partial_slots), so they stay at one fp32 row per SM per
            parameter; off, each program keeps its own (RMSNorm's backward has no pairing).
    """

    fwd_elements_per_thread: int
    bwd_elements_per_thread: int
    bwd_tiling: RowTiling
    bwd_tilings: tuple[tuple[int, RowTiling], ...] = ()
    fwd_max_fused_cols: int | None = None
    bwd_max_fused_cols: int | None = None
    paired_partials: bool = True

    def tiling(self, block: int) -> RowTiling:
        """The row-mode backward's tiling for rows of `block` columns (`bwd_tilings`, else `bwd_tiling`)."""
        for width, tiling in self.bwd_tilings:
            if width == block:
                return tiling
        return self.bwd_tiling


# RMSNorm (and the fused add). Elements per thread measured on the H200, 2026-11-21 (docs/performance.md):
# the forward reached 86% of copy at 4096 columns with 16 per thread (8 warps) instead of 16 warps.
# Row-mode backward: two-row tiles, one program per SM, so one fp32 partial row per SM (as many as
# Liger-Kernel keeps) at 91.0% of copy against 91.4% for two one-row programs per SM (H100, 2026-11-21,
# 16384 x 4096, docs/performance.md). On the H200's faster memory that keeps too little in flight:
# `bwd_tilings`, by the row's block, holds the tiling the H200 measured fastest at each width from 1024
# to 8192 (benchmarks/results/probes/norm/probe_e2e_norms_h200.log, bf16 backward in graph replay, against
# (2, 1)): 1024 four-row tiles two per SM, 27.1 us against 36.8 (8192 rows); 2048 two-row tiles two per
# SM, 39.8 against 46.9 (8192 rows); 4096 one row, two programs per SM, 113.0 against 131.9 (16384
# rows); 8192 the same, 75.5 against 86.4 (4096 rows). Other widths were not measured there and keep
# `bwd_tiling`.
_RMS_NORM = NormOpConfig(
    fwd_elements_per_thread=16,
    bwd_elements_per_thread=8,
    bwd_tiling=RowTiling(tile=2, programs_per_sm=1),
    bwd_tilings=(
        (1024, RowTiling(tile=4, programs_per_sm=2)),
        (2048, RowTiling(tile=2, programs_per_sm=2)),
        (4096, RowTiling(tile=1, programs_per_sm=2)),
        (8192, RowTiling(tile=1, programs_per_sm=2)),
    ),
)

# LayerNorm. Its backward holds one more accumulator and wants 16 elements per thread (47% -> 70% of
# copy at 4096 columns, H200, 2026-11-21); rows wider than 8192 take the column loop in the backward:
# holding dy, x, weight and two accumulators for a 16K row spilled registers (20% of copy; both
# docs/performance.md). Row-mode backward: one-row tiles, two programs per SM, sharing partial rows in
# pairs; one two-row program per SM (one partial row each, no pairing) measured 86% of copy against 90%
# (H100, 2026-11-21, 16384 x 4096, docs/performance.md and
# benchmarks/results/probes/norm/probe_norms_sweep_h100.log). The
# pairing costs 150.4 against 148.9 us of backward and saves 4.2 MiB of partials there (the same log).
_LAYER_NORM = NormOpConfig(
    fwd_elements_per_thread=16,
    bwd_elements_per_thread=16,
    bwd_tiling=RowTiling(tile=1, programs_per_sm=2),
    fwd_max_fused_cols=16384,
    bwd_max_fused_cols=8192,
)


@dataclass(frozen=True)
class NormConfig:
    """The norm family's launch knobs: the row schedules' limits and each op's choices."""

    rows: RowsConfig = field(default_factory=RowsConfig)
    rms_norm: NormOpConfig = _RMS_NORM
    layer_norm: NormOpConfig = _LAYER_NORM


tuning.register("norm", NormConfig())
