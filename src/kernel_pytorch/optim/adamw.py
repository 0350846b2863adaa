"""AdamW, a drop-in for torch.optim.AdamW whose step is one kernel launch per dtype group.

`AdamW(params, lr=..., betas=..., eps=..., weight_decay=..., backend="auto")` takes torch.optim.AdamW's
arguments and keeps its state layout (`step`, `exp_avg`, `exp_avg_sq` per parameter, the step a CPU
fp32 scalar), so a checkpoint of either loads into the other. The update is torch's fused AdamW's
(reference/adamw.py); the kernel is `kernel_pytorch::adamw_` (ops/adamw.py).

Backends: "auto" runs the kernel when every parameter with a gradient can take it and torch's own AdamW
step otherwise, saying once why; "triton" raises instead; "torch" always runs torch's step. torch's step
also runs what the kernel does not do: amsgrad, maximize, capturable, differentiable, fused=True (a
request for torch's fused implementation), complex or sparse tensors, tensor subclasses, and
non-contiguous or misaligned tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from kernel_pytorch._env import KERNEL_DTYPES, log_once, triton_status

Backend = Literal["auto", "triton", "torch"]
_BACKENDS = ("auto", "triton", "torch")
# group options that only torch's step implements (the value that asks for it)
_TORCH_ONLY = {"amsgrad": True, "maximize": True, "capturable": True, "differentiable": True, "fused": True}


def kernel_ready(device: torch.device) -> tuple[bool, str]:
    """Whether the kernel runs on `device`, and why not (triton_status; a seam for the CPU tests)."""
    return triton_status(device)


def _why_not(p: Tensor, others: tuple[Tensor, ...], ready: dict[torch.device, tuple[bool, str]]) -> str | None:
    """Why the kernel cannot update `p` with its gradient and moments `others` (None: it can).
    `ready` caches kernel_ready by device within one step."""
    for t in (p, *others):
        if type(t) not in (Tensor, torch.nn.Parameter):
            return f"a parameter, gradient or moment is a tensor subclass ({type(t).__name__})"
        if t.dtype not in KERNEL_DTYPES or t.layout != torch.strided:
            return f"a parameter, gradient or moment is {t.dtype} ({t.layout}); the kernel takes dense {KERNEL_DTYPES}"
        if t is not p and (t.device != p.device or t.shape != p.shape):
            return "a gradient or moment is not on its parameter's device or not of its shape"
        if not t.is_contiguous() or t.data_ptr() % 16:
            return "a parameter, gradient or moment is not contiguous and 16-byte aligned"
    status = ready.get(p.device)
    if status is None:
        status = ready[p.device] = kernel_ready(p.device)
    return None if status[0] else status[1]


def _unhooked_torch_step() -> Callable[..., Any]:
    """torch.optim.AdamW.step without the step hooks (our own step already ran them)."""
    fn = torch.optim.AdamW.step
    return fn.__wrapped__ if getattr(fn, "hooked", False) else fn


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW with its update in one Triton launch per (group, dtypes, step) bucket.

    Args:
        params, lr, betas, eps, weight_decay, amsgrad, **kwargs: torch.optim.AdamW's.
        backend: "auto", "triton" or "torch" (the module docstring).
    """

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, backend: Backend = "auto", **kwargs: Any) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)
        self.backend = backend

    def _why_not(self) -> str | None:
        """Why this step cannot run on the kernel (None: it can); changes nothing."""
        if self.backend == "torch":
            return "backend='torch'"
        ready: dict[torch.device, tuple[bool, str]] = {}
        for group in self.param_groups:
            for name, value in _TORCH_ONLY.items():
                if group.get(name) == value:
                    return f"{name}={value} is torch's AdamW's alone"
            if isinstance(group["lr"], Tensor) and group["lr"].device.type != "cpu":
                return "lr is a device tensor"
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                moments = (state["exp_avg"], state["exp_avg_sq"]) if state else ()
                if (why := _why_not(p, (p.grad, *moments), ready)) is not None:
                    return why
        return None

    @torch.compiler.disable  # addresses and host scalars: the step runs eagerly inside a compiled loop
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One update of every parameter with a gradient; returns the closure's loss (if given)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        why = self._why_not()
        if why is not None:
            if self.backend == "triton":
                raise ValueError(f"backend='triton' cannot run this AdamW step: {why}")
            if self.backend == "auto":
                log_once(f"kernel_pytorch.optim.AdamW: {why}; using torch's AdamW step")
            _unhooked_torch_step()(self)
            return loss
        from kernel_pytorch.ops import adamw  # imports Triton on the first kernel step

        for (index, *_), (step, lists) in self._buckets().items():
            group = self.param_groups[index]
            beta1, beta2 = (float(b) for b in group["betas"])
            # the launcher itself, as the functional layer's eager entries are: every tensor was checked
            # above, and the op's dispatch of four lists costs host time a step need not pay
            adamw.adamw_step(*lists, float(group["lr"]), beta1, beta2, float(group["eps"]),
                             float(group["weight_decay"]), step, check=False)
        return loss

    def _buckets(self) -> dict[tuple, tuple[float, tuple[list[Tensor], ...]]]:
        """The parameters with gradients, by (group, device, four dtypes, step after this update), each
        bucket's step and its (params, grads, exp_avgs, exp_avg_sqs); states are created and steps
        counted here, as torch's step does."""
        owners, steps = [], []
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # torch's own layout, so checkpoints move between the two
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if state["step"].device.type != "cpu":  # from a fused or capturable AdamW's checkpoint: once
                    state["step"] = state["step"].detach().to("cpu", torch.float32)
                owners.append((index, p, state))
                steps.append(state["step"])
        if not steps:
            return {}
        torch._foreach_add_(steps, 1.0)
        values = torch.stack(steps).tolist()
        buckets: dict[tuple, tuple[float, tuple[list[Tensor], ...]]] = {}
        for (index, p, state), step in zip(owners, values, strict=True):
            m, v = state["exp_avg"], state["exp_avg_sq"]
            key = (index, p.device, p.dtype, p.grad.dtype, m.dtype, v.dtype, step)
            lists = buckets.setdefault(key, (step, ([], [], [], [])))[1]
            for out, t in zip(lists, (p, p.grad, m, v), strict=True):
                out.append(t)
        return buckets
