"""Generic launch helpers for every kernel: the direct launcher, power-of-two sizes, SM counts and
persistent-grid sizes, the dtypes the kernels take. No op math, no row schedules (those are in _rows)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.library import wrap_triton

from kernel_pytorch._env import KERNEL_DTYPES  # noqa: F401  (the kernels' dtypes, with the launch helpers)

try:  # triton >= 3.4: launch hooks live in knobs; the eager fast path needs them to stay faithful
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton: every launch goes through JITFunction.run
    _knobs = None

def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


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


def _call_key(args: tuple) -> tuple:
    """A key of one launch's arguments that is finer than `_arg_key` and cheaper to build: each int
    itself (bools and floats with their type: True == 1 and 0.0 == 0 hash alike), each tensor's dtype
    and address modulo 16. Repeated calls with the same shapes meet the same key."""
    return tuple([a if type(a) is int else (a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                  else (type(a), a) for a in args])


# Entries of a Launcher's per-call key cache before it starts over (each costs one tuple; a workload
# whose shapes change on every call would otherwise grow it without end).
CALL_KEYS = 4096


class Launcher:
    """One `@triton.jit` kernel and the two ways our launchers start it.

    `eager=False` (inside a registered op's body): through `wrap_triton`, so torch.compile and
    torch.export can trace the launch. `eager=True` (the eager autograd.Function path, CUDA tensors):
    the compiled binary found on the first launch of each specialisation is kept and later launches
    call it directly. Triton's `JITFunction.run` re-derives the specialisation, cache key, device and
    stream on every call: 16.0 us per launch on our H100 host against 11.5 us here, most of which is
    Triton's own launcher (benchmarks/probes/probe_norms.py --sweep).

    The binaries are found in two steps: a launch whose arguments repeat an earlier call's (the same
    shapes and strides, `_call_key`) finds it in one lookup; a new one builds Triton's specialisation
    key (`_arg_key`, about 0.3 us per argument in Python) and finds the binary by that.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        # (device, num_warps, constexprs, argument keys) -> (launcher, function, metadata, constexpr
        # values in parameter order), or None where the binary cannot be called directly
        self._binaries: dict[tuple, tuple | None] = {}
        # (device, num_warps, constexprs, _call_key) -> the same entry, for repeated calls
        self._calls: dict[tuple, tuple | None] = {}

    def __call__(self, grid: tuple[int, ...], *args: Any, eager: bool, num_warps: int, **meta: Any) -> None:
        if not eager or _knobs is None or not args[0].is_cuda:
            wrap_triton(self.fn)[grid](*args, num_warps=num_warps, **meta)
            return
        device = args[0].get_device()
        call = (device, num_warps, tuple(meta.items()), _call_key(args))
        binary = self._calls.get(call, False)
        if binary is False:
            key = call[:3] + (_arg_key(args),)
            binary = self._binaries.get(key, False)
            if binary is not False:
                if len(self._calls) >= CALL_KEYS:
                    self._calls.clear()
                self._calls[call] = binary
        if binary is False or device != torch._C._cuda_getDevice():
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
