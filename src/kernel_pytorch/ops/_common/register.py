"""One registration for every op: its torch ops, their CPU kernels, fakes and autograd, and its eager
entry, built from a short description.

For an op `name` with a backward, `register_op` defines

    <namespace>::<name>_fwd, <namespace>::<name>_bwd   torch.library.triton_op; the body runs the
        launcher on CUDA and the reference elsewhere (compile, export and opcheck trace the body for
        every device, so the non-CUDA branch lives in the body as well as in register_kernel("cpu"))
    register_fake for both, register_autograd for the forward (the backward op has none)
    the eager entry the functional layer calls on CUDA: the registered forward, returning its
        differentiable outputs; or, with the fast path on (fast_path.py, one switch), the launchers
        without the op dispatcher

A forward-only op (no backward) gets `<name>_fwd` alone; its eager entry is that op (the fast path: the
launcher with eager=True).

Conventions the description relies on:
    schema     the reference's parameters and return annotation; an output annotated `Tensor | None`
               is a Tensor in the schema, an empty one where an implementation returns None (op
               schemas cannot return None); the first parameter is a Tensor, and its device picks the
               implementation. Trailing parameters may have defaults (an argument added to an op
               keeps its older calls working): the op and the eager entry both fill them in.
    launchers  plain functions with a keyword-only `eager=False`, called with the op's arguments;
               they return the op's outputs first (a tuple, or the tensor of a one-output op), extra
               trailing values are dropped by the op. The op's body calls them with eager=False (its
               launches go through wrap_triton, which compile and export trace), the fast path and an
               opaque op's body with eager=True.
    fake       a function of the op's arguments giving its outputs' shapes, dtypes and devices, or
               "reference": the reference run on meta tensors, its outputs' shapes, strides and dtypes
               on the first input's device (for a reference that writes the launcher's layout)
    backward   its parameters are, in order: the gradients of the `differentiable` outputs, the
               `save`d tensors, the `keep`t non-tensor inputs, then one bool per `present` optional
               input (whether it was given). Its outputs are gradients, None (or empty, in the op) for
               an optional input that was not given.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import is_not
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor
from torch.library import triton_op

from kernel_pytorch._env import KERNEL_DTYPES
from kernel_pytorch.ops._common import fast_path
from kernel_pytorch.ops._common.op_plan import NONES, Plan, Schema, plan_of, schema_of


@dataclass(frozen=True)
class Impl:
    """One op's implementations and the names of its outputs.

    Args:
        launch: the Triton launcher, `launch(*args, eager=False)` (module docstring).
        reference: the pure-torch implementation: the CPU kernel and the non-CUDA branch of the op.
            Its annotations are the op's schema.
        fake: the outputs' shapes, dtypes and devices from the inputs' (None where `reference`
            returns None), or "reference" where the reference run on meta tensors gives them (its
            outputs' shapes, strides and dtypes: a reference that writes the launcher's layout).
        outputs: a name for each output, in order.
    """

    launch: Callable[..., Any]
    reference: Callable[..., Any]
    fake: Callable[..., Any] | Literal["reference"]
    outputs: tuple[str, ...]


class RegisteredOp(NamedTuple):
    """What `register_op` made: the ops (CustomOpDef) and the eager entry."""

    fwd: Any
    bwd: Any
    eager: Callable[..., Any]


def _filled(fn: Callable[..., Any], schema: Schema) -> Callable[..., Any]:
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


def _from_reference(reference: Callable[..., Any], schema: Schema) -> Callable[..., Any]:
    """A fake from the reference: run on meta tensors, its outputs' shapes, strides and dtypes on the
    first input's device (None outputs stay None, for `_filled`). The reference is the CPU kernel, so
    this fake matches it by construction; it matches the launchers where the reference writes their
    layout (the references of the ops that use it return contiguous outputs, as the launchers do)."""

    def fake(*args: Any) -> Any:
        device = args[0].device
        outs = reference(*(a.to("meta") if isinstance(a, Tensor) else a for a in args))
        made = tuple(None if o is None else torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=device)
                     for o in ((outs,) if schema.single else outs))
        return made[0] if schema.single else made

    fake.__name__ = fake.__qualname__ = f"{getattr(reference, '__name__', 'reference')}_on_meta"
    return fake


def _overload(qualname: str) -> Callable[..., Any]:
    """torch.ops.<namespace>.<name>.default of a registered op."""
    namespace, name = qualname.split("::")
    return getattr(getattr(torch.ops, namespace), name).default


def _op_outputs(launch: Callable[..., Any], schema: Schema) -> Callable[..., Any]:
    """The launcher as the op calls it: its first n_outputs values (one-output ops: its tensor)."""
    if schema.single:
        return launch
    n = schema.n_outputs
    return lambda *args: launch(*args)[:n]


def _checked_schema(qualname: str, impl: Impl) -> Schema:
    kwdefaults = getattr(impl.launch, "__kwdefaults__", None)
    if not isinstance(impl.launch, types.FunctionType) or not kwdefaults or "eager" not in kwdefaults:
        raise TypeError(f"{impl.launch!r}: a launcher is a function with a keyword-only `eager` parameter")
    schema = schema_of(impl.reference)
    if len(impl.outputs) != schema.n_outputs:
        raise ValueError(f"{qualname}: {len(impl.outputs)} output names for {schema.n_outputs} outputs")
    if isinstance(impl.fake, str) and impl.fake != "reference":
        raise ValueError(f"{qualname}: fake is a function or \"reference\", not {impl.fake!r}")
    return schema


def _kernel_dtypes(args: Sequence[Any]) -> bool:
    """Whether every floating-point tensor argument has a dtype the kernels compute in (KERNEL_DTYPES).
    One-byte floats (fp8) are quantized weights the kernels read and dequantize, not a dtype they
    compute in, and are left out."""
    return all(a.dtype in KERNEL_DTYPES for a in args
               if isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() > 1)


def _define(qualname: str, impl: Impl, schema: Schema, module: str, opaque: bool = False) -> Any:
    """The triton_op `qualname` (a plain custom_op where `opaque`) with its CPU kernel and fake. An opaque
    op's body only ever runs on real tensors (compile and export trace its fake), so its CUDA launches go
    straight to the binaries (eager=True) instead of through wrap_triton: inside a compiled graph the
    fused linear cross-entropy's forward issued its chunks' kernels several times slower that way."""
    cpu = _filled(impl.reference, schema)
    launch = functools.partial(impl.launch, eager=True) if opaque else impl.launch
    cuda = _filled(_op_outputs(launch, schema), schema)

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
    fake = _from_reference(impl.reference, schema) if impl.fake == "reference" else impl.fake
    op.register_fake(_filled(fake, schema))
    return op


def _register_autograd(fwd: Any, bwd_name: str, plan: Plan, fs: Schema, bs: Schema) -> None:
    """The registered forward's autograd: its backward is the registered backward op (so compile and
    export see it); gradients the op returns empty for inputs that were None become None."""
    saved, kept, flagged, grads_of, route = plan.saved, plan.kept, plan.flagged, plan.grads_of, plan.route
    optional_grads, fwd_single, bwd_single = plan.optional_grads, fs.single, bs.single
    bwd_overload = _overload(bwd_name)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*saved(inputs + ((output,) if fwd_single else tuple(output))))
        ctx.state = kept(inputs) if flagged is None else kept(inputs) + tuple(map(is_not, flagged(inputs), NONES))
        ctx.absent = tuple(i for i in optional_grads if inputs[i] is None)

    def backward(ctx: Any, *out_grads: Any) -> tuple:
        outs = bwd_overload(*grads_of(out_grads), *ctx.saved_tensors, *ctx.state)
        result = route((None, outs) if bwd_single else (None, *outs))
        if ctx.absent:
            result = tuple(None if i in ctx.absent else g for i, g in enumerate(result))
        return result

    fwd.register_autograd(backward, setup_context=setup_context)


def _plain_entry(name: str, qualname: str, plan: Plan, fs: Schema) -> Callable[..., Any]:
    """The eager entry without the fast path: the registered forward (dispatcher, registered autograd),
    returning its differentiable outputs as the fast entry does."""
    op, returned = _overload(qualname), plan.returned

    if fs.single:
        def entry(*args: Any) -> Any:
            return op(*args)
    else:
        def entry(*args: Any) -> Any:
            return returned(op(*args))

    entry.__doc__ = f"torch.ops.{qualname.replace('::', '.')}, its differentiable outputs."
    entry.__name__ = entry.__qualname__ = f"{name}_eager"
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
        RegisteredOp(fwd, bwd, eager): for a forward-only op, bwd is None and eager the forward op (the
        launcher with eager=True on the fast path).
    """
    module = forward.launch.__module__
    fwd_name, bwd_name = f"{namespace}::{name}_fwd", f"{namespace}::{name}_bwd"
    # everything is checked before anything is registered
    fs = _checked_schema(fwd_name, forward)
    if backward is None:
        fwd = _define(fwd_name, forward, fs, module)
        return RegisteredOp(fwd, None, fast_path.forward_only_entry(forward.launch) or _overload(fwd_name))
    bs = _checked_schema(bwd_name, backward)
    plan = plan_of(name, forward.outputs, backward.outputs, fs, bs, differentiable, save, keep, present,
                   dict(grads or {}))
    fwd, bwd = _define(fwd_name, forward, fs, module, opaque_forward), _define(bwd_name, backward, bs, module)
    _register_autograd(fwd, bwd_name, plan, fs, bs)
    entry = fast_path.eager_entry(name, module, forward.launch, backward.launch, plan, fs, bs)
    return RegisteredOp(fwd, bwd, entry or _plain_entry(name, fwd_name, plan, fs))
