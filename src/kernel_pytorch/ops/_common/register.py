"""One registration for every op: its torch ops, their CPU kernels, fakes and autograd, and the eager
autograd.Function, built from a short description.

For an op `name` with a backward, `register_op` defines

    <namespace>::<name>_fwd, <namespace>::<name>_bwd   torch.library.triton_op; the body runs the
        launcher on CUDA and the reference elsewhere (compile, export and opcheck trace the body for
        every device, so the non-CUDA branch lives in the body as well as in register_kernel("cpu"))
    register_fake for both, register_autograd for the forward (the backward op has none)
    an eager autograd.Function and the eager CUDA entry (`_eager_entry`: its C apply, or the forward
        launcher alone in no-grad mode): the launchers with eager=True, without the op dispatcher (30-50
        us of host time per call, which decides small shapes)

A forward-only op (no backward) gets `<name>_fwd` alone, and the launcher with eager=True as its eager
entry.

Conventions the description relies on:
    schema     the reference's parameters and return annotation; an output annotated `Tensor | None`
               is a Tensor in the schema, an empty one where an implementation returns None (op
               schemas cannot return None); the first parameter is a Tensor, and its device picks the
               implementation. Trailing parameters may have defaults (an argument added to an op
               keeps its older calls working): the op and the eager entry both fill them in.
    launchers  plain functions with a keyword-only `eager=False`, called with the op's arguments;
               they return the op's outputs first (a tuple, or the tensor of a one-output op), extra
               trailing values are dropped by the op. They are bound at registration (the eager entry
               calls a copy whose `eager` defaults to True, so a call passes no keywords).
    backward   its parameters are, in order: the gradients of the `differentiable` outputs, the
               `save`d tensors, the `keep`t non-tensor inputs, then one bool per `present` optional
               input (whether it was given). Its outputs are gradients, None (or empty, in the op) for
               an optional input that was not given.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import is_not, itemgetter
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor
from torch.library import triton_op

from kernel_pytorch._env import KERNEL_DTYPES

try:  # where autograd.Function.apply decides whether it binds default arguments (torch >= 2.1)
    from torch.autograd.function import _is_setup_context_defined
except ImportError:  # pragma: no cover - the plain `.apply` is used
    _is_setup_context_defined = None

# map(is_not, optional_inputs, _NONES): whether each was given, without a Python frame per call
_NONES = itertools.repeat(None)


@dataclass(frozen=True)
class Impl:
    """One op's implementations and the names of its outputs.

    Args:
        launch: the Triton launcher, `launch(*args, eager=False)` (module docstring).
        reference: the pure-torch implementation: the CPU kernel and the non-CUDA branch of the op.
            Its annotations are the op's schema.
        fake: the outputs' shapes, dtypes and devices from the inputs' (None where `reference`
            returns None).
        outputs: a name for each output, in order.
    """

    launch: Callable[..., Any]
    reference: Callable[..., Any]
    fake: Callable[..., Any]
    outputs: tuple[str, ...]


class RegisteredOp(NamedTuple):
    """What `register_op` made: the ops (CustomOpDef) and the eager entry."""

    fwd: Any
    bwd: Any
    eager: Callable[..., Any]


class _Schema(NamedTuple):
    signature: inspect.Signature  # the reference's, with schema types (infer_schema reads it)
    inputs: tuple[str, ...]
    optional_inputs: frozenset[str]  # Tensor | None parameters
    n_outputs: int
    single: bool  # the op returns one Tensor, not a tuple
    optional_outputs: tuple[int, ...]  # outputs that may be None (empty in the op)
    defaults: tuple[Any, ...]  # the default values of the trailing parameters that have one


def _is_optional_tensor(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and set(
        typing.get_args(annotation)
    ) == {Tensor, type(None)}


def _schema(reference: Callable[..., Any]) -> _Schema:
    """The op schema implied by the reference's annotations (resolved here: infer_schema would
    evaluate string annotations in the body's module, not the reference's)."""
    hints = typing.get_type_hints(reference)
    params, optional = [], set()
    for p in inspect.signature(reference).parameters.values():
        annotation = hints[p.name]
        if _is_optional_tensor(annotation):
            annotation = Optional[Tensor]  # noqa: UP045 (the form every torch's infer_schema reads)
            optional.add(p.name)
        params.append(p.replace(annotation=annotation))
    if not params or hints[params[0].name] is not Tensor:
        raise TypeError(f"{reference.__qualname__}: the first parameter must be a Tensor (its device picks the kernel)")
    if "return" not in hints:
        raise TypeError(f"{reference.__qualname__}: needs a return annotation (the op's outputs)")
    returns = hints["return"]
    single = typing.get_origin(returns) is not tuple
    items = (returns,) if single else typing.get_args(returns)
    optional_out = tuple(i for i, t in enumerate(items) if _is_optional_tensor(t))
    items = tuple(Tensor if i in optional_out else t for i, t in enumerate(items))
    return _Schema(
        signature=inspect.Signature(params, return_annotation=items[0] if single else tuple[items]),
        inputs=tuple(p.name for p in params),
        optional_inputs=frozenset(optional),
        n_outputs=len(items),
        single=single,
        optional_outputs=optional_out,
        defaults=tuple(p.default for p in params if p.default is not inspect.Parameter.empty),
    )


def _picker(indices: Sequence[int]) -> Callable[[tuple], tuple]:
    """A C-level callable returning the tuple of `t[i] for i in indices` (itemgetter returns a bare
    item for one index, so one index is a slice)."""
    if len(indices) == 1:
        return itemgetter(slice(indices[0], indices[0] + 1))
    if not indices:
        return itemgetter(slice(0, 0))
    return itemgetter(*indices)


def _filled(fn: Callable[..., Any], schema: _Schema) -> Callable[..., Any]:
    """`fn` with None outputs replaced by empty tensors on the first argument's device."""
    if not schema.optional_outputs:
        return fn

    @functools.wraps(fn)
    def filled(*args: Any) -> Any:
        outs = list(fn(*args))
        for i in schema.optional_outputs:
            if outs[i] is None:
                outs[i] = args[0].new_empty(0)
        return tuple(outs)

    return filled


def _op_outputs(launch: Callable[..., Any], schema: _Schema) -> Callable[..., Any]:
    """The launcher as the op calls it: its first n_outputs values (one-output ops: its tensor)."""
    if schema.single:
        return launch
    n = schema.n_outputs
    return lambda *args: launch(*args)[:n]


def _eager_launcher(launch: Callable[..., Any]) -> Callable[..., Any]:
    """`launch` with eager=True as its default, so the eager entry calls it with positional arguments
    alone (`f(*args, eager=True)` would build a keyword dict on every call). The same code object,
    globals and defaults: only the keyword default differs."""
    kwdefaults = getattr(launch, "__kwdefaults__", None)
    if not isinstance(launch, types.FunctionType) or not kwdefaults or "eager" not in kwdefaults:
        raise TypeError(f"{launch!r}: a launcher is a function with a keyword-only `eager` parameter")
    eager = types.FunctionType(launch.__code__, launch.__globals__, launch.__name__, launch.__defaults__,
                               launch.__closure__)
    eager.__kwdefaults__ = {**kwdefaults, "eager": True}
    eager.__qualname__, eager.__module__ = launch.__qualname__, launch.__module__
    eager.__doc__ = launch.__doc__
    return eager


def _checked_schema(qualname: str, impl: Impl) -> _Schema:
    schema = _schema(impl.reference)
    if len(impl.outputs) != schema.n_outputs:
        raise ValueError(f"{qualname}: {len(impl.outputs)} output names for {schema.n_outputs} outputs")
    return schema


def _kernel_dtypes(args: Sequence[Any]) -> bool:
    """Whether every floating-point tensor argument has a dtype the kernels compute in (KERNEL_DTYPES)."""
    return all(a.dtype in KERNEL_DTYPES for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())


def _define(qualname: str, impl: Impl, schema: _Schema, module: str, opaque: bool = False) -> Any:
    """The triton_op `qualname` (a plain custom_op where `opaque`) with its CPU kernel and fake. An opaque
    op's body only ever runs on real tensors (compile and export trace its fake), so its CUDA launches go
    straight to the binaries (eager=True) instead of through wrap_triton: inside a compiled graph the
    fused linear cross-entropy's forward issued its chunks' kernels several times slower that way."""
    cpu = _filled(impl.reference, schema)
    cuda = _filled(_op_outputs(_eager_launcher(impl.launch) if opaque else impl.launch, schema), schema)

    def body(*args: Any) -> Any:
        # compile/export/opcheck trace this body for every device, so the non-CUDA branch lives here; so
        # does fp64's: the kernels compute in fp32, which would hand an fp64 caller fp32 results silently
        if args[0].device.type != "cuda" or not _kernel_dtypes(args):
            return cpu(*args)
        return cuda(*args)

    # triton_op infers the schema from the signature (torch 2.11 and 2.13 take schema= but ignore it)
    body.__signature__ = schema.signature  # type: ignore[attr-defined]
    body.__name__ = body.__qualname__ = qualname.split("::")[1]
    body.__module__ = module
    body.__doc__ = f"Registered {qualname}: Triton on CUDA, the reference elsewhere."
    op = (torch.library.custom_op if opaque else triton_op)(qualname, body, mutates_args=())
    op.register_kernel("cpu")(cpu)
    op.register_fake(_filled(impl.fake, schema))
    return op


def _index(names: Sequence[str], table: Mapping[str, int], what: str, op: str) -> list[int]:
    missing = [n for n in names if n not in table]
    if missing:
        raise ValueError(f"{op}: {what} names {missing}, not among {list(table)}")
    return [table[n] for n in names]


class _Plan(NamedTuple):
    """How the autograd glue moves values, as C-level pickers bound once."""

    saved: Callable[[tuple], tuple]  # (*inputs, *outputs) -> tensors to save
    kept: Callable[[tuple], tuple]  # inputs -> non-tensor values for the backward
    flagged: Callable[[tuple], tuple] | None  # inputs -> optional inputs whose presence it takes
    flag: int | None  # the one such input's index, where there is exactly one
    returned: Callable[[tuple], Any]  # outputs -> the eager entry's result (a tensor, or a tuple)
    grads_of: Callable[[tuple], tuple]  # gradients of every output -> those of the differentiable ones
    route: Callable[[tuple], tuple]  # (None, *backward outputs) -> one gradient (or None) per input
    optional_grads: tuple[int, ...]  # inputs that may be None and have a gradient


def _plan(
    name: str, forward: Impl, backward: Impl, fs: _Schema, bs: _Schema, differentiable: Sequence[str],
    save: Sequence[str], keep: Sequence[str], present: Sequence[str], grads: Mapping[str, str],
) -> _Plan:
    """Check the description against both schemas and bind it."""
    inputs = {n: i for i, n in enumerate(fs.inputs)}
    slots = {**inputs, **{n: len(inputs) + j for j, n in enumerate(forward.outputs)}}
    bad = [n for n in present if n not in fs.optional_inputs]
    if bad:
        raise ValueError(f"{name}: present names {bad}, which are not optional tensor inputs")
    diff = _index(differentiable, {n: j for j, n in enumerate(forward.outputs)}, "differentiable", name)
    if not diff:
        raise ValueError(f"{name}: a backward needs at least one differentiable output")
    expected = len(diff) + len(save) + len(keep) + len(present)
    if len(bs.inputs) != expected:
        raise ValueError(
            f"{name}_bwd takes {len(bs.inputs)} arguments; the description gives {expected} "
            "(gradients, saved tensors, kept values, presence flags)"
        )
    _index(list(grads), inputs, "grads", name)
    sources = _index(list(grads.values()), {n: j for j, n in enumerate(backward.outputs)}, "grads", name)
    source = dict(zip(grads, sources))
    return _Plan(
        saved=_picker(_index(save, slots, "save", name)),
        kept=_picker(_index(keep, inputs, "keep", name)),
        flagged=_picker(_index(present, inputs, "present", name)) if present else None,
        flag=inputs[present[0]] if len(present) == 1 else None,
        returned=itemgetter(*diff),  # one index: the tensor itself
        grads_of=_picker(diff),
        # index 0 of (None, *backward outputs) is None: the gradient of an input without one
        route=_picker([1 + source[n] if n in source else 0 for n in fs.inputs]),
        optional_grads=tuple(inputs[n] for n in fs.inputs if n in source and n in fs.optional_inputs),
    )


def _register_autograd(fwd: Any, bwd: Any, plan: _Plan, fs: _Schema, bs: _Schema) -> None:
    """The registered forward's autograd: its backward is the registered backward op (so compile and
    export see it); gradients the op returns empty for inputs that were None become None."""
    saved, kept, flagged, grads_of, route = plan.saved, plan.kept, plan.flagged, plan.grads_of, plan.route
    optional_grads, fwd_single, bwd_single = plan.optional_grads, fs.single, bs.single
    bwd_overload = bwd._opoverload  # torch.ops.<namespace>.<name>_bwd.default

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*saved(inputs + ((output,) if fwd_single else tuple(output))))
        ctx.state = kept(inputs) if flagged is None else kept(inputs) + tuple(map(is_not, flagged(inputs), _NONES))
        ctx.absent = tuple(i for i in optional_grads if inputs[i] is None)

    def backward(ctx: Any, *out_grads: Any) -> tuple:
        outs = bwd_overload(*grads_of(out_grads), *ctx.saved_tensors, *ctx.state)
        result = route((None, outs) if bwd_single else (None, *outs))
        if ctx.absent:
            result = tuple(None if i in ctx.absent else g for i, g in enumerate(result))
        return result

    fwd.register_autograd(backward, setup_context=setup_context)


def _eager_function(
    name: str, module: str, launch_fwd: Callable[..., Any], launch_bwd: Callable[..., Any], plan: _Plan,
    fs: _Schema, bs: _Schema,
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
            ctx.state = kept(args) + tuple(map(is_not, flagged(args), _NONES))
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


def _eager_entry(
    name: str, cls: type[torch.autograd.Function], launch_fwd: Callable[..., Any], plan: _Plan, fs: _Schema
) -> Callable[..., Any]:
    """The eager entry: `cls.apply` without autograd.Function.apply's Python layer, and without the
    Function at all where grad mode is off.

    autograd.Function.apply's Python layer binds default arguments (only with a setup_context, which
    these Functions do not define) and unwraps tensors left over from a finished functorch transform,
    at 2-3 us per call on our hosts; the functional layer calls the entry with tensors it has just
    checked, not such leftovers, so the entry calls the C apply. With grad mode off (no_grad,
    inference_mode: a decode step) nothing is recorded, so the forward launcher runs alone, as
    Function.apply would run it, without the Function's context and output wrapping. Under functorch
    transforms every call takes `cls.apply`, as before.
    """
    full, transforms_active, grad_enabled = cls.apply, torch._C._are_functorch_transforms_active, torch.is_grad_enabled
    if _is_setup_context_defined is None or _is_setup_context_defined(cls.setup_context):
        return full
    c_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)
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


def register_op(
    name: str,
    forward: Impl,
    backward: Impl | None = None,
    *,
    differentiable: Sequence[str] = (),
    save: Sequence[str] = (),
    keep: Sequence[str] = (),
    present: Sequence[str] = (),
    grads: Mapping[str, str] | None = None,
    namespace: str = "kernel_pytorch",
    opaque_forward: bool = False,
) -> RegisteredOp:
    """Register `<namespace>::<name>_fwd` (and `_bwd` with a backward) and build the eager entry.

    Args:
        name: the op's name; forward: its forward implementations; backward: its backward's, or None
            for a forward-only op.
        differentiable: the forward outputs that carry gradients; the eager entry returns these (one
            tensor, or a tuple), and the backward takes their gradients first.
        save: forward inputs and outputs, by name, saved for the backward (its next parameters).
        keep: non-tensor forward inputs the backward takes next.
        present: optional tensor inputs whose presence (a bool) the backward takes last.
        grads: forward input -> the backward output that is its gradient; other inputs get None.
        namespace: the torch.library namespace.
        opaque_forward: register the forward as a plain custom_op, which compile and export keep as one
            node, instead of a triton_op whose body they trace. For a forward whose traced body the
            AOT partitioner would split between the forward and the backward graphs (a chunk loop
            whose last steps it moves into the backward, saving their inputs instead of the result).
    Returns:
        RegisteredOp(fwd, bwd, eager): for a forward-only op, bwd is None and eager the launcher with
        eager=True.
    """
    module = forward.launch.__module__
    fwd_name, bwd_name = f"{namespace}::{name}_fwd", f"{namespace}::{name}_bwd"
    # everything is checked before anything is registered
    fs, launch_fwd = _checked_schema(fwd_name, forward), _eager_launcher(forward.launch)
    if backward is None:
        return RegisteredOp(_define(fwd_name, forward, fs, module), None, launch_fwd)
    bs, launch_bwd = _checked_schema(bwd_name, backward), _eager_launcher(backward.launch)
    plan = _plan(name, forward, backward, fs, bs, differentiable, save, keep, present, dict(grads or {}))
    fwd, bwd = _define(fwd_name, forward, fs, module, opaque_forward), _define(bwd_name, backward, bs, module)
    _register_autograd(fwd, bwd, plan, fs, bs)
    function = _eager_function(name, module, launch_fwd, launch_bwd, plan, fs, bs)
    return RegisteredOp(fwd, bwd, _eager_entry(name, function, launch_fwd, plan, fs))
