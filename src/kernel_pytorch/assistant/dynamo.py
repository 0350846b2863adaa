"""Dynamo state the analyses read and reset: compile records, counters, config and caches.

Every compile of the analysis starts from `torch._dynamo.reset()` and ends with another, runs under
`torch.no_grad()` (the analysis is of inference), and changes Dynamo's config only through
`torch._dynamo.config.patch`, so the caller's state is restored afterwards (`fresh_dynamo`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch._inductor.config

from kernel_pytorch.assistant.records import GraphInfo, NodeInfo, NodeRef


def backend_name(backend: str | Callable[..., Any]) -> str:
    """How reports name a torch.compile backend: a callable's `__name__`, else `str(backend)`."""
    return getattr(backend, "__name__", str(backend))


def _clear_compilation_metrics() -> None:
    clear = getattr(torch._dynamo.utils, "clear_compilation_metrics", None)
    if clear is not None:
        clear()


@contextlib.contextmanager
def metrics_room(size: int) -> Iterator[None]:
    """Let Dynamo keep at least `size` compile records (its deque keeps the last 64) for a while."""
    utils = torch._dynamo.utils
    old = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
    setter = getattr(utils, "set_compilation_metrics_limit", None)
    if setter is None or old is None or old >= size:
        yield
        return
    setter(size)
    try:
        yield
    finally:
        setter(old)


def compilation_metrics() -> list[Any]:
    """Dynamo's per-frame compile records since the last clear (CompilationMetrics objects)."""
    get = getattr(torch._dynamo.utils, "get_compilation_metrics", None)
    return list(get()) if get is not None else []


@contextlib.contextmanager
def fresh_dynamo(**config: Any) -> Iterator[None]:
    """Reset Dynamo, patch its config with `config`, run in no_grad; reset again and restore after.

    Unknown config names are dropped, so callers can ask for options that only some torch versions have.
    Dynamo's own warnings are silenced meanwhile (see `_quiet_dynamo`).
    """
    known = {k: v for k, v in config.items() if hasattr(torch._dynamo.config, k)}
    torch._dynamo.reset()
    _clear_compilation_metrics()
    try:
        with torch._dynamo.config.patch(**known), torch.no_grad(), _quiet_dynamo():
            yield
    finally:
        torch._dynamo.reset()


# loggers that report, at ERROR and with a traceback, what the analysis provokes on purpose: a dim marked
# dynamic that the code specialises (ConstraintViolationError while building a guard). The error also
# reaches the caller, which reports it; the log would only repeat it on stderr
_SHOUTING_LOGGERS = ("torch._guards", "torch._dynamo.guards", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def _quiet_dynamo() -> Iterator[None]:
    """Silence Dynamo's log warnings and Python warnings about graph breaks and recompile limits for a
    while: the analysis provokes them on purpose and reports them as findings."""
    levels = {name: logging.getLogger(name).level for name in ("torch._dynamo", *_SHOUTING_LOGGERS)}
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    for name in _SHOUTING_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"torch\._dynamo")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def inductor_caches(enabled: bool) -> Iterator[None]:
    """Leave Inductor's caches as configured, or bypass them all for the duration."""
    if enabled or not hasattr(torch._inductor.config, "force_disable_caches"):
        yield
        return
    with torch._inductor.config.patch(force_disable_caches=True):
        yield


def counters_snapshot() -> dict[str, dict[str, int]]:
    """A copy of `torch._dynamo.utils.counters` (global and never reset by torch; we diff it)."""
    return {k: {str(kk): int(vv) for kk, vv in v.items()} for k, v in torch._dynamo.utils.counters.items()}


def counters_diff(before: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """What the counters gained since `before`; empty groups are dropped."""
    out: dict[str, dict[str, int]] = {}
    for group, values in counters_snapshot().items():
        old = before.get(group, {})
        delta = {k: v - old.get(k, 0) for k, v in values.items() if v - old.get(k, 0)}
        if delta:
            out[group] = delta
    return out


class GraphRecorder:
    """A torch.compile backend that records each graph's ops and nodes, then hands the graph to `inner`."""

    def __init__(self, inner: str | Callable[..., Any]) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        self.inner = lookup_backend(inner)
        self.graphs: list[GraphInfo] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        ops = tuple(
            _target_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")
        )
        try:
            nodes = tuple(node_info(n) for n in gm.graph.nodes)
        except Exception:  # the node records are extra detail: never let them fail a trace
            nodes = ()
        self.graphs.append(GraphInfo(ops, nodes))
        return self.inner(gm, example_inputs)


def node_info(node: torch.fx.Node) -> NodeInfo:
    """`node` as plain data: target, arguments, example value's shape and dtype, module path, stack."""
    value = node.meta.get("example_value")
    shape = itemsize = dtype = contiguous = None
    if isinstance(value, torch.Tensor):
        shape = tuple(_size(s) for s in value.shape)
        itemsize, dtype = value.element_size(), str(value.dtype).removeprefix("torch.")
        try:
            contiguous = bool(value.is_contiguous())
        except Exception:  # a symbolic layout Dynamo cannot decide without a guard
            contiguous = None
    # a module reached through a global (transformers wraps `apply_rotary_pos_emb` in a module of the
    # `kernels` package, "G['__import_...'].apply_rotary_pos_emb") is none of the model's: the node
    # belongs to the innermost module of the model around that call
    entries = list((node.meta.get("nn_module_stack") or {}).values())
    own = [e for e in entries if not e[0].startswith("G[")]
    path, cls = own[-1] if own else (None, None)
    return NodeInfo(
        name=node.name,
        op=node.op,
        target=_target_name(node.target),
        args=tuple(_plain(a) for a in node.args),
        kwargs={k: _plain(v) for k, v in node.kwargs.items()},
        shape=shape,
        itemsize=itemsize or 0,
        dtype=dtype,
        contiguous=contiguous,
        module_path=module_path(path) if path is not None else None,
        module_type=getattr(cls, "__name__", None) if cls is not None else None,
        stack=str(node.meta.get("stack_trace") or ""),
    )


def _size(s: Any) -> int | None:
    """A size as an int: a SymInt by its hint (no guard is added), None where it has none."""
    if isinstance(s, int):
        return s
    hint = getattr(getattr(s, "node", None), "hint", None)
    return int(hint) if isinstance(hint, int) else None


def _plain(value: Any) -> Any:
    """An FX argument as plain data: nodes by name, containers as tuples, sizes as ints."""
    if isinstance(value, torch.fx.Node):
        return NodeRef(value.name)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, slice):
        return slice(_plain(value.start), _plain(value.stop), _plain(value.step))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _size(value)
    if value is None or value is Ellipsis or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value).removeprefix("torch.")
    return str(value)


def module_path(dynamo_path: str) -> str:
    """Dynamo's module path ("L['self'].model.layers[0]", "L['self']._modules['mlp']") as
    `named_modules` names it ("model.layers.0", "mlp"); "" for the root module. A forward behind a
    `(*args, **kwargs)` wrapper (newer transformers wrap forward in `deprecate_kwarg`) reaches the root
    module as "L['args'][0]"."""
    path = re.sub(r"^L\['self'\]|^self\b|^L\['args'\]\[0\]", "", dynamo_path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".")


# Dynamo's names for a module imported by a traced function: G['__import_transformers_dot_models_dot_x']
_IMPORTED = re.compile(r"""G\[['"]__import_(\w+?)['"]\]""")
_GLOBAL = re.compile(r"""G\[['"]([A-Za-z_]\w*)['"]\]""")
_LOCAL = re.compile(r"""L\[['"]([A-Za-z_]\w*)['"]\]""")
_MODULES = re.compile(r"""\._modules\[['"]([^'"\]]+)['"]\]""")


def readable(text: str) -> str:
    """Dynamo's source names in `text` (a guard, a break reason) as the user's code names them:
    `G['__import_transformers_dot_models_dot_qwen2']` -> `transformers.models.qwen2`, `G['fn']` -> `fn`,
    `L['self'].model._modules['layers']` -> `self.model.layers`, `L['x']` -> `x`."""
    text = _IMPORTED.sub(lambda m: m.group(1).replace("_dot_", "."), text)
    text = _GLOBAL.sub(r"\1", text)
    text = _LOCAL.sub(r"\1", text)
    return _MODULES.sub(r".\1", text)


def _target_name(target: Any) -> str:
    """A short name for an FX node target: method and module names as they are, functions by name."""
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or str(target)
