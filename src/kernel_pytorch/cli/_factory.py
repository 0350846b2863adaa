"""Load user models for the CLI: `FILE.py:NAME`, `package.module:NAME`, or a bare `FILE.py`.

A factory is a callable returning `(model, example_inputs)`, where the inputs are a tuple (or list) of
positional arguments, a dict of keyword arguments, or a single tensor. A bare `FILE.py` (no `:NAME`)
may instead define the benchmark-style trio `Model`, `get_inputs()` and `get_init_inputs()`; the
factory then builds `Model(*get_init_inputs())` and calls it on `get_inputs()`.

Shared by every subcommand that takes models (`validate`, `analyze`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import Inputs, as_inputs

Factory = Callable[[], tuple[nn.Module, Inputs]]

# --dtype names the CLI accepts (short and torch spellings)
DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp64": torch.float64,
    "float64": torch.float64,
}

# names tried, in order, when a bare FILE.py defines a factory function rather than the trio
_DEFAULT_FACTORY_NAMES = ("make", "factory", "get_model")


class FactoryError(ValueError):
    """A factory spec that cannot be loaded, a factory that raised, or one that returned the wrong thing."""


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line (its first line, "..." where more was cut), for the CLI's error line."""
    return short_error(exc, 300, lines=1).replace("\n", " ")


def placement_error(what: str, exc: BaseException) -> str:
    """The CLI's error line for `what` (the model, the inputs) that could not be moved to --device / --dtype."""
    return f"error: cannot move {what} to --device/--dtype: {one_line(exc)}"


def call(fn: Callable[[], Any], spec: str) -> Any:
    """`fn()`, the user's factory; an exception it raises becomes a FactoryError of one line naming
    `spec` (the CLI prints it and exits 2, as for a spec that cannot be loaded)."""
    try:
        return fn()
    except FactoryError:
        raise
    except Exception as exc:
        raise FactoryError(f"{spec} raised {one_line(exc)}") from exc


def _split(spec: str) -> tuple[str, str | None]:
    """('path/or.module', 'NAME' or None). Splits on the last ':' so Windows drive letters survive."""
    head, sep, tail = spec.rpartition(":")
    if not sep or not tail or "/" in tail or "\\" in tail or tail.endswith(".py"):
        return spec, None
    return head, tail


def load_module(target: str) -> ModuleType:
    """Import `target`: a path to a .py file (imported under a private name) or a dotted module name."""
    path = Path(target)
    if target.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FactoryError(f"no such file: {target}")
        resolved = path.resolve()
        # a stable private name per file, so two files called model.py do not collide in sys.modules
        digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
        name = f"_kernel_pytorch_user_{resolved.stem}_{digest}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise FactoryError(f"cannot import {target} as a Python module")
        module = importlib.util.module_from_spec(spec)
        # the file's own directory first, so its sibling imports resolve as they would when run directly
        sys.path.insert(0, str(resolved.parent))
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise FactoryError(f"importing {target} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            sys.path.remove(str(resolved.parent))
        return module
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise FactoryError(f"{target!r} is neither a .py file nor an importable module: {exc}") from exc


def load_callable(spec: str) -> Callable[[], Any]:
    """The raw callable `spec` names, unwrapped (its return value is not checked).

    For a bare module or file with no `:NAME`, the trio `Model` / `get_inputs` / `get_init_inputs` is
    turned into a factory; failing that, a function named make, factory or get_model is used.
    """
    target, attr = _split(spec)
    module = load_module(target)
    if attr is not None:
        if not hasattr(module, attr):
            public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
            listing = ", ".join(public) or "none"
            raise FactoryError(f"{target} defines no {attr!r}; callables there: {listing}")
        fn = getattr(module, attr)
        if not callable(fn):
            raise FactoryError(f"{spec} is a {type(fn).__name__}, not a callable")
        return fn
    if all(hasattr(module, n) for n in ("Model", "get_inputs")):
        return _trio_factory(module, "Model")
    for name in _DEFAULT_FACTORY_NAMES:
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    raise FactoryError(
        f"{target} has no factory: name one as {target}:NAME, or define Model, get_inputs() and "
        "get_init_inputs()"
    )


def _trio_factory(module: ModuleType, model_attr: str) -> Factory:
    def build() -> tuple[nn.Module, Inputs]:
        where = module.__file__ or module.__name__
        init = call(module.get_init_inputs, f"{where}: get_init_inputs()") if hasattr(module, "get_init_inputs") else ()
        model_cls = getattr(module, model_attr)
        model = call(lambda: model_cls(**init) if isinstance(init, dict) else model_cls(*init),
                     f"{where}: {model_attr}(...)")
        return model, normalize_inputs(call(module.get_inputs, f"{where}: get_inputs()"))

    build.__name__ = f"{module.__name__}.{model_attr}"
    return build


def trio_pair(spec: str) -> tuple[Factory, Factory] | None:
    """(Model factory, ModelNew factory) when the file of `spec` defines both classes, else None.

    Both factories draw inputs from the same `get_inputs()`; the caller seeds the RNG.
    """
    target, attr = _split(spec)
    if attr is not None:
        return None
    module = load_module(target)
    if all(hasattr(module, n) for n in ("Model", "ModelNew", "get_inputs")):
        return _trio_factory(module, "Model"), _trio_factory(module, "ModelNew")
    return None


def normalize_inputs(inputs: Any) -> Inputs:
    """Positional args as a tuple, or keyword args as a dict; a lone tensor becomes a 1-tuple."""
    if isinstance(inputs, (Mapping, tuple, list, torch.Tensor)):
        return as_inputs(inputs)
    raise FactoryError(
        f"example inputs must be a tuple/list of positional args, a dict of kwargs or a tensor "
        f"(got {type(inputs).__name__})"
    )


def check_pair(result: Any, spec: str) -> tuple[nn.Module, Inputs]:
    """Check a factory's return value is `(module, inputs)` and normalise the inputs."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise FactoryError(f"{spec} must return (model, example_inputs); got {type(result).__name__}")
    model, inputs = result
    if not isinstance(model, nn.Module):
        raise FactoryError(
            f"{spec} returned a {type(model).__name__} as the model; expected a torch.nn.Module"
        )
    return model, normalize_inputs(inputs)


def load_extra_inputs(spec: str) -> list[Inputs]:
    """The calls of other shapes that the module of `spec` offers through an optional `get_extra_inputs()`
    (a list of example inputs like the factory's, e.g. other batch sizes and sequence lengths), normalised;
    [] when it defines none. optimize() marks the dims that vary across them dynamic (`mark_dynamic`).

    Raises:
        FactoryError: get_extra_inputs is not callable or does not return a list or tuple of inputs.
    """
    target, _ = _split(spec)
    fn = getattr(load_module(target), "get_extra_inputs", None)
    if fn is None:
        return []
    if not callable(fn):
        raise FactoryError(f"{target}: get_extra_inputs is a {type(fn).__name__}, not a function")
    calls = call(fn, f"{target}: get_extra_inputs()")
    if not isinstance(calls, (list, tuple)):
        raise FactoryError(f"{target}: get_extra_inputs() must return a list of example inputs "
                           f"(got {type(calls).__name__})")
    return [normalize_inputs(c) for c in calls]


def load_factory(spec: str) -> Callable[[], tuple[nn.Module, tuple | dict]]:
    """A zero-argument callable returning `(model, example_inputs)` for the factory `spec` names.

    Args:
        spec: `FILE.py:NAME`, `package.module:NAME`, or `FILE.py` defining `Model`, `get_inputs()`
            and (optionally) `get_init_inputs()`.
    Returns:
        A callable; each call builds a fresh model and inputs, checked and normalised (inputs a tuple
        of positional args or a dict of keyword args).
    Raises:
        FactoryError: the spec cannot be imported or names nothing callable; from the callable, when
            the factory raises (one line naming the spec and the error) or returns the wrong thing.
    """
    fn = load_callable(spec)

    def factory() -> tuple[nn.Module, tuple | dict]:
        return check_pair(call(fn, spec), spec)

    factory.__name__ = getattr(fn, "__name__", "factory")
    return factory


__all__ = [
    "Factory",
    "FactoryError",
    "Inputs",
    "call",
    "check_pair",
    "load_callable",
    "load_extra_inputs",
    "load_factory",
    "load_module",
    "normalize_inputs",
    "one_line",
    "placement_error",
    "trio_pair",
]
