"""Launch helpers shared by the row-wise kernels: block sizes, warps, grids, row views. No op math."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

try:  # the switch triton_op itself flips around its body in eager mode
    from torch._library.triton import set_wrap_triton_enabled as _set_wrap_triton_enabled
except ImportError:  # pragma: no cover - older torch: wrap_triton then always dispatches
    _set_wrap_triton_enabled = None

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


# Persistent programs per SM in the backward row loops: two keep enough loads in flight to hide
# memory latency on rows up to PREFETCH_MAX_BLOCK; wider rows have the registers for one.
PROGRAMS_PER_SM = 2
# The backward prefetches the next row while computing this one, up to this row width; wider rows
# would spill the doubled registers.
PREFETCH_MAX_BLOCK = 8192


def backward_programs(n_rows: int, device: torch.device, launch: RowLaunch) -> int:
    """Persistent programs for a backward row loop launched with `launch`."""
    per_sm = PROGRAMS_PER_SM if launch.block <= PREFETCH_MAX_BLOCK else 1
    return persistent_programs(n_rows, device, per_sm)


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(n_rows: int, device: torch.device, per_sm: int | None = None) -> int:
    """Programs for a persistent row loop (each owns one fp32 row of weight-gradient partials)."""
    if device.type != "cuda":
        return max(1, min(n_rows, 4))
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, min(n_rows, sm_count(index) * (per_sm or PROGRAMS_PER_SM)))


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


@contextlib.contextmanager
def direct_launch() -> Iterator[None]:
    """Launch `wrap_triton` kernels directly (as inside a registered op's eager call) instead of
    through the tracing-aware higher-order op, which costs ~150 us of host time per launch."""
    if _set_wrap_triton_enabled is None:
        yield
        return
    with _set_wrap_triton_enabled(False):
        yield
