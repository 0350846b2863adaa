"""One forward + backward (and an optimizer step when one is given) with memory accounting.

What is recorded: the bytes of the parameters, of the gradients backward makes, of the optimizer's
state after one step; every tensor autograd saves for backward (`torch.autograd.graph.saved_tensors_hooks`),
counted once per storage, attributed to the innermost module running when it was saved (module
forward hooks keep that stack) and to the line that allocated it (a `TorchFunctionMode` notes the user
stack of each fresh tensor); and on CUDA the allocator's peak (`torch.cuda.max_memory_allocated`). On
CPU there is no allocator peak to read, so the peak is the sum of what is held at the start of the
backward, and says it is estimated. The module's parameters and gradients are restored afterwards.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from kernel_pytorch._tree import tensors
from kernel_pytorch.assistant.findings import Location
from kernel_pytorch.assistant.inputs import clone_inputs
from kernel_pytorch.assistant.locate import model_location

# the saved tensors whose origin line is looked up (the largest ones, which findings name)
LOCATED = 5

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class SavedTensor:
    """One tensor autograd kept for backward: shape, dtype, bytes of its storage, the module saving it,
    and the line that allocated it (looked up for the `LOCATED` largest only, else None)."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    module: str
    location: Location | None


@dataclass(frozen=True)
class MemoryRun:
    """What one training step held.

    Attributes:
        params, grads, optimizer_state: bytes (optimizer_state None when no optimizer was given).
        saved: the distinct tensors saved for backward (parameters excluded), largest first.
        output_bytes: bytes of the forward's tensor outputs (the logits of a language model).
        cache: a transformers KV cache among the output's fields, as (field, tensors, bytes); None if none.
        peak: the allocator's peak over the step on CUDA (bytes above what was allocated before it);
            None on CPU.
        forward_s, backward_s: wall time of the forward and of the backward.
        error: why the step could not run (no parameter needs a gradient, the forward raised), or None.
    """

    params: int = 0
    grads: int = 0
    optimizer_state: int | None = None
    saved: tuple[SavedTensor, ...] = ()
    output_bytes: int = 0
    peak: int | None = None
    forward_s: float = 0.0
    backward_s: float = 0.0
    error: str | None = None
    by_module: dict[str, int] = field(default_factory=dict)
    cache: tuple[str, int, int] | None = None  # a KV cache in the output: (its field, tensors, bytes)

    @property
    def activations(self) -> int:
        """Bytes saved for backward, each storage once."""
        return sum(s.nbytes for s in self.saved)


class _Origins(TorchFunctionMode):
    """Notes the user stack of every tensor an op allocates, by storage address."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: dict[int, list[traceback.FrameSummary]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        fresh = {}
        for t in tensors(out):
            try:
                ptr = t.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
                continue
            # a view of a known storage keeps its origin; a view of a new one (a 3-D Linear's output
            # is a view of its 2-D matmul's) was made by this op
            if ptr and (t._base is None or ptr not in self.stacks):
                fresh[ptr] = t
        if fresh:
            # lines are looked up later, for the few tensors a finding names
            frames = traceback.StackSummary.extract(traceback.walk_stack(sys._getframe(1)), lookup_lines=False)
            stack = list(reversed(frames))
            for ptr in fresh:
                self.stacks[ptr] = stack
        return out


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of `t`'s storage: a view saved for backward keeps its whole base alive."""
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _cache_tensors(obj: Any, depth: int = 3) -> dict[int, torch.Tensor]:
    """The tensors a cache object holds (its attributes, lists of them, and objects of its own library
    inside it, a few levels down), by storage."""
    found: dict[int, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        if obj.numel():
            found[_storage(obj)[0]] = obj
        return found
    if depth == 0:
        return found
    if isinstance(obj, (list, tuple)):
        items = list(obj)
    elif type(obj).__module__.split(".")[0] == "transformers" and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return found
    for item in items:
        found.update(_cache_tensors(item, depth - 1))
    return found


def output_cache(out: Any) -> tuple[str, int, int] | None:
    """(field, tensors, bytes) of a transformers KV cache (an instance of a class named `Cache` or a
    subclass of one) among a model output's fields, or None."""
    fields = out.items() if hasattr(out, "items") and not isinstance(out, torch.Tensor) else ()
    for name, value in fields:
        if any(c.__name__ == "Cache" for c in type(value).__mro__):
            held = _cache_tensors(value)
            if held:
                return name, len(held), sum(t.numel() * t.element_size() for t in held.values())
    return None


def _loss_of(out: Any) -> torch.Tensor | None:
    """The scalar to backward from: the output's `loss` when it has one, else the sum of its outputs."""
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss.float().sum()
    outs = [t.float().sum() for t in tensors(out) if t.requires_grad and t.is_floating_point()]
    return torch.stack(outs).sum() if outs else None


def measure_step(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], optimizer: OptimizerFactory | None = None
) -> MemoryRun:
    """One forward + backward of `module(*args, **kwargs)` (then `optimizer(params).step()` if given),
    measured as `MemoryRun` says; the parameters, their gradients and the buffers are restored."""
    params = [p for p in dict.fromkeys(module.parameters())]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return MemoryRun(params=param_bytes, error="no parameter requires a gradient, so there is no backward")
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    old_grads = [p.grad for p in trainable]
    backup = [p.detach().clone() for p in trainable] if optimizer is not None else []
    buffers = [(b, b.detach().clone()) for b in module.buffers()]  # BatchNorm's running stats move
    stack: list[str] = []
    names = {m: n for n, m in module.named_modules()}
    saved: dict[int, tuple[torch.Tensor, int, str]] = {}  # storage address -> (tensor, bytes, module)

    def pre(m: nn.Module, *_: Any) -> None:
        stack.append(names.get(m, ""))

    def post(m: nn.Module, *_: Any) -> None:
        if stack:
            stack.pop()

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            ptr, nbytes = _storage(t)
        except (RuntimeError, NotImplementedError):
            return t
        if ptr and ptr not in param_ptrs and ptr not in saved:
            saved[ptr] = (t, nbytes, stack[-1] if stack else "")
        return t

    hooks = [h for m in names for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    dev = module_device(module)
    cuda = dev.type == "cuda"
    run_args, run_kwargs = clone_inputs(args), clone_inputs(kwargs)
    origins = _Origins()
    error, out_bytes, peak, optimizer_state, cache = None, 0, None, None, None
    fwd = bwd = 0.0
    try:
        for p in trainable:
            p.grad = None
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        start = time.perf_counter()
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), origins:
            out = module(*run_args, **run_kwargs)
            loss = _loss_of(out)
        if cuda:
            torch.cuda.synchronize(dev)
        fwd = time.perf_counter() - start
        out_bytes = sum(t.numel() * t.element_size() for t in tensors(out))
        cache = output_cache(out)
        if loss is None:
            error = "the forward returned no floating tensor that needs a gradient"
        else:
            start = time.perf_counter()
            loss.backward()
            if cuda:
                torch.cuda.synchronize(dev)
            bwd = time.perf_counter() - start
            if optimizer is not None:
                opt = optimizer(trainable)
                opt.step()
                optimizer_state = sum(
                    v.numel() * v.element_size()
                    for st in opt.state.values()
                    for v in st.values()
                    if isinstance(v, torch.Tensor)
                )
            if cuda:
                torch.cuda.synchronize(dev)
                peak = torch.cuda.max_memory_allocated(dev) - base
        grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None)
    except Exception as exc:  # the model's own failure: reported, never raised
        error, grad_bytes = f"{type(exc).__name__}: {exc}", 0
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for p, g in zip(trainable, old_grads, strict=True):
                p.grad = g
            for p, b in zip(trainable, backup, strict=False):
                p.copy_(b)
            for buf, b in buffers:
                buf.copy_(b)
    records = []
    for i, (ptr, (t, nbytes, owner)) in enumerate(sorted(saved.items(), key=lambda kv: -kv[1][1])):
        st = origins.stacks.get(ptr) if i < LOCATED else None  # locating costs: only the largest
        loc = model_location(st, module) if st else None
        records.append(SavedTensor(tuple(t.shape), str(t.dtype).removeprefix("torch."), nbytes, owner, loc))
    by_module: dict[str, int] = {}
    for s in records:
        by_module[s.module] = by_module.get(s.module, 0) + s.nbytes
    return MemoryRun(
        params=param_bytes,
        grads=grad_bytes,
        optimizer_state=optimizer_state,
        saved=tuple(records),
        output_bytes=out_bytes,
        peak=peak,
        forward_s=fwd,
        backward_s=bwd,
        error=error,
        by_module=by_module,
        cache=cache,
    )


def module_device(module: nn.Module) -> torch.device:
    """Where the module's first parameter lives (CPU without any)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


__all__ = ["MemoryRun", "OptimizerFactory", "SavedTensor", "measure_step"]
