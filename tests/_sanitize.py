"""An out-of-bounds check for Triton's CPU interpreter (`KP_SANITIZE=1`; tests/conftest.py installs it).

Every load and store a kernel makes under TRITON_INTERPRET=1 must fall inside the storage of one of the
tensors passed to that launch; an access outside any of them raises, naming the kernel. On the GPU such an
access reads or writes whatever lies next to the buffer, and faults only where that memory is unmapped,
so it shows up as an illegal address in one model and not in another; here it fails the test that made it.
(Within a tensor's storage but outside its view is not caught: the storage is all the interpreter knows.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

_state = threading.local()


def _ranges(args: list[Any]) -> list[tuple[int, int]]:
    out = []
    for a in args:
        if isinstance(a, tuple):
            out += _ranges(list(a))
        elif hasattr(a, "untyped_storage"):
            s = a.untyped_storage()
            out.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
    return out


def _check(ptrs: Any, mask: Any, what: str) -> None:
    ranges = getattr(_state, "ranges", None)
    if not ranges:
        return
    ranges = ranges + getattr(_state, "extra", [])
    from triton.runtime.interpreter import _get_np_dtype

    size = np.dtype(_get_np_dtype(ptrs.get_element_ty())).itemsize
    addrs = np.asarray(ptrs.data, dtype=np.uint64)
    if mask is not None:
        addrs = addrs[np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)]
    addrs = addrs.ravel()
    inside = np.zeros(addrs.shape, dtype=bool)
    for lo, hi in ranges:
        inside |= (addrs >= lo) & (addrs + size <= hi)
    if not inside.all():
        bad = [hex(int(a)) for a in addrs[~inside][:3]]
        spans = [(hex(lo), hi - lo) for lo, hi in ranges]
        raise AssertionError(f"{_state.kernel}: {int((~inside).sum())} {what}(s) outside every tensor argument "
                             f"(e.g. {bad}; arguments (start, bytes): {spans})")


def install() -> None:
    """Patch Triton's interpreter: record each launch's tensor storages, check every load and store."""
    import triton.runtime.interpreter as interp

    grid, builder = interp.GridExecutor, interp.InterpreterBuilder
    if getattr(grid, "_kp_sanitized", None) is not None:
        return
    init, load, store = grid._init_args_hst, builder.create_masked_load, builder.create_masked_store

    def init_args(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        _state.ranges = _ranges([*args_hst, *kwargs_hst.values()])
        _state.kernel = getattr(self.fn, "__name__", repr(self.fn))
        return args_hst, kwargs_hst

    def masked_load(self: Any, ptrs: Any, mask: Any, other: Any, *args: Any) -> Any:
        _check(ptrs, mask, "load")
        return load(self, ptrs, mask, other, *args)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, *args: Any) -> Any:
        _check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *args)

    grid._init_args_hst = init_args
    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store
    grid._kp_sanitized = (init, load, store)


def uninstall() -> None:
    """Undo `install`."""
    import triton.runtime.interpreter as interp

    grid, builder = interp.GridExecutor, interp.InterpreterBuilder
    saved = getattr(grid, "_kp_sanitized", None)
    if saved is not None:
        grid._init_args_hst, builder.create_masked_load, builder.create_masked_store = saved
        grid._kp_sanitized = None
        _state.ranges = None


@contextmanager
def sanitized() -> Iterator[None]:
    """Interpreted launches inside are checked (left installed if it was installed before)."""
    import triton.runtime.interpreter as interp

    before = getattr(interp.GridExecutor, "_kp_sanitized", None)
    install()
    try:
        yield
    finally:
        if before is None:
            uninstall()


@contextmanager
def allow(*tensors: Any) -> Iterator[None]:
    """Let launches inside also touch these tensors' storages: a kernel that reads addresses from a
    table (ops/adamw.py) reaches tensors that are not its arguments."""
    extra = _ranges(list(tensors))
    before = getattr(_state, "extra", [])
    _state.extra = before + extra
    try:
        yield
    finally:
        _state.extra = before
