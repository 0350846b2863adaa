"""The quantized matmuls' launch config, registered with kernel_pytorch.ops.tuning as "quant_matmul".

`QuantMatmulConfig` says which path a call of M rows takes and holds one `SchemeLaunch` per scheme:

    M <= gemv_max_m     "gemv" (gemv.py): one program per block of N and row of x, products on the CUDA
                        cores, K sliced only where the blocks of N leave the SMs short
    M <= decode_max_m   "split_k": split-K, tl.dot on a tile of M padded to 16 rows
    otherwise           "tiled" (prefill): M x N output tiles, grouped for L2 reuse, no split;
                        or, with prefill="dequant", the weight dequantized once into x's dtype and
                        torch's matmul (cuBLAS), the choice for compute-bound shapes if it measures faster

The split_k path picks the split count from the SMs (`SplitKLaunch.programs_per_sm`: the fewest
slices giving that many programs per SM), so that one output tile row reads the weight with enough
programs in flight; gemv slices K only while it stays at or under `GemvLaunch.programs_per_sm`, since
its blocks of N alone fill the SMs at the Llama shapes and a slice costs a second kernel.

Benchmarks, probes and tests change it with `tuning.override(quant_matmul=...)` or
`tuning.changed("quant_matmul", ...)`, e.g. `tuning.changed("quant_matmul", prefill="dequant")`.

The defaults below were chosen from the kernels' arithmetic (bytes in flight per program, tiles per
SM) and ptxas's registers and instructions for sm_90 (compiled off the GPU), not yet from a
measurement on a GPU: `benchmarks/bench_quant_matmul.py --sweep` times the
alternatives at the Llama-3-8B decode shapes, and its result is what these comments will name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernel_pytorch.ops import tuning

PREFILL_MODES = ("tiled", "dequant")


def _positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive int, got {value!r}")


def _power_of_two(config: object, *names: str) -> None:
    _positive(config, *names)
    for name in names:
        value = getattr(config, name)
        if value & (value - 1):
            raise ValueError(f"{type(config).__name__}.{name} must be a power of two, got {value!r}")


@dataclass(frozen=True)
class _SlicedLaunch:
    """A launch whose programs each read block_n rows of the weight over one slice of K, block_k
    weights a step; the slices' fp32 partial sums are added in a second kernel in a fixed order
    (deterministic, no atomics). GemvLaunch and SplitKLaunch say how each picks its slice count.

    Fields:
        block_n, block_k: the weight tile a program reads per step (powers of two).
        num_warps: Triton's.
        num_stages: the loop's stages: the next num_stages - 1 steps' weight tiles stream into shared
            memory (cp.async) while one is summed; 1: none, each step waits for its loads.
        programs_per_sm: the programs per SM the slice count aims at (each subclass says how).
        max_split: the most K slices.
    """

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 2
    max_split: int = 16

    def __post_init__(self) -> None:
        _power_of_two(self, "block_n", "block_k")
        _positive(self, "num_warps", "num_stages", "programs_per_sm", "max_split")


@dataclass(frozen=True)
class GemvLaunch(_SlicedLaunch):
    """The gemv launch (gemv.py): one program per block_n rows of the weight and row of x, walking its
    slice of K block_k weights a step; slices only where the blocks of N alone leave the SMs short.

    Fields (_SlicedLaunch's):
        block_n, block_k: block_k in weights (int4's bytes are half of it); the tile's bytes times the
            programs an SM holds should be 16-32 KiB in flight.
        programs_per_sm: K is sliced into the most slices that keep the programs at or under this many
            per SM (at least one slice; a slice costs its partial sums and the second kernel).
    """

    programs_per_sm: int = 2


@dataclass(frozen=True)
class SplitKLaunch(_SlicedLaunch):
    """A split-K launch for small M: every program covers all M rows (up to the path's limit), one
    block of N columns and one slice of K.

    Fields (_SlicedLaunch's):
        block_n, block_k: int4's block_k is capped at its group size on the tl.dot path, so that one
            scale and zero point cover a tile.
        programs_per_sm: the split count is the smallest that gives this many programs per SM.
        max_split: bounds the partial sums' memory (split x M x N fp32).
    """

    programs_per_sm: int = 4


@dataclass(frozen=True)
class TileLaunch:
    """The tiled (prefill) launch: block_m x block_n output tiles, group_m tile rows walked together
    so that their weight tiles are read from L2 rather than memory."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        _power_of_two(self, "block_m", "block_n", "block_k")
        _positive(self, "group_m", "num_warps", "num_stages")


@dataclass(frozen=True)
class SchemeLaunch:
    """One scheme's launches, one per path."""

    gemv: GemvLaunch
    split_k: SplitKLaunch
    tiled: TileLaunch = field(default_factory=TileLaunch)


# gemv (M = 1, the weight read once; ptxas for sm_90 on the kernel, pending the GPU sweep): H100's ~3
# TB/s over ~1 us of latency is ~23 KiB in flight per SM; 3 stages keep two steps a program in flight
# while a third is summed. int8 and fp8: 16 x 1024 is 16 KiB a step, 128 bytes (8 loads of 16) a thread
# of 4 warps, 80 registers and 37 KiB of shared memory; 2 programs per SM at Llama-3-8B's q/o (4096 x
# 4096: 256 programs, all of K each, one launch), 64 KiB in flight. int4 turns a byte into two weights
# in ~13 instructions (the budget at 3 TB/s is ~10), so it wants warps to issue from: 8 x 1024 (4 KiB a
# step, 32 bytes a thread) takes 128 registers, 4 programs per SM, 512 programs at q/o, 32 KiB in flight;
# 16 x 1024 takes 197 registers (2 per SM), 16 x 2048 spills.
# split_k: 128-column tiles so that the x tile (M padded to 16, bf16) a program re-reads from L2 is at
# most a quarter of the weight bytes it streams; int4's block_k is capped at the group size there.
_BYTE = SchemeLaunch(gemv=GemvLaunch(block_n=16, block_k=1024),
                     split_k=SplitKLaunch(block_n=128, block_k=128, programs_per_sm=2))
_NIBBLE = SchemeLaunch(gemv=GemvLaunch(block_n=8, block_k=1024),
                       split_k=SplitKLaunch(block_n=128, block_k=128, programs_per_sm=2))


@dataclass(frozen=True)
class QuantMatmulConfig:
    """Which path runs a call of M rows, and each scheme's launches (module docstring)."""

    gemv_max_m: int = 1  # M = 1 (one token): no rows of padding for tl.dot to multiply
    decode_max_m: int = 32  # batch 2..32 tokens: split-K on tl.dot, x padded to 16 or 32 rows
    prefill: str = "tiled"
    # The dequantization kernel (the backward's dx, the "dequant" prefill): 2048 weights a program, one
    # tile each; a memory-bound pass with no loop, not measured against other tiles.
    dequant_block_n: int = 32
    dequant_block_k: int = 64
    int8: SchemeLaunch = _BYTE
    fp8: SchemeLaunch = _BYTE
    int4: SchemeLaunch = _NIBBLE

    def __post_init__(self) -> None:
        if not isinstance(self.gemv_max_m, int) or self.gemv_max_m < 0:
            raise ValueError(f"QuantMatmulConfig.gemv_max_m must be an int >= 0, got {self.gemv_max_m!r}")
        if not isinstance(self.decode_max_m, int) or self.decode_max_m < self.gemv_max_m:
            raise ValueError(f"QuantMatmulConfig.decode_max_m must be an int >= gemv_max_m, got {self.decode_max_m!r}")
        _power_of_two(self, "dequant_block_n", "dequant_block_k")
        if self.prefill not in PREFILL_MODES:
            raise ValueError(f"QuantMatmulConfig.prefill must be one of {PREFILL_MODES}, got {self.prefill!r}")

    def scheme(self, name: str) -> SchemeLaunch:
        """The launches of scheme `name` ("int8", "int4", "fp8")."""
        return getattr(self, name)


DEFAULT = tuning.register("quant_matmul", QuantMatmulConfig())
