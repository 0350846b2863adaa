"""Launch helpers shared by the row-wise kernels: block sizes, warps, grids, row views. No op math."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# One row lives in registers up to this many elements; wider rows loop over column blocks.
MAX_FUSED_COLS = 16384
# Column block for the looping path: 4096 fp32 values over 8 warps is 16 per thread.
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


def row_launch(n_cols: int, element_size: int) -> RowLaunch:
    """Block and warp choice for a row of `n_cols` elements of `element_size` bytes.

    Warps grow with the row so each thread keeps 8-16 elements in flight: enough for 16-byte loads
    without spilling the fp32 copies the backward holds (x, dy, weight, dweight accumulator).
    """
    if n_cols <= MAX_FUSED_COLS:
        block = next_power_of_2(n_cols)
        single = True
    else:
        block = LOOP_BLOCK
        single = False
    per_thread = max(16 // element_size, 8)
    num_warps = min(16, max(1, block // (32 * per_thread)))
    num_warps = next_power_of_2(num_warps)
    return RowLaunch(block=block, single_pass=single, num_warps=num_warps)


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(n_rows: int, device: torch.device) -> int:
    """Programs for a persistent row loop: one per SM (its weight-gradient partial is one fp32 row)."""
    if device.type != "cuda":
        return max(1, min(n_rows, 4))
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, min(n_rows, sm_count(index)))


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
