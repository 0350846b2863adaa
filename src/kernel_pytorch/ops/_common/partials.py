"""The backward kernels' fp32 weight-gradient partial rows: how a program stores its rows
(`store_partials`), and the second, fixed-order reduction that sums them (`sum_partials`).

Where a row-mode launch has more programs than SMs, programs share partial rows in pairs, ordered by
an integer ticket (the floats are never accumulated atomically), so the partials take one row per SM
whatever the programs per SM.

sum_partials: for parts (S, D) fp32 (one row per slot), out[d] = sum_s parts[s, d], cast to the
parameter's dtype. Each program owns BLOCK_D columns and adds the S rows in the same order on every
run (BLOCK_P-row chunks accumulated in turn, then a fixed tree within the chunk), so two runs give
bitwise-equal gradients. Up to two stacked buffers go in one launch (LayerNorm's weight and bias),
which saves the separate sum and cast launches and their host time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops._common.launch import Launcher, device_programs


def partial_slots(programs: int, device: torch.device) -> tuple[int, bool]:
    """Partial rows for a persistent launch of `programs` row-mode programs, and whether programs share
    them in pairs (`store_partials` with PAIRED): pairs when there are more programs than SMs, so the
    partials stay at one row per SM (per parameter) whatever the programs per SM."""
    if programs > device_programs(device, 1):
        return triton.cdiv(programs, 2), True
    return programs, False


@triton.jit
def _store_pair(row_a, row_b, a, b, col_ok, HAS_A: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_A:
        tl.store(row_a, a, mask=col_ok)
    if HAS_B:
        tl.store(row_b, b, mask=col_ok)


@triton.jit
def _load_pair(row_a, row_b, a, b, col_ok, HAS_A: tl.constexpr, HAS_B: tl.constexpr):
    # .cg: read at L2, where the partner program's stores are, never from this SM's L1
    if HAS_A:
        a = tl.load(row_a, mask=col_ok, other=0.0, cache_modifier=".cg")
    if HAS_B:
        b = tl.load(row_b, mask=col_ok, other=0.0, cache_modifier=".cg")
    return a, b


@triton.jit
def store_partials(
    PART, TICKETS, n_cols, cols, col_ok, a, b,
    HAS_A: tl.constexpr, HAS_B: tl.constexpr, PAIRED: tl.constexpr,
):
    """Write this program's fp32 partial rows `a` and `b` ([BLOCK] over `cols`) of a 1-D persistent
    launch into PART, (HAS_A + HAS_B, slots, n_cols): a's rows first, then b's.

    Unpaired: slot = program id. PAIRED: programs 2k and 2k + 1 share slot k (the last program alone
    when the count is odd). TICKETS (int32 [slots], zeroed) orders the pair: the first to finish takes
    ticket 0 and stores its rows, then adds 1 (release); the second waits for that, then stores the
    sum of both. Two addends in either order give the same float (addition commutes), so the slot is
    bitwise the same on every run; the second reduction then sums the slots in a fixed order. The
    second waits only on a program that already holds its ticket, hence is running: no assumption
    about which programs are resident.
    """
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    if PAIRED:
        slot = pid // 2
        n_slots = (n_progs + 1) // 2
    else:
        slot = pid
        n_slots = n_progs
    row_a = PART + slot.to(tl.int64) * n_cols + cols
    row_b = row_a + n_slots.to(tl.int64) * n_cols if HAS_A else row_a
    if PAIRED:
        if slot * 2 + 1 < n_progs:
            ticket = tl.atomic_add(TICKETS + slot, 1, sem="acq_rel")
            if ticket == 0:
                _store_pair(row_a, row_b, a, b, col_ok, HAS_A, HAS_B)
                # every thread's stores happen before the one thread's release
                tl.debug_barrier()
                tl.atomic_add(TICKETS + slot, 1, sem="release")
            else:
                # both tickets taken and the first program's rows released: the count reaches 3
                state = tl.atomic_add(TICKETS + slot, 0, sem="acquire")
                while state < 3:
                    state = tl.atomic_add(TICKETS + slot, 0, sem="acquire")
                tl.debug_barrier()
                first_a, first_b = _load_pair(row_a, row_b, a, b, col_ok, HAS_A, HAS_B)
                _store_pair(row_a, row_b, first_a + a, first_b + b, col_ok, HAS_A, HAS_B)
        else:
            _store_pair(row_a, row_b, a, b, col_ok, HAS_A, HAS_B)
    else:
        _store_pair(row_a, row_b, a, b, col_ok, HAS_A, HAS_B)


# Columns per program: a (BLOCK_P, BLOCK_D) fp32 tile is 8 KiB, 4 warps stream it.
_BLOCK_D = 64
_BLOCK_P = 32


@triton.jit
def _sum_partials_kernel(
    PART, OUT_A, OUT_B, n_parts, n_cols,
    BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # grid (column blocks, buffers): program (i, k) sums columns i*BLOCK_D.. of buffer k
    k = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < n_cols
    part = PART + k.to(tl.int64) * n_parts * n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_D], dtype=tl.float32)
    for start in range(0, n_parts, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        ptrs = part + rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        acc += tl.load(ptrs, mask=(rows[:, None] < n_parts) & mask[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(OUT_A + cols, total.to(OUT_A.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT_B + cols, total.to(OUT_B.dtype.element_ty), mask=mask)


_sum_partials = Launcher(_sum_partials_kernel)


def sum_partials(parts: Tensor, dtypes: tuple[torch.dtype, ...], *, eager: bool = False) -> list[Tensor]:
    """Column sums of K = len(dtypes) (1 or 2) stacked partial buffers, in a fixed order.

    Args:
        parts: contiguous fp32 (K, P, D), or (P, D) when K is 1.
        dtypes: the dtype of each sum (the parameter's).
    Returns:
        K tensors of shape (D,).
    """
    n_parts, n_cols = parts.shape[-2:]
    outs = [torch.empty(n_cols, dtype=dt, device=parts.device) for dt in dtypes]
    # OUT_B is never the same tensor as OUT_A, even unused: traced, a user Triton kernel's written
    # arguments are functionalized one by one, and with one tensor passed twice Inductor returned the
    # unwritten copy as the sum (a compiled RMSNorm's weight gradient was garbage on the H100)
    out_b = outs[1] if len(outs) > 1 else torch.empty(1, dtype=dtypes[0], device=parts.device)
    _sum_partials(
        (triton.cdiv(n_cols, _BLOCK_D), len(outs)), parts, outs[0], out_b, n_parts, n_cols,
        BLOCK_P=_BLOCK_P, BLOCK_D=_BLOCK_D, eager=eager, num_warps=4,
    )
    return outs
