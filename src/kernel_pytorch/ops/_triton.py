"""Launch helpers shared by the row-wise kernels: block sizes, warps, grids, row views. No op math."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch.library import wrap_triton

try:  # triton >= 3.4: launch hooks live in knobs; the eager fast path needs them to stay faithful
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton: every launch goes through JITFunction.run
    _knobs = None

# One row lives in registers up to this many elements; wider rows loop over column blocks.
MAX_FUSED_COLS = 16384
# Column block for the looping path.
LOOP_BLOCK = 4096

# The dtypes our kernels are written for (fp32 accumulation in all of them).
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class RowLaunch:
    """How to launch a row-wise kernel over rows of `n_cols` elements."""

    block: int  # column block (power of two)
    single_pass: bool  # the whole row fits in one block
    num_warps: int


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# Warps per program at most: 32 measured slower than 16 on 16K-wide rows (benchmarks/NOTES.md).
MAX_WARPS = 16


@functools.lru_cache(maxsize=1024)
def row_launch(
    n_cols: int, element_size: int, elements_per_thread: int, max_fused_cols: int | None = None
) -> RowLaunch:
    """Block and warp choice for a row of `n_cols` elements of `element_size` bytes.

    Args:
        elements_per_thread: how many elements each thread should hold (each op measures its own;
            at least one 16-byte vector is always used).
        max_fused_cols: widest row kept whole in registers for this kernel (capped by MAX_FUSED_COLS);
            wider rows loop over LOOP_BLOCK columns.
    """
    limit = min(MAX_FUSED_COLS, max_fused_cols or MAX_FUSED_COLS)
    if n_cols <= limit:
        block = next_power_of_2(n_cols)
        single = True
    else:
        block = min(LOOP_BLOCK, next_power_of_2(limit))
        single = False
    per_thread = max(16 // element_size, elements_per_thread)
    num_warps = next_power_of_2(min(MAX_WARPS, max(1, block // (32 * per_thread))))
    return RowLaunch(block=block, single_pass=single, num_warps=num_warps)


# The backward's row mode (the row fits in registers): a persistent grid of programs, each walking
# tiles of rows and keeping one fp32 partial row per parameter gradient. Each op picks its tile and
# programs per SM (RowTiling): one two-row program per SM keeps the partials to one row per SM at the
# same warps per SM as two one-row programs (benchmarks/NOTES.md, v5).
# The backward prefetches the next tile while computing this one, up to this row width; wider rows
# would spill the doubled registers and run one row per tile, one program per SM. Two tiles ahead
# measured slower (v4).
PREFETCH_MAX_BLOCK = 8192

# The backward's split mode (rows wider than the registers hold): a statistics pass writes each row's
# sums per column chunk, then a column pass gives each program SPLIT_COL_BLOCK columns of a group of
# rows, so weight-gradient partials are one row per row group (not per program of a row loop) and no
# partial row is read back and rewritten once per row.
SPLIT_COL_BLOCK = 1024
SPLIT_TILE_ROWS = 4
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_WARPS = 8


@dataclass(frozen=True)
class RowTiling:
    """An op's row-mode choice: rows per tile and persistent programs per SM."""

    tile: int
    programs_per_sm: int


@dataclass(frozen=True)
class RowSchedule:
    """Row mode: `programs` persistent programs over tiles of `tile` rows."""

    programs: int
    tile: int
    prefetch: bool


@dataclass(frozen=True)
class SplitSchedule:
    """Split mode. Statistics pass: grid (rows, chunks), `chunks` column blocks of the row launch's
    block. Column pass: grid (column blocks of `col_block`, `groups`), each program walking
    `rows_per_group` rows (the last group fewer) in tiles of `tile` rows."""

    chunks: int
    col_block: int
    col_blocks: int
    groups: int
    rows_per_group: int
    tile: int
    num_warps: int


def row_schedule(n_rows: int, device: torch.device, launch: RowLaunch, tiling: RowTiling) -> RowSchedule:
    """How a backward row loop runs rows of `launch` (a single-pass launch) on `device`; the
    program runs with `launch.num_warps` whatever its tile (each thread holds its share of every
    tile row)."""
    if launch.block > PREFETCH_MAX_BLOCK:
        return RowSchedule(persistent_programs(n_rows, device, 1), 1, False)
    programs = persistent_programs(triton.cdiv(n_rows, tiling.tile), device, tiling.programs_per_sm)
    return RowSchedule(programs, tiling.tile, True)


def split_schedule(n_rows: int, n_cols: int, device: torch.device, launch: RowLaunch) -> SplitSchedule:
    """How a split-mode backward covers (n_rows, n_cols) on `device`; `launch` is the looping launch."""
    col_block = min(SPLIT_COL_BLOCK, launch.block)
    col_blocks = triton.cdiv(n_cols, col_block)
    tile = SPLIT_TILE_ROWS
    n_tiles = triton.cdiv(n_rows, tile)
    groups = max(1, min(n_tiles, triton.cdiv(device_programs(device, SPLIT_PROGRAMS_PER_SM), col_blocks)))
    rows_per_group = triton.cdiv(n_tiles, groups) * tile
    warps = next_power_of_2(min(SPLIT_WARPS, max(1, tile * col_block // 256)))
    return SplitSchedule(
        chunks=triton.cdiv(n_cols, launch.block), col_block=col_block, col_blocks=col_blocks,
        groups=triton.cdiv(n_rows, rows_per_group), rows_per_group=rows_per_group, tile=tile, num_warps=warps,
    )


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_programs(device: torch.device, per_sm: int) -> int:
    """`per_sm` programs for each SM of `device` (on CPU, the interpreter, as if there were four SMs)."""
    if device.type != "cuda":
        return 4 * per_sm
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sm_count(index) * per_sm


def persistent_programs(n_work: int, device: torch.device, per_sm: int) -> int:
    """Programs for a persistent loop over `n_work` items: `per_sm` per SM, at most one per item."""
    return max(1, min(n_work, device_programs(device, per_sm)))


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """View `x` (..., D) as (rows, D) with unit column stride; copies only when no such view exists.

    The returned tensor may have any row stride (slices of wider rows stay views).
    """
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    d = x.shape[-1]
    if x.stride(-1) != 1 and d > 1:
        x = x.contiguous()
    if x.dim() == 1:
        return x.unsqueeze(0)
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, d)
    except RuntimeError:  # leading dims not collapsible into one stride
        return x.reshape(-1, d)


def row_stride(x2d: torch.Tensor) -> int:
    """Row stride of a (rows, D) view; any value works for a single row."""
    return x2d.stride(0) if x2d.shape[0] > 1 else x2d.shape[1]


def _arg_key(args: tuple) -> tuple:
    """What Triton specialises a kernel on, or finer (so one key means one binary): each tensor's
    dtype and 16-byte alignment, each int's value 1, divisibility by 16 and width; floats are fp32."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append(a.dtype)
            key.append(a.data_ptr() & 15 == 0)
        elif isinstance(a, int):  # bools included: True == 1 keys them apart from other ints
            key.append((a == 1, a & 15 == 0, -0x80000000 <= a <= 0x7FFFFFFF, a >= 1 << 63, type(a)))
        elif isinstance(a, float):
            key.append(float)
        else:
            raise TypeError(f"no direct launch for an argument of type {type(a).__name__}")
    return tuple(key)


def _hook(chain: Any) -> Any:
    """A launch hook to pass on, or None when none is installed (newer Triton keeps an empty chain)."""
    return chain if chain is not None and getattr(chain, "calls", True) else None


class Launcher:
    """One `@triton.jit` kernel and the two ways our launchers start it.

    `eager=False` (inside a registered op's body): through `wrap_triton`, so torch.compile and
    torch.export can trace the launch. `eager=True` (the eager autograd.Function path, CUDA tensors):
    the compiled binary found on the first launch of each specialisation is kept and later launches
    call it directly. Triton's `JITFunction.run` re-derives the specialisation, cache key, device and
    stream on every call: 16.0 us per launch on our H100 host against 11.5 us here, most of which is
    Triton's own launcher (scripts/probe_norms.py --sweep).
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        # (device, num_warps, constexprs, argument keys) -> (launcher, function, metadata, constexpr
        # values in parameter order), or None where the binary cannot be called directly
        self._binaries: dict[tuple, tuple | None] = {}

    def __call__(self, grid: tuple[int, ...], *args: Any, eager: bool, num_warps: int, **meta: Any) -> None:
        if not eager or _knobs is None or not args[0].is_cuda:
            wrap_triton(self.fn)[grid](*args, num_warps=num_warps, **meta)
            return
        device = args[0].get_device()
        key = (device, num_warps, tuple(meta.items()), _arg_key(args))
        binary = self._binaries.get(key, False)
        if binary is False or device != torch.cuda.current_device():
            # first launch of this specialisation (compiles or finds Triton's cached binary), or a
            # tensor on another device than the current one: Triton's own path, under a device guard
            with torch.cuda.device(device):
                compiled = self.fn[grid](*args, num_warps=num_warps, **meta)
            if binary is False:
                self._binaries[key] = self._direct(compiled, meta, len(args))
            return
        if binary is None:
            self.fn[grid](*args, num_warps=num_warps, **meta)
            return
        run, function, metadata, tail, compiled = binary
        stream = torch._C._cuda_getCurrentRawStream(device)
        enter, leave = _hook(_knobs.runtime.launch_enter_hook), _hook(_knobs.runtime.launch_exit_hook)
        # profilers that install launch hooks get the metadata Triton itself would give them
        info = None if enter is None else compiled.launch_metadata(grid, stream, *args, *tail)
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, function,
            metadata, info, enter, leave, *args, *tail)

    def _direct(self, compiled: Any, meta: dict[str, Any], n_args: int) -> tuple | None:
        """What a direct launch of `compiled` needs, or None when this Triton does not expose it."""
        names = getattr(self.fn, "arg_names", None)
        try:
            tail = tuple(meta[name] for name in names[n_args:])
            return compiled.run, compiled.function, compiled.packed_metadata, tail, compiled
        except (AttributeError, KeyError, TypeError):
            return None

