"""What an analysis may change and must put back: the process's global state and the analysed model.

An analysis compiles, traces, profiles, sweeps shapes and runs training steps; any of those can leave
something behind (a Dynamo or Inductor config value, an environment variable, the thread count, grad
mode, RNG state, a hook or a compiled wrapper on the model, BatchNorm running statistics advanced by
the calls). `Snapshot.take(module)` records all of it once; `restore()` puts back whatever differs and
resets Dynamo, and `changes()` names what differs (empty when nothing does). The assistant restores
after every analysis, so each one starts from the caller's state and leaves it as it found it.

The model's parameters and buffers (persistent or not) are kept as copies on the CPU, so a model on a
GPU does not need twice its memory there; they are written back in place, bitwise, together with each
parameter's `requires_grad` and `.grad`.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._inductor.config
import torch.fx.experimental._config
from torch import nn
from torch.nn.modules import module as module_globals

from kernel_pytorch._tree import bitwise_equal

# the config modules an analysis patches (`config.patch` restores them; a value set any other way would stay)
_CONFIGS = (
    ("torch._dynamo.config", torch._dynamo.config),
    ("torch._inductor.config", torch._inductor.config),
    ("torch._functorch.config", torch._functorch.config),
    ("torch.fx.experimental._config", torch.fx.experimental._config),
)


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _autocast(device: str) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)


def _set_autocast(device: str, value: tuple[bool, torch.dtype]) -> None:
    torch.set_autocast_enabled(device, value[0])
    torch.set_autocast_dtype(device, value[1])


# process-wide switches read and written through torch's own functions: (name, (get, set))
_FLAGS: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
    "num_threads": (torch.get_num_threads, torch.set_num_threads),
    "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
    "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "deterministic": (_deterministic, lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "cuda.matmul.allow_tf32": (lambda: torch.backends.cuda.matmul.allow_tf32,
                               lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    "cudnn.allow_tf32": (lambda: torch.backends.cudnn.allow_tf32,
                         lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    "cudnn.benchmark": (lambda: torch.backends.cudnn.benchmark,
                        lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
    "cudnn.deterministic": (lambda: torch.backends.cudnn.deterministic,
                            lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
    "autocast.cpu": (lambda: _autocast("cpu"), lambda v: _set_autocast("cpu", v)),
    "autocast.cuda": (lambda: _autocast("cuda"), lambda v: _set_autocast("cuda", v)),
    "dynamo_eval_frame": (torch._C._dynamo.eval_frame.get_eval_frame_callback,
                          torch._C._dynamo.eval_frame.set_eval_frame),
    "profiler_enabled": (torch.autograd._profiler_enabled,
                         lambda v: None if v else torch.autograd._disable_profiler()),
    "sys.trace": (sys.gettrace, sys.settrace),
    "sys.profile": (sys.getprofile, sys.setprofile),
    "recursion_limit": (sys.getrecursionlimit, sys.setrecursionlimit),
}
# nn.Module's process-wide hook tables (every module's forward runs them)
_GLOBAL_HOOKS = tuple(name for name in dir(module_globals) if name.startswith("_global_") and
                      isinstance(getattr(module_globals, name), dict))


def _rng() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _same_rng(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys() or not torch.equal(a["torch"], b["torch"]) or a["python"] != b["python"]:
        return False
    if "cuda" in a and not all(torch.equal(x, y) for x, y in zip(a["cuda"], b["cuda"])):
        return False
    return "numpy" not in a or pickle.dumps(a["numpy"]) == pickle.dumps(b["numpy"])


def _torch_loggers() -> dict[str, int]:
    names = [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]
    return {n: logging.getLogger(n).level for n in names}


def _same_value(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # values that do not compare (tensors, arrays): only the same object counts
        return False


@dataclass
class _TensorCopy:
    tensor: torch.Tensor
    saved: torch.Tensor  # on the CPU
    device: torch.device
    requires_grad: bool
    grad: torch.Tensor | None  # the .grad object itself
    grad_saved: torch.Tensor | None  # its contents, on the CPU


@dataclass
class _ModuleCopy:
    module: nn.Module
    attributes: dict[str, Any]  # the instance __dict__, shallow: `training`, `forward`, `_compiled_call_impl`, ...
    tables: dict[str, dict[Any, Any]]  # the contents of its dict attributes: hooks, _parameters, _buffers, _modules


class Snapshot:
    """The process's global state and `module`'s state at one moment; see the module docstring."""

    def __init__(self, module: nn.Module | None) -> None:
        self.configs = {name: cfg.get_config_copy() for name, cfg in _CONFIGS}
        self.flags = {name: get() for name, (get, _) in _FLAGS.items()}
        self.environ = dict(os.environ)
        self.affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.rng = _rng()
        self.loggers = _torch_loggers()
        self.warning_filters = list(warnings.filters)
        self.global_hooks = {name: dict(getattr(module_globals, name)) for name in _GLOBAL_HOOKS}
        self.modules: list[_ModuleCopy] = []
        self.tensors: list[_TensorCopy] = []
        if module is not None:
            self._take_module(module)

    @classmethod
    def take(cls, module: nn.Module | None = None) -> Snapshot:
        return cls(module)

    def _take_module(self, module: nn.Module) -> None:
        seen: set[int] = set()
        for m in module.modules():
            attrs = dict(vars(m))
            self.modules.append(_ModuleCopy(m, attrs, {k: dict(v) for k, v in attrs.items() if isinstance(v, dict)}))
            for t in [*m._parameters.values(), *m._buffers.values()]:
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                grad = t.grad if isinstance(t, nn.Parameter) else None
                self.tensors.append(_TensorCopy(
                    t, t.detach().to("cpu", copy=True), t.device, t.requires_grad, grad,
                    None if grad is None else grad.detach().to("cpu", copy=True)))

    # ----- what differs ---------------------------------------------------------------------------

    def changes(self) -> list[str]:
        """What differs now from the snapshot, one line each (empty: nothing)."""
        out: list[str] = []
        for name, cfg in _CONFIGS:
            now = cfg.get_config_copy()
            out += [f"{name}.{k}" for k, v in self.configs[name].items() if not _same_value(now.get(k), v)]
        for name, (get, _) in _FLAGS.items():
            if not _same_value(get(), self.flags[name]):
                out.append(f"{name}: {self.flags[name]!r} -> {get()!r}")
        env = dict(os.environ)
        out += [f"environment variable {k}" for k in sorted(set(env) | set(self.environ))
                if env.get(k) != self.environ.get(k)]
        if self.affinity is not None and os.sched_getaffinity(0) != self.affinity:
            out.append("CPU affinity")
        if not _same_rng(_rng(), self.rng):
            out.append("RNG state")
        if _torch_loggers() != {n: self.loggers.get(n, logging.NOTSET) for n in _torch_loggers()}:
            out.append("torch logger levels")
        if list(warnings.filters) != self.warning_filters:
            out.append("warning filters")
        for name, saved in self.global_hooks.items():
            if not _same_table(getattr(module_globals, name), saved):
                out.append(f"nn.Module {name}")
        out += self._module_changes()
        return out

    def _module_changes(self) -> list[str]:
        out = []
        names = {id(c.module): n for c, n in zip(self.modules, _names(self.modules))}
        for c in self.modules:
            where = names[id(c.module)] or "the model"
            now = vars(c.module)
            for k in sorted(set(now) | set(c.attributes)):
                if k not in c.attributes or k not in now or now[k] is not c.attributes[k]:
                    out.append(f"{where}: attribute {k}")
                elif k in c.tables and not _same_table(now[k], c.tables[k]):
                    out.append(f"{where}: {k}")
        for t in self.tensors:
            if t.tensor.requires_grad != t.requires_grad:
                out.append(f"a {tuple(t.tensor.shape)} tensor's requires_grad")
            if not bitwise_equal(t.tensor, t.saved) or t.tensor.device != t.device:
                out.append(f"a {tuple(t.tensor.shape)} parameter or buffer's values")
            grad = t.tensor.grad if isinstance(t.tensor, nn.Parameter) else None
            moved = grad is not None and t.grad_saved is not None and not bitwise_equal(grad, t.grad_saved)
            if grad is not t.grad or moved:
                out.append(f"a {tuple(t.tensor.shape)} parameter's .grad")
        return out

    # ----- putting it back ------------------------------------------------------------------------

    def restore(self) -> None:
        """Reset Dynamo and put back everything that differs from the snapshot."""
        torch._dynamo.reset()
        for name, cfg in _CONFIGS:
            now = cfg.get_config_copy()
            for k, v in self.configs[name].items():
                if not _same_value(now.get(k), v):
                    setattr(cfg, k, v)
        for name, (get, put) in _FLAGS.items():
            if not _same_value(get(), self.flags[name]):
                put(self.flags[name])
        for k in set(os.environ) - set(self.environ):
            del os.environ[k]
        for k, v in self.environ.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        if self.affinity is not None and os.sched_getaffinity(0) != self.affinity:
            os.sched_setaffinity(0, self.affinity)
        if not _same_rng(_rng(), self.rng):
            _set_rng(self.rng)
        for n in _torch_loggers():
            logging.getLogger(n).setLevel(self.loggers.get(n, logging.NOTSET))
        if list(warnings.filters) != self.warning_filters:
            warnings.filters[:] = self.warning_filters
            warnings._filters_mutated()  # type: ignore[attr-defined]
        for name, saved in self.global_hooks.items():
            _put_table(getattr(module_globals, name), saved)
        self._restore_module()

    def _restore_module(self) -> None:
        for c in self.modules:
            now = vars(c.module)
            for k in set(now) - set(c.attributes):
                del now[k]
            for k, v in c.attributes.items():
                if now.get(k) is not v:
                    now[k] = v
                if k in c.tables:
                    _put_table(v, c.tables[k])
        with torch.no_grad():
            for t in self.tensors:
                tensor = t.tensor
                if tensor.shape != t.saved.shape or tensor.dtype != t.saved.dtype or tensor.device != t.device:
                    tensor.data = t.saved.to(t.device, copy=True)
                else:
                    tensor.copy_(t.saved)
                if tensor.requires_grad != t.requires_grad:
                    tensor.requires_grad_(t.requires_grad)
                if isinstance(tensor, nn.Parameter):
                    if t.grad is not None and t.grad_saved is not None:
                        t.grad.copy_(t.grad_saved)
                    if tensor.grad is not t.grad:
                        tensor.grad = t.grad


def _same_table(now: dict[Any, Any], saved: dict[Any, Any]) -> bool:
    return now.keys() == saved.keys() and all(now[k] is v for k, v in saved.items())


def _put_table(table: dict[Any, Any], saved: dict[Any, Any]) -> None:
    if not _same_table(table, saved):
        table.clear()
        table.update(saved)


def _names(copies: list[_ModuleCopy]) -> list[str]:
    """The modules' names as `named_modules` of the first (the root) gives them."""
    if not copies:
        return []
    named = {id(m): n for n, m in copies[0].module.named_modules()}
    return [named.get(id(c.module), type(c.module).__name__) for c in copies]


__all__ = ["Snapshot"]
