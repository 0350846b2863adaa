"""The op families' launch configs, and the one way to change them for a while.

Each op family keeps its launch knobs (block sizes, warps, schedules, which kernel variant runs) in one
frozen dataclass defined in that family's ops module, whose defaults are the measured choice (a comment
beside each names the result that chose it). The module registers its default here under the family
name; launchers read the config in force with `current(family)` (or take `config=`), and launch and
plan caches key on the config object, so a changed config never reuses a plan built for another.

Benchmarks, probes and tests change a config only through `override`:

    with tuning.override(rope=dataclasses.replace(tuning.current("rope"), schedule="tile")):
        ...
    with tuning.changed("rope", schedule="tile"):   # the same, shorter
        ...

Overrides live in a context variable, so they end with the `with` block, nest, and do not leak into
other threads, with one exception that keeps them in force where they are meant to be: the nodes of a
CUDA backward run on the autograd engine's device threads, which do not enter the context of the thread
that called `backward()`; torch stashes a copy of that context in the thread-local state it hands to
them (torch.autograd.graph._engine_run_backward), and `current` reads the overrides there when its own
thread has none. Nothing in `src/` assigns to a module attribute to tune a kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch

C = TypeVar("C")

_DEFAULTS: dict[str, Any] = {}  # family -> default config; written once per family, at import
_NO_OVERRIDES: Mapping[str, Any] = types.MappingProxyType({})
_OVERRIDES: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "kernel_pytorch_tuning", default=_NO_OVERRIDES
)
_MAIN_THREAD = threading.main_thread().ident


def register(family: str, default: C) -> C:
    """Record `default` (a frozen, hashable dataclass instance) as `family`'s launch config; returns it.

    Called once per family at import of its ops module; registering a second, different default for the
    same family is an error (two modules claiming one name)."""
    if not dataclasses.is_dataclass(default) or isinstance(default, type):
        raise TypeError(f"tuning.register: default for {family!r} must be a dataclass instance, got {default!r}")
    if not type(default).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"tuning.register: {type(default).__name__} must be a frozen dataclass")
    hash(default)  # a TypeError here names the unhashable field's type: caches key on the config
    known = _DEFAULTS.get(family)
    if known is not None and known != default:
        raise ValueError(f"tuning.register: family {family!r} already has the default {known!r}")
    _DEFAULTS[family] = default
    return default


def default(family: str) -> Any:
    """The registered default config of `family` (KeyError-free: unknown names raise ValueError)."""
    try:
        return _DEFAULTS[family]
    except KeyError:
        raise ValueError(f"unknown tuning family {family!r}; known: {sorted(_DEFAULTS)}") from None


def _backward_caller_overrides() -> Mapping[str, Any]:
    """The overrides of the thread that started the autograd backward this thread runs a node of (an
    engine device thread), or none."""
    try:
        if torch._C._is_key_in_tls("context"):
            return torch._C._get_obj_in_tls("context").get(_OVERRIDES, _NO_OVERRIDES)
    except AttributeError:  # pragma: no cover - a torch without the stash: overrides stay per thread
        pass
    return _NO_OVERRIDES


def current(family: str) -> Any:
    """The config of `family` in force here: the innermost `override` of it, else its default."""
    over = _OVERRIDES.get()
    if over is _NO_OVERRIDES and threading.get_ident() != _MAIN_THREAD:
        over = _backward_caller_overrides()  # the main thread never runs a device thread's nodes
    if family in over:
        return over[family]
    return default(family)


def families() -> dict[str, Any]:
    """Every registered family and the config in force for it now."""
    return {name: current(name) for name in sorted(_DEFAULTS)}


@contextlib.contextmanager
def override(**configs: Any) -> Iterator[None]:
    """Run the block with the given families' configs replaced: `override(rope=RopeConfig(...))`.

    Each value must be an instance of the family's config class (a typo'd field or family fails here,
    not silently at launch). Overrides nest: an inner one wins for the families it names."""
    for family, config in configs.items():
        base = default(family)
        if type(config) is not type(base):
            raise TypeError(
                f"tuning.override: {family}= needs a {type(base).__name__}, got {type(config).__name__}"
            )
    token = _OVERRIDES.set({**_OVERRIDES.get(), **configs})
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def changed(family: str, **fields: Any) -> contextlib.AbstractContextManager[None]:
    """`override` of one family with some fields of its current config replaced (unknown fields raise)."""
    return override(**{family: dataclasses.replace(current(family), **fields)})
