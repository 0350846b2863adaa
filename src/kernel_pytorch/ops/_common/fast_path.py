"""The eager host-time fast path: an op's launchers called without the op dispatcher, behind one switch.

What it builds for an op that `register_op` registers (register.py builds the plain path alone):

    eager_launcher  the launcher with eager=True as its keyword default (a clone of its code object), so
                    the entry calls it with positional arguments alone
    the eager entry an autograd.Function whose forward and backward call those launchers, entered by
                    its C apply (`torch._C._FunctionBase.apply`), and with grad mode off the forward
                    launcher alone; under functorch transforms the Function's own `apply`

The plain path, which every op also has, is the registered op through the dispatcher (its CPU kernel,
or its body, which launches through `wrap_triton`), with the autograd registered on it. The op
dispatcher and the Python layers around it cost 30-50 us of host time per call on the CUDA hosts
(docs/architecture.md), which decides small shapes.

The switch: the "fast_path" tuning config (`FastPath`), whose default comes from the environment
variable KERNEL_PYTORCH_FAST_PATH, read once at import ("0", "false", "off", "no" turn the fast path
off; unset, it is on). It is read when an op registers, which for kernel_pytorch's ops is the import of
kernel_pytorch.ops: set the variable before that import. `tuning.override(fast_path=FastPath(...))`
around a `register_op` call decides that op's entry (how tests build both paths in one process); it
does not change entries built before.

Private torch APIs it relies on, looked up when an op registers: `torch._C._FunctionBase.__dict__
["apply"]`, `torch._C._are_functorch_transforms_active`, and
`torch.autograd.function._is_setup_context_defined` (which must say that the Function defines no
setup_context, the case where the C apply is what `Function.apply` would call). Where one is missing
or not as expected (a torch upgrade), the op gets the plain path and one log line says why.

Measured host time per call (`python -m tests.ops.test_fast_path`: a toy op whose launchers are one
multiply on an 8 x 16 fp32 CPU tensor, medians of 31 rounds of 200 calls, the two entries alternating;
three runs on 2026-12-07, a 2-core AMD EPYC VM with a load average of 5-8, torch 2.13.0+cpu):

    forward, no grad       fast 2.6-2.9 us, plain 9.5-30.1 us   (median ratio 0.08-0.28)
    forward and backward   fast 40.0-41.7 us, plain 98.2-103.5 us   (median ratio 0.42-0.51)

tests/ops/test_fast_path.py asserts the median ratio stays below 1 in both modes.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_not
from typing import Any

import torch

from kernel_pytorch._env import log_once
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.op_plan import NONES, Plan, Schema

_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")


@dataclass(frozen=True)
class FastPath:
    """enabled: eager entries call the launchers without the op dispatcher; off, they call the
    registered op. Read when an op registers (module docstring)."""

    enabled: bool = True


def _from_environment() -> FastPath:
    value = os.environ.get("KERNEL_PYTORCH_FAST_PATH", "").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(f"KERNEL_PYTORCH_FAST_PATH={value!r}: use 1 (on, the default) or 0 (off)")
    return FastPath(enabled=value not in _OFF)


# On unless KERNEL_PYTORCH_FAST_PATH=0: the host time it saves per eager call, measured on the CPU in
# this module's docstring (2026-12-07), 30-50 us on the CUDA hosts (docs/architecture.md).
DEFAULT = tuning.register("fast_path", _from_environment())


def enabled() -> bool:
    """Whether an op registered now gets the fast path (before the private APIs are looked up)."""
    return tuning.current("fast_path").enabled


def eager_launcher(launch: Callable[..., Any]) -> Callable[..., Any]:
    """`launch` with eager=True as its default, so the eager entry calls it with positional arguments
    alone (`f(*args, eager=True)` would build a keyword dict on every call). The same code object,
    globals and defaults: only the keyword default differs. `launch` has been checked by register.py."""
    eager = types.FunctionType(launch.__code__, launch.__globals__, launch.__name__, launch.__defaults__,
                               launch.__closure__)
    eager.__kwdefaults__ = {**launch.__kwdefaults__, "eager": True}
    eager.__qualname__, eager.__module__ = launch.__qualname__, launch.__module__
    eager.__doc__ = launch.__doc__
    return eager


def forward_only_entry(launch: Callable[..., Any]) -> Callable[..., Any] | None:
    """A forward-only op's eager entry: its launcher with eager=True; None where the switch is off."""
    return eager_launcher(launch) if enabled() else None


class _Private:
    """The private torch pieces the entry calls, looked up once per registration."""

    def __init__(self, cls: type[torch.autograd.Function]) -> None:
        is_setup_context_defined = torch.autograd.function._is_setup_context_defined
        self.transforms_active = torch._C._are_functorch_transforms_active
        self.c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)
        if is_setup_context_defined(cls.setup_context) or not callable(self.transforms_active):
            raise TypeError("Function.apply no longer reduces to its C apply for a Function without setup_context")


def _eager_function(
    name: str, module: str, launch_fwd: Callable[..., Any], launch_bwd: Callable[..., Any], plan: Plan,
    fs: Schema, bs: Schema,
) -> type[torch.autograd.Function]:
    """The eager autograd.Function: the launchers with eager=True, no op dispatcher.

    Per call its forward runs the launcher, C-level pickers over the arguments and outputs,
    save_for_backward and one ctx attribute; its backward the launcher and one picker. The constants
    are bound here: no dict built and no helper frame per call.
    """
    saved, kept, flagged, flag, returned = plan.saved, plan.kept, plan.flagged, plan.flag, plan.returned
    route, fwd_single, bwd_single = plan.route, fs.single, bs.single
    n_inputs, defaults = len(fs.inputs), fs.defaults
    n_required = n_inputs - len(defaults)

    def eager_forward(ctx: Any, *args: Any) -> Any:
        if n_required <= len(args) < n_inputs:  # trailing arguments left to their defaults, as the op allows
            args += defaults[len(args) - n_inputs :]
        outs = launch_fwd(*args)
        if fwd_single:
            outs = (outs,)
        ctx.save_for_backward(*saved(args + outs))
        if flagged is None:
            ctx.state = kept(args)
        elif flag is not None:  # one optional input's presence (LayerNorm's bias): no map
            ctx.state = kept(args) + (args[flag] is not None,)
        else:
            ctx.state = kept(args) + tuple(map(is_not, flagged(args), NONES))
        return returned(outs)

    def eager_backward(ctx: Any, *out_grads: Any) -> tuple:
        outs = launch_bwd(*out_grads, *ctx.saved_tensors, *ctx.state)
        return route((None, outs) if bwd_single else (None, *outs))

    return type(
        "".join(part.title() for part in name.split("_")) + "Eager",
        (torch.autograd.Function,),
        {
            "__doc__": f"Eager CUDA path of {name}: the launchers without the op dispatcher (compile and "
            "export use the registered op).",
            "__module__": module,
            "forward": staticmethod(eager_forward),
            "backward": staticmethod(eager_backward),
        },
    )


def eager_entry(
    name: str, module: str, launch_fwd: Callable[..., Any], launch_bwd: Callable[..., Any], plan: Plan,
    fs: Schema, bs: Schema,
) -> Callable[..., Any] | None:
    """The fast eager entry of an op with a backward, or None where the switch is off or the private
    APIs are not as expected (then logged once, and register.py builds the plain entry).

    autograd.Function.apply's Python layer binds default arguments (only with a setup_context, which
    these Functions do not define) and unwraps tensors left over from a finished functorch transform,
    at 2-3 us per call on the CUDA hosts; the functional layer calls the entry with tensors it has just
    checked, not such leftovers, so the entry calls the C apply. With grad mode off (no_grad,
    inference_mode: a decode step) nothing is recorded, so the forward launcher runs alone, as
    Function.apply would run it, without the Function's context and output wrapping. Under functorch
    transforms every call takes `cls.apply`.
    """
    if not enabled():
        return None
    launch_fwd = eager_launcher(launch_fwd)
    cls = _eager_function(name, module, launch_fwd, eager_launcher(launch_bwd), plan, fs, bs)
    try:
        private = _Private(cls)
    except (AttributeError, KeyError, TypeError) as e:
        log_once(f"kernel_pytorch: the eager fast path is off ({type(e).__name__}: {e}); eager calls go "
                 "through the registered ops", logging.WARNING)
        return None
    full, transforms_active, c_apply = cls.apply, private.transforms_active, private.c_apply
    grad_enabled = torch.is_grad_enabled
    returned, fwd_single = plan.returned, fs.single
    n_inputs, defaults = len(fs.inputs), fs.defaults
    n_required = n_inputs - len(defaults)

    def entry(*args: Any) -> Any:
        if transforms_active():
            return full(*args)
        if grad_enabled():
            return c_apply(*args)
        if n_required <= len(args) < n_inputs:
            args += defaults[len(args) - n_inputs :]
        outs = launch_fwd(*args)
        return returned((outs,) if fwd_single else outs)

    entry.__doc__ = f"{cls.__name__}.apply, by its C apply; the forward launcher alone in no-grad mode."
    entry.__name__ = entry.__qualname__ = f"{name}_eager"
    entry.Function = cls  # type: ignore[attr-defined]  # the autograd.Function behind it
    return entry
