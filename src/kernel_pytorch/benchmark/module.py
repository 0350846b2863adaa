"""`benchmark_module`: time and measure a module's forward and forward+backward on given inputs.

Passes:
    "fwd"      module(*inputs) under torch.no_grad() (inference: nothing saved for backward).
    "fwd+bwd"  module(*inputs), then torch.autograd.grad of every differentiable output with a fixed
               random upstream gradient, with respect to the floating-point inputs and the
               parameters. autograd.grad (not .backward) so no `.grad` accumulation adds traffic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._tree import (
    Recorded,
    as_inputs,
    call,
    clone_detached,
    devices,
    map_tensors,
    nbytes,
    tensors,
)
from kernel_pytorch.benchmark.ceilings import Ceilings, RooflinePoint, device_name, roofline
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph
from kernel_pytorch.benchmark.memory import MemoryMeasurement, peak_memory
from kernel_pytorch.benchmark.timer import Timing, resolve_device, rotation_copies, time_fn

PASSES = ("fwd", "fwd+bwd")


def infer_device(module: nn.Module | None, inputs: Any) -> torch.device:
    """The CUDA device among the inputs' and parameters' devices, else CPU."""
    devs = devices(inputs)
    if module is not None:
        devs |= {p.device for p in module.parameters()} | {b.device for b in module.buffers()}
    cuda = sorted((d for d in devs if d.type == "cuda"), key=str)
    return resolve_device(cuda[0]) if cuda else torch.device("cpu")


def with_input_grads(inputs: tuple | dict) -> tuple | dict:
    """Detached copies of the floating-point input tensors that require grad (others untouched)."""
    return map_tensors(
        lambda t: t.detach().requires_grad_(True) if t.is_floating_point() else t, inputs
    )


def upstream_gradients(
    outputs: Sequence[Tensor], seed: int, round_to: Sequence[torch.dtype] | None = None
) -> list[Tensor]:
    """A fixed random gradient per output, drawn on the CPU from `seed`.

    Every device and every model with outputs of these shapes gets the same values: each is drawn in
    fp32 and rounded once to `round_to[i]` (default: the output's dtype), then cast to the output's
    dtype, so an fp64 reference run can receive exactly the values a bf16 run received.
    """
    gen = torch.Generator().manual_seed(seed)
    dtypes = list(round_to) if round_to is not None else [o.dtype for o in outputs]
    return [
        torch.randn(o.shape, generator=gen).to(d).to(device=o.device, dtype=o.dtype)
        for o, d in zip(outputs, dtypes)
    ]


def differentiable(out: Any) -> list[Tensor]:
    """Output leaves that carry gradient."""
    return [t for t in tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def pass_closure(
    forward: Callable[[], Any], wrt: Sequence[Tensor], pass_name: str, *, seed: int = 0, ones: bool = False
) -> Callable[[], Any]:
    """A zero-argument callable running one pass of `forward` (a zero-argument call of the work).

    The one builder behind `make_pass` and the benchmark suites' runner.

    Args:
        forward: runs the forward on inputs already bound (those in `wrt` requiring grad).
        wrt: what "fwd+bwd" differentiates (inputs and parameters); ignored by "fwd".
        pass_name: "fwd" (under no_grad) or "fwd+bwd" (autograd.grad of every differentiable output
            with a fixed upstream gradient; nothing accumulates into `.grad`).
        seed: seeds the fixed upstream gradient (drawn once, here, outside any timed call).
        ones: an upstream gradient of ones instead (a loss's, as `loss.backward()` passes).
    Raises:
        ValueError: an unknown pass, or "fwd+bwd" with no differentiable output or nothing in `wrt`.
    """
    if pass_name == "fwd":
        def fwd() -> Any:
            with torch.no_grad():
                return forward()

        return fwd
    if pass_name != "fwd+bwd":
        raise ValueError(f"pass must be one of {PASSES} (got {pass_name!r})")
    wrt = list(wrt)
    with torch.enable_grad():
        outs = differentiable(forward())
    if not outs or not wrt:
        raise ValueError("fwd+bwd needs an output that requires grad and an input or parameter to differentiate")
    grads = [torch.ones_like(o) for o in outs] if ones else upstream_gradients(outs, seed)

    def fwd_bwd() -> tuple[Tensor | None, ...]:
        with torch.enable_grad():
            # the same upstream gradient every call: no copy inside the timed region
            return torch.autograd.grad(differentiable(forward()), wrt, grads, allow_unused=True)

    return fwd_bwd


def make_pass(module: Callable[..., Any], inputs: tuple | dict, pass_name: str, *, seed: int = 0) -> Callable[[], Any]:
    """A zero-argument callable running one pass of `module` on `inputs`.

    Args:
        module: the model (or any callable).
        inputs: tuple of positional or dict of keyword arguments.
        pass_name: "fwd" or "fwd+bwd".
        seed: seeds the fixed upstream gradient of "fwd+bwd".
    Raises:
        ValueError: an unknown pass, or "fwd+bwd" on a call with no differentiable output.
    """
    if pass_name == "fwd":
        return pass_closure(lambda: call(module, inputs), (), pass_name)
    if pass_name != "fwd+bwd":
        raise ValueError(f"pass must be one of {PASSES} (got {pass_name!r})")
    grad_inputs = with_input_grads(inputs)
    params = [p for p in module.parameters() if p.requires_grad] if isinstance(module, nn.Module) else []
    wrt = [t for t in tensors(grad_inputs) if t.requires_grad] + params
    return pass_closure(lambda: call(module, grad_inputs), wrt, pass_name, seed=seed)


@dataclass
class PassResult(Recorded):
    """Measurements of one pass; `error` set (and the rest None) when the pass could not run."""

    pass_name: str
    timing: Timing | None = None
    graph_timing: Timing | None = None
    graph_error: str | None = None
    memory: MemoryMeasurement | None = None
    roofline: RooflinePoint | None = None
    error: str | None = None


@dataclass
class ModuleBenchmark(Recorded):
    """`benchmark_module`'s result: one `PassResult` per pass."""

    name: str
    device: str
    passes: dict[str, PassResult] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{self.name} on {self.device}"]
        for p in self.passes.values():
            if p.error:
                lines.append(f"  {p.pass_name}: error: {p.error}")
                continue
            mem = p.memory.peak_mib if p.memory else None
            mem_s = f", peak {mem:.1f} MiB" if mem is not None else ""
            lines.append(f"  {p.pass_name}: {p.timing}{mem_s}")
            if p.graph_timing:
                lines.append(f"  {p.pass_name} (cuda graph): {p.graph_timing}")
        return "\n".join(lines)


def benchmark_module(
    module: Callable[..., Any],
    inputs: Any,
    *,
    passes: Sequence[str] = PASSES,
    device: torch.device | str | None = None,
    flush_l2: bool = True,
    rotate: bool = False,
    cuda_graph: bool = False,
    measure_memory: bool = True,
    nbytes_per_pass: Mapping[str, float] | None = None,
    flops_per_pass: Mapping[str, float] | None = None,
    ceilings: Ceilings | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    cpu_min_run_time: float = 0.2,
    seed: int = 0,
) -> ModuleBenchmark:
    """Median time, spread and peak memory of each pass of `module` on `inputs`.

    Args:
        module: an nn.Module (or any callable) already on its device, in its dtype.
        inputs: positional args (tuple/list), keyword args (dict) or one tensor.
        passes: any of "fwd", "fwd+bwd".
        device: where it runs (default: inferred from inputs and parameters).
        flush_l2: CUDA: flush L2 between repetitions.
        rotate: CUDA: rotate over enough input copies to span 2x L2 (tiny working sets).
        cuda_graph: CUDA: also time replay from a CUDA graph (shows launch overhead separately).
        measure_memory: measure peak memory of one call per pass.
        nbytes_per_pass: minimum bytes each pass moves, for GB/s and % of the copy ceiling.
        flops_per_pass: FLOPs of each pass, for TFLOP/s and % of the matmul ceiling.
        ceilings: measured ceilings for the percentages.
        warmup_ms, rep_ms, cpu_min_run_time: see `timer.time_fn`.
        seed: seeds the fixed upstream gradient.
    Returns:
        A `ModuleBenchmark`; a pass that cannot run carries its error instead of raising.
    """
    args = as_inputs(inputs)
    dev = resolve_device(device) if device is not None else infer_device(
        module if isinstance(module, nn.Module) else None, args)
    result = ModuleBenchmark(name=type(module).__name__, device=device_name(dev))
    copies = rotation_copies(nbytes(args), dev) if rotate else 1
    for pass_name in passes:
        pr = PassResult(pass_name)
        result.passes[pass_name] = pr
        try:
            arg_sets = [args] + [clone_detached(args) for _ in range(copies - 1)]
            fns = [make_pass(module, a, pass_name, seed=seed) for a in arg_sets]
            pr.timing = time_fn(fns, device=dev, warmup_ms=warmup_ms, rep_ms=rep_ms, flush_l2=flush_l2,
                                cpu_min_run_time=cpu_min_run_time)
            if measure_memory:
                pr.memory = peak_memory(fns[0], dev)
        except Exception as exc:  # reported in the result: one broken pass must not hide the others
            pr.error = f"{type(exc).__name__}: {exc}"
            continue
        if cuda_graph and dev.type == "cuda":
            try:
                pr.graph_timing = time_cuda_graph(fns, device=dev)
            except Exception as exc:
                pr.graph_error = f"{type(exc).__name__}: {exc}"
        nb = (nbytes_per_pass or {}).get(pass_name)
        fl = (flops_per_pass or {}).get(pass_name)
        if nb or fl:
            pr.roofline = roofline(pr.timing.median_ms, nbytes=nb, flops=fl, ceilings=ceilings)
    return result


__all__ = [
    "PASSES",
    "ModuleBenchmark",
    "PassResult",
    "as_inputs",
    "benchmark_module",
    "call",
    "differentiable",
    "infer_device",
    "make_pass",
    "pass_closure",
    "upstream_gradients",
    "with_input_grads",
]
