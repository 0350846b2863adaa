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

Overrides are process-wide, as the module constants they replace were: the nodes of a CUDA backward run
on the autograd engine's device threads, and an override around `loss.backward()` must reach them. They
end with their `with` block and nest; they are for benchmarks, probes and tests, not for threads that
want different configs at the same time. Nothing in `src/` assigns to a module attribute to tune a
kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import types
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

C = TypeVar("C")

_DEFAULTS: dict[str, Any] = {}  # family -> default config; written once per family, at import
_NO_OVERRIDES: Mapping[str, Any] = types.MappingProxyType({})
# the overrides in force: replaced, never mutated, by `override` (readers need no lock)
_overrides: Mapping[str, Any] = _NO_OVERRIDES
_LOCK = threading.Lock()


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


def current(family: str) -> Any:
    """The config of `family` in force here: the innermost `override` of it, else its default."""
    over = _overrides
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
    global _overrides
    with _LOCK:
        previous = _overrides
        _overrides = types.MappingProxyType({**previous, **configs})
    try:
        yield
    finally:
        with _LOCK:
            _overrides = previous


def changed(family: str, **fields: Any) -> contextlib.AbstractContextManager[None]:
    """`override` of one family with some fields of its current config replaced (unknown fields raise)."""
    return override(**{family: dataclasses.replace(current(family), **fields)})
