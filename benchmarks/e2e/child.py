"""One benchmark row in a fresh (spawned) process, its failure brought back whole.

A row runs in a child so that what it patches in transformers dies with it, and a device fault (an illegal
address poisons its process's CUDA context) costs that row only. The child's exception must cross back by
pickle; many of torch's do not pickle (Dynamo's and Inductor's carry frames, modules and graphs), and the
parent would see only "cannot pickle ..." in place of the failure. So the child prints the full traceback
into the run's log and raises `ChildFailure`, which carries the original type's name and message.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any


class ChildFailure(RuntimeError):
    """A row's exception in the child process: its type's name and message, picklable."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.message = message

    def __reduce__(self) -> tuple:
        return (ChildFailure, (self.type_name, self.message))


def _call(fn: Callable[..., Any], args: tuple) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()  # the whole story in the run's log; the row keeps the first line
        raise ChildFailure(type(exc).__name__, str(exc)) from None


def in_child(fn: Callable[..., Any], args: tuple) -> Any:
    """fn(*args) in a fresh spawned process; its exception comes back as `ChildFailure`."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_call, fn, args).result()


def failure_name(exc: BaseException) -> str:
    """The name of the exception a row failed with (the child's original type for `ChildFailure`)."""
    return exc.type_name if isinstance(exc, ChildFailure) else type(exc).__name__
