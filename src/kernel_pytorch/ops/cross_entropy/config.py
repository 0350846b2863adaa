"""The cross-entropy family's launch configs, registered with kernel_pytorch.ops.tuning.

Two families: "cross_entropy" (the two-pass forward, the backward, the stats kernel) and
"fused_linear_cross_entropy" (the chunking of the fused loss and its one-read kernel). Launchers read
the config in force with `tuning.current(...)`; benchmarks, probes and tests change it with
`tuning.override` / `tuning.changed`, e.g. `tuning.changed("fused_linear_cross_entropy", one_read=False)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel_pytorch.ops import tuning


@dataclass(frozen=True)
class FwdLaunch:
    """How the two-pass forward walks the rows."""

    block: int  # columns per step (power of two)
    num_warps: int
    programs_per_sm: int  # 0: one program per row; k > 0: k persistent programs per SM walk the rows
    evict: bool  # pass 1 loads evict_last (kept in L2 for pass 2), pass 2 loads and stores evict_first
    reverse: bool  # pass 2 walks the row from its end: the blocks pass 1 read last, likeliest in L2
    prefetch: bool = True  # each pass loads the next block before reducing this one


@dataclass(frozen=True)
class OnePassLaunch:
    """How the one-read kernel (one_read.py) walks a row."""

    block: int  # columns per step (power of two)
    num_warps: int
    prefetch: bool


@dataclass(frozen=True)
class CrossEntropyConfig:
    """Launch knobs of the cross-entropy kernels (kernels.py, stats.py)."""

    # Measured on the H100, 8192 x 128256 bf16 (benchmarks/results/probes/cross_entropy/probe_ce_h100.log): with the
    # gradient, 16384-column blocks at 32 warps without prefetch (16 elements per thread, one program per
    # row) took 1.865 ms = 75.1% of copy, the best of the sweep (4096 x 16 with prefetch: 2.13 ms).
    fwd: FwdLaunch = FwdLaunch(block=16384, num_warps=32, programs_per_sm=0, evict=True, reverse=False,
                               prefetch=False)
    # Loss only, `fwd` drops to 70% of copy; 4096-column blocks at 8 warps with prefetch reach 97% there
    # (same probe), so the loss-only pass (no_grad, the fused loss's "none" forward) has its own launch.
    # None: loss-only passes use `fwd` as well (the probe's sweep times one launch both ways).
    loss: FwdLaunch | None = FwdLaunch(block=4096, num_warps=8, programs_per_sm=0, evict=True, reverse=False,
                                       prefetch=True)
    # The recomputing backward is an elementwise stream: on the H100
    # (benchmarks/results/probes/cross_entropy/probe_ce_h100.log,
    # 8192 x 128256 bf16, "none") 4096 x 8 warps took 1.475 ms = 95.0% of copy, 8192 x 16 1.470 and
    # 2048 x 4 1.474: within 0.3%, so the tile stays.
    bwd_block: int = 4096
    bwd_warps: int = 8
    # The stats kernel is one program over the targets (N reads, V for the weight total): a fixed step
    # of 1024 keeps it to a few loop trips per thousand rows; its time is its launch's.
    stats_block: int = 1024


@dataclass(frozen=True)
class FusedLinearCrossEntropyConfig:
    """Chunking of the fused linear cross-entropy (fused_linear.py) and its one-read kernel (one_read.py)."""

    # The chunk buffer's default cap: 1024 rows of a 128K bf16 vocabulary, where the grad_W update is
    # compute-bound and bf16 accumulation rounds 8 times over 8K tokens. Liger-Kernel's rule (chunk logits
    # as large as x) gives 256 rows there: its peak memory, but a memory-bound update (fused_linear.py).
    chunk_bytes: int = 256 * 2**20
    # A floor under that cap: each chunk re-reads and re-writes the (V, H) grad_W accumulator, whose
    # traffic against the chunk's three GEMMs depends on the rows only (~11% of their time at 1024 rows
    # on an H200, ~21% at 512), so at a 262144 vocabulary the cap's 512 rows cost 1.19x the GEMMs and
    # 1024 rows 1.08x (benchmarks/results/probes/cross_entropy/probe_flce_chunks_h200.log). The free-memory share
    # still wins over the floor.
    min_rows: int = 1024
    row_align: int = 128  # rows per chunk come in whole GEMM tiles
    free_fraction: float = 0.5  # at most this share of the device's free memory goes to the chunk buffer
    # Whether the one-read kernel runs where it applies (one_read.py); off: the two-pass kernel
    # everywhere (benchmarks compare the two in one run). On: at the e2e head (8192 x 2048 x 128256
    # bf16) it beat the two-pass kernel per chunk (benchmarks/results/probes/cross_entropy/probe_onepass_h200.log).
    one_read: bool = True
    # The H200 sweep (benchmarks/results/probes/cross_entropy/probe_onepass_h200.log; one 1024 x 128256 bf16 chunk
    # after its logits GEMM, less the GEMM): 8192 x 8 warps 121.7 us in graph replay (101.6% of copy: the
    # GEMM leaves part of the chunk in L2), 4096 x 8 without prefetch 123.8, 2048 x 4 126.4, 4096 x 8
    # 132.5, 16384 x 32 without prefetch 154.0; the two-pass kernel 166.3.
    one_read_launch: OnePassLaunch = OnePassLaunch(block=8192, num_warps=8, prefetch=True)
    # A later block may exceed the row's reference by this much before the reference moves (one_read.py):
    # every exponential stays below exp(20), so no sum overflows fp32 or the logits' dtype.
    switch: float = 20.0
    h_block: int = 1024  # xs columns per step of the one-read kernel


tuning.register("cross_entropy", CrossEntropyConfig())
tuning.register("fused_linear_cross_entropy", FusedLinearCrossEntropyConfig())
