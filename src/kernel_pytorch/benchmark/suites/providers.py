"""Providers of an op benchmark: what each one runs on this device, and binding it to inputs.

    ours       spec.ours with backend="triton" on CUDA; backend="auto" elsewhere (the CPU kernels).
    <extra>    a spec's extra providers (e.g. "ours-auto"); no rows where one runs what "ours" runs.
    eager      spec.eager: the op as Hugging Face transformers writes it.
    compile    torch.compile(fullgraph=True, dynamic=False) of spec.eager.
    liger      Liger-Kernel's module (spec.liger) when importable, on CUDA.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch.benchmark.suites.spec import ModulePeer, OpBench

NOT_INSTALLED = "not installed"
NOT_AVAILABLE = "not available"
SAME = "same"  # runs exactly what another provider runs here: no rows


@dataclass(frozen=True)
class Impl:
    """One provider's code: a callable taking the inputs positionally, or (with `peer`) the peer's module
    class or function."""

    fn: Callable[..., Any]
    peer: ModulePeer | None = None


@dataclass
class Bound:
    """A provider bound to one set of inputs: `call()` runs the forward, `wrt` is what the backward
    differentiates (the spec's `grad_names`, parameters taken from the module where it has them)."""

    call: Callable[[], Any]
    wrt: list[Tensor]


def peer_kwargs(peer: ModulePeer, cls: type) -> dict[str, Any]:
    """The peer's optional constructor arguments that `cls` accepts."""
    params = inspect.signature(cls).parameters
    return {k: v for k, v in peer.optional_kwargs.items() if k in params}


def load_peer(target: str) -> tuple[type | None, str]:
    """Import "package.module:Class": (class, "ok"), or (None, "not installed" / "not available: why")."""
    module_name, _, attr = target.partition(":")
    if importlib.util.find_spec(module_name.split(".")[0]) is None:
        return None, NOT_INSTALLED
    try:
        module = importlib.import_module(module_name)
        if not hasattr(module, attr):
            raise ImportError(f"cannot import name {attr!r} from {module_name!r}")
        return getattr(module, attr), "ok"
    except Exception as exc:  # an installed package without this op, or a broken install
        return None, f"{NOT_AVAILABLE}: {type(exc).__name__}: {exc}"


def bind(spec: OpBench, impl: Impl, t: Mapping[str, Tensor], grad: bool) -> Bound:
    """`impl` on inputs `t`; with `grad`, fresh leaves of the differentiated inputs that require grad."""
    args = {k: (v.detach().requires_grad_(True) if grad and k in spec.grad_names else v) for k, v in t.items()}
    if impl.peer is None:
        fn = impl.fn
        return Bound(lambda: fn(*(args[n] for n in spec.arg_names)), [args[n] for n in spec.grad_names])
    peer = impl.peer
    if peer.function or not inspect.isclass(impl.fn):  # a function or autograd.Function: no module
        fn, kwargs = getattr(impl.fn, "apply", impl.fn), dict(peer.init_kwargs)
        return Bound(_cast(lambda: fn(*(args[n] for n in peer.call), **kwargs), peer.out_dtype),
                     [args[n] for n in spec.grad_names])
    first = args[peer.call[0]]
    module = impl.fn(*peer.init_args(args), **peer.init_kwargs, **peer_kwargs(peer, impl.fn))
    module = module.to(device=first.device, dtype=first.dtype)
    # the benchmark's own parameter values, so its outputs and gradients are comparable
    params = {name: module.get_parameter(peer.param_paths.get(name, name)) for name in peer.params}
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(args[name])
    for p in params.values():
        p.requires_grad_(grad)
    wrt = [params[n] if n in params else args[n] for n in spec.grad_names]
    return Bound(_cast(lambda: module(*(args[n] for n in peer.call)), peer.out_dtype), wrt)


def _cast(call: Callable[[], Any], dtype: torch.dtype | None) -> Callable[[], Any]:
    """`call` with its tensor outputs cast to `dtype` (ModulePeer.out_dtype); `call` itself for None."""
    if dtype is None:
        return call

    def cast() -> Any:
        out = call()
        if isinstance(out, Tensor):
            return out.to(dtype)
        return type(out)(o.to(dtype) if isinstance(o, Tensor) else o for o in out)

    return cast


def resolve(spec: OpBench, provider: str, device: torch.device) -> tuple[Impl | None, str, str]:
    """(code or None, status, note) of one provider for `spec` on `device`.

    status: "ok"; "same" (no rows); "not installed" / "not available" (rows with the reason).
    """
    if provider == "eager":
        return Impl(spec.eager), "ok", ""
    if provider == "ours":
        if device.type == "cuda":
            return Impl(functools.partial(spec.ours, backend="triton")), "ok", ""
        return Impl(functools.partial(spec.ours, backend="auto")), "ok", spec.ours_cpu_note
    if provider == "compile":
        return Impl(torch.compile(spec.eager, fullgraph=True, dynamic=False)), "ok", ""
    if provider == "liger":
        if spec.liger is None:
            return None, NOT_AVAILABLE, "Liger-Kernel has no counterpart"
        cls, status = load_peer(spec.liger.target)
        if cls is None:
            note = "" if status == NOT_INSTALLED else status.removeprefix(f"{NOT_AVAILABLE}: ")
            return None, NOT_INSTALLED if status == NOT_INSTALLED else NOT_AVAILABLE, note
        if device.type != "cuda":
            return None, NOT_AVAILABLE, "Liger-Kernel runs on CUDA"
        return Impl(cls, spec.liger), "ok", spec.liger.note
    for extra in spec.extras:
        if extra.name == provider:
            fn, note = extra.make(device)
            return (None, SAME, "") if fn is None else (Impl(fn), "ok", note)
    # a provider another op of the suite has: this op has nothing else to run for it
    return None, SAME, ""


__all__ = ["NOT_AVAILABLE", "NOT_INSTALLED", "SAME", "Bound", "Impl", "bind", "load_peer", "peer_kwargs",
           "resolve"]
