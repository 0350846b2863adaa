"""Adam and AdamW, drop-ins for torch.optim.Adam / AdamW whose step is one kernel launch per dtype group.

`AdamW(params, lr=..., betas=..., eps=..., weight_decay=..., amsgrad=..., maximize=..., backend="auto")`
(and `Adam`, the same with Adam's weight decay) takes torch's arguments and keeps its state layout
(`step`, `exp_avg`, `exp_avg_sq`, with amsgrad `max_exp_avg_sq`, per parameter; the step a CPU fp32
scalar), so a checkpoint of either loads into the other. The update is torch's fused one
(reference/adam.py); the kernel is `kernel_pytorch::adam_` (ops/adam.py).

Backends: "auto" runs the kernel when every parameter with a gradient can take it and torch's own step
otherwise, saying once why; "triton" raises instead; "torch" always runs torch's step. torch's step also
runs what the kernel does not do: capturable, differentiable, fused=True (a request for torch's fused
implementation), complex or sparse tensors, tensor subclasses, and non-contiguous or misaligned tensors.

DTensor parameters (FSDP2's `fully_shard`: Shard(0) on a 1-D mesh) are stepped on their local shards, in
the same launches as plain ones, when the gradient and moments are DTensors of the parameter's mesh and
placements and no placement is Partial; the moments are created as DTensors of that layout, as torch's
are, so `state_dict()` and DCP's optimizer state move between this optimizer and torch's. Other layouts
fall back (auto) or raise (triton), naming the tensor and torch's fused or foreach step as the way to run it.
FSDP2's gradient shards are views into one reduce-scatter buffer: one misaligned by an earlier parameter's
padded shard (not a multiple of 16 bytes) falls back like any misaligned tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from kernel_pytorch._env import KERNEL_DTYPES, is_plain_tensor, log_once, triton_status

Backend = Literal["auto", "triton", "torch"]
_BACKENDS = ("auto", "triton", "torch")
# group options that only torch's step implements (the value that asks for it)
_TORCH_ONLY = {"capturable": True, "differentiable": True, "fused": True}


def kernel_ready(device: torch.device) -> tuple[bool, str]:
    """Whether the kernel runs on `device`, and why not (triton_status; a seam for the CPU tests)."""
    return triton_status(device)


def _why_not(p: Tensor, others: dict[str, Tensor], ready: dict[torch.device, tuple[bool, str]],
             where: tuple[int, int] | None = None, torch_step: str = "torch's step") -> str | None:
    """Why the kernel cannot update `p` with its gradient and moments `others` (by state name; None: it
    can). A DTensor `p` is judged by its local shard (`_dtensor_why` first). `ready` caches kernel_ready by
    device within one step; `where` ((group, index) in param_groups) names `p` and `torch_step` the
    alternative in the messages, both formatted only for a subclass `p`, off the plain step's path."""
    if not is_plain_tensor(p):
        if (why := _dtensor_why(p, others, where, torch_step)) is not None:
            return why
        p, others = p.to_local(), {k: t.to_local() for k, t in others.items()}
    for t in (p, *others.values()):
        if not is_plain_tensor(t):
            return f"a parameter, gradient or moment is a tensor subclass ({type(t).__name__})"
        if t.dtype not in KERNEL_DTYPES or t.layout != torch.strided:
            return f"a parameter, gradient or moment is {t.dtype} ({t.layout}); the kernel takes dense {KERNEL_DTYPES}"
        if t is not p and (t.device != p.device or t.shape != p.shape):
            return "a gradient or moment is not on its parameter's device or not of its shape"
        if t.numel() and (not t.is_contiguous() or t.data_ptr() % 16):  # an empty shard is never read
            return "a parameter, gradient or moment is not contiguous and 16-byte aligned"
    status = ready.get(p.device)
    if status is None:
        status = ready[p.device] = kernel_ready(p.device)
    return None if status[0] else status[1]


def _dtensor_why(p: Tensor, others: dict[str, Tensor], at: tuple[int, int] | None, torch_step: str) -> str | None:
    """Why the subclass `p` cannot be stepped on its local shard (None: a DTensor whose gradient and
    moments `others` share its mesh and placements, none Partial: the update is elementwise, so each
    rank's shard update is the global one's restriction)."""
    dtensor = _dtensor_class()
    where = "a parameter" if at is None else f"param_groups[{at[0]}]['params'][{at[1]}]"
    alternative = f"{torch_step} (fused=True or foreach=True) runs it"
    if dtensor is None or not isinstance(p, dtensor):
        return f"{where} is a tensor subclass ({type(p).__name__}); {alternative}"
    if any(pl.is_partial() for pl in p.placements):
        return f"{where} is a DTensor with a Partial placement {p.placements}; {alternative}"
    for name, t in others.items():
        if not isinstance(t, dtensor):
            return (f"{where} is a DTensor but its {name} is a {type(t).__name__}; the kernel steps a DTensor "
                    f"with a gradient and moments of its own layout; {alternative}")
        if t.device_mesh != p.device_mesh or t.placements != p.placements or t.shape != p.shape:
            return (f"{where} is a DTensor with placements {p.placements} but its {name} has {t.placements} "
                    f"(mesh {t.device_mesh}, shape {tuple(t.shape)}); the kernel steps matching local shards "
                    f"only; {alternative}")
    return None


def _dtensor_class() -> type | None:
    """torch's DTensor class where torch.distributed is built (None: no DTensor exists); imported on the
    first subclass seen, so plain steps never import torch.distributed.tensor."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def _unhooked(cls: type[torch.optim.Optimizer]) -> Callable[..., Any]:
    """cls.step without torch's step hooks (our own step already ran them)."""
    fn = cls.step
    while getattr(fn, "hooked", False):
        fn = fn.__wrapped__
    return fn


class _OneLaunch:
    """The step Adam and AdamW share: checks, states, buckets, one launch a bucket (module docstring)."""

    backend: Backend
    param_groups: list[dict[str, Any]]
    state: Any

    def _torch_class(self) -> type[torch.optim.Optimizer]:
        return next(c for c in type(self).__mro__ if c.__module__.startswith("torch.optim"))

    def _why_not(self) -> str | None:
        """Why this step cannot run on the kernel (None: it can); changes nothing."""
        if self.backend == "torch":
            return "backend='torch'"
        ready: dict[torch.device, tuple[bool, str]] = {}
        torch_step = f"torch.optim.{self._torch_class().__name__}"
        for g, group in enumerate(self.param_groups):
            for name, value in _TORCH_ONLY.items():
                if group.get(name) == value:
                    return f"{name}={value} is torch's alone"
            if isinstance(group["lr"], Tensor) and group["lr"].device.type != "cpu":
                return "lr is a device tensor"
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.state.get(p) or {}
                others = {"gradient": p.grad, **{k: state[k] for k in _MOMENTS if k in state}}
                if (why := _why_not(p, others, ready, (g, i), torch_step)) is not None:
                    return why
        return None

    @torch.compiler.disable  # addresses and host scalars: the step runs eagerly inside a compiled loop
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter with a gradient; returns the closure's loss (if given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        why = self._why_not()
        if why is not None:
            name = type(self).__name__
            if self.backend == "triton":
                raise ValueError(f"backend='triton' cannot run this {name} step: {why}")
            if self.backend == "auto":
                log_once(f"kernel_pytorch.optim.{name}: {why}; using torch's {name} step")
            _unhooked(self._torch_class())(self)
            return loss
        from kernel_pytorch.ops import adam  # imports Triton on the first kernel step

        for (index, *_), (step, lists) in self._buckets().items():
            group = self.param_groups[index]
            beta1, beta2 = (float(b) for b in group["betas"])
            decoupled = group.get("decoupled_weight_decay", isinstance(self, torch.optim.AdamW))
            # the launcher itself, as the functional layer's eager entries are: every tensor was checked
            # above, and the op's dispatch of the lists costs host time a step need not pay
            adam.adam_step(*lists[:4], lists[4] if group["amsgrad"] else None, float(group["lr"]), beta1, beta2,
                           float(group["eps"]), float(group["weight_decay"]), step, bool(decoupled),
                           bool(group["maximize"]), check=False)
        return loss

    def _buckets(self) -> dict[tuple, tuple[float, tuple[list[Tensor], ...]]]:
        """The parameters with gradients, by (group, device, dtypes, step after this update), each
        bucket's step and its (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs); states are created
        and steps counted here, as torch's step does."""
        owners, steps = [], []
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:  # torch's own layout, so checkpoints move between the two
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                for key in _MOMENTS[:3 if group["amsgrad"] else 2]:
                    if key not in state:
                        state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if state["step"].device.type != "cpu":  # from a fused or capturable optimizer's checkpoint: once
                    state["step"] = state["step"].detach().to("cpu", torch.float32)
                owners.append((index, p, state))
                steps.append(state["step"])
        if not steps:
            return {}
        torch._foreach_add_(steps, 1.0)
        values = torch.stack(steps).tolist()
        buckets: dict[tuple, tuple[float, tuple[list[Tensor], ...]]] = {}
        for (index, p, state), step in zip(owners, values, strict=True):
            tensors = (p, p.grad, *(state.get(k, p) for k in _MOMENTS))  # p: a placeholder without amsgrad
            if not is_plain_tensor(p):  # a DTensor of its gradient's and moments' layout (_dtensor_why)
                tensors = tuple(t.to_local() for t in tensors)  # views: the kernel updates the shards
            if not tensors[0].numel():  # an empty shard: its step is counted, nothing to update
                continue
            key = (index, p.device, *(t.dtype for t in tensors), step)
            lists = buckets.setdefault(key, (step, ([], [], [], [], [])))[1]
            for out, t in zip(lists, tensors, strict=True):
                out.append(t)
        return buckets


# the moments in a parameter's state, torch's names; the third with amsgrad only
_MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class AdamW(_OneLaunch, torch.optim.AdamW):
    """torch.optim.AdamW with its update in one Triton launch per (group, dtypes, step) bucket.

    Args:
        params, lr, betas, eps, weight_decay, amsgrad, **kwargs: torch.optim.AdamW's (maximize, foreach ...).
        backend: "auto", "triton" or "torch" (the module docstring).
    """

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, backend: Backend = "auto", **kwargs: Any) -> None:
        _check_backend(backend)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)
        self.backend = backend


class Adam(_OneLaunch, torch.optim.Adam):
    """torch.optim.Adam with its update in one Triton launch per (group, dtypes, step) bucket (weight
    decay through the gradient; with decoupled_weight_decay=True, AdamW's).

    Args:
        params, lr, betas, eps, weight_decay, amsgrad, **kwargs: torch.optim.Adam's (maximize, foreach ...).
        backend: "auto", "triton" or "torch" (the module docstring).
    """

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, *, backend: Backend = "auto", **kwargs: Any) -> None:
        _check_backend(backend)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)
        self.backend = backend


def _check_backend(backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
