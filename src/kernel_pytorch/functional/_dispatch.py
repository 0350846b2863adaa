"""What every functional entry shares: backend resolution (`_resolve`), the argument checks, the log
lines that say once why a call falls back to the reference, and the kernels' lazy import (`kernels`).

DTensor inputs (tensor and sequence parallelism) take the registered op on every device: its sharding
rule (ops/_common/sharding.py) runs it on each rank's local shards, Triton on CUDA, the reference
elsewhere. The eager path's autograd.Function around the launchers takes plain tensors only.

kernel_pytorch.ops (Triton, and the ops' registration) is imported on the first call that needs a
kernel, never by `import kernel_pytorch`: where Triton is missing (macOS, Windows, a CPU-only Linux
without it), backend="auto" runs the pure-torch reference and says so once, and backend="triton"
raises saying that Triton is not installed.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Literal

import torch
from torch import Tensor

from kernel_pytorch._env import KERNEL_DTYPES, is_dtensor, is_plain_tensor, log_once, triton_status, triton_version

Backend = Literal["auto", "triton", "reference"]
# "eager": the Triton launchers through the thin autograd.Function (CUDA, not compiling); "op": the
# registered torch op (under compile/export, for DTensors, and on CPU, where its kernel is the reference);
# "reference": the pure-torch reference
Path = Literal["eager", "op", "reference"]
_BACKENDS = ("auto", "triton", "reference")


@functools.cache
def kernels() -> ModuleType:
    """kernel_pytorch.ops, imported on first use: the eager entries (`kernels().rms_norm_eager`), and
    the ops registered as torch.ops.kernel_pytorch.*. Needs Triton (`kernels_ready`)."""
    return importlib.import_module("kernel_pytorch.ops")


@torch.compiler.assume_constant_result
def kernels_ready() -> bool:
    """Whether the registered ops can run here (Triton imports); imports and registers them if so.

    A constant to torch.compile: Dynamo calls it while tracing instead of tracing it, so the ops are
    registered before the graph names them.
    """
    if triton_version() is None:
        return False
    kernels()
    return True


def _exporting() -> bool:
    """Whether torch.export is tracing this call. Dynamo before torch 2.14 folds a call of
    `torch.compiler.is_exporting()` to True under torch.compile too (pytorch/pytorch#176347), which sent
    compiled calls down their export paths; the flag that function returns is read instead (set by
    strict and non-strict export alike)."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if isinstance(flag, bool):
        return flag
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(is_exporting()) if is_exporting is not None else False


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for `device_type` (our fused paths compute in the dtypes they are given)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4 takes no device type (and means CUDA)
        return torch.is_autocast_enabled() if device_type == "cuda" else False


def _one_kind(x: Tensor, params: Sequence[Tensor | None]) -> bool:
    """Whether every given parameter is a plain tensor (`is_plain_tensor`) of x's dtype and device, what
    our fused paths compute with; a tensor subclass, e.g. a torchao-quantized weight or a DTensor (tensor
    parallelism's; FSDP2 hands the modules plain unsharded Parameters in forward and backward), runs its
    own ops through F.linear, and the first of each kind is logged."""
    for p in params:
        if p is None:
            continue
        if not is_plain_tensor(p):
            if not torch.compiler.is_compiling():  # said in eager (a traced call of the cache breaks the graph)
                log_once(f"kernel_pytorch: a {type(p).__name__} parameter runs its own ops: the fused paths "
                         "around its GEMMs (gated MLP, shared-input Linears) step aside for torch's Linears")
            return False
        if p.dtype != x.dtype or p.device != x.device:
            return False
    return True


def _one_mesh(x: Tensor, params: Sequence[Tensor | None]) -> bool:
    """Whether x and every given parameter are DTensors on one device mesh, of x's dtype: what a registered
    op's sharding rule may run on the local shards (the rule itself checks the placements)."""
    if not is_dtensor(x):
        return False
    mesh = x.device_mesh
    return all(p is None or (is_dtensor(p) and p.device_mesh == mesh and p.dtype == x.dtype) for p in params)


def replicated_like(ref: Tensor, *ts: Tensor | None) -> tuple[Tensor | None, ...]:
    """`ts` with each plain tensor made a Replicate DTensor on the mesh of the DTensor `ref` (no copy, no
    check): for the arguments every rank holds whole and alike (rotary tables, position and token ids),
    which a DTensor op will not mix with plain tensors. DTensors and None pass unchanged."""
    from torch.distributed.tensor import DTensor, Replicate

    mesh = ref.device_mesh
    return tuple(t if t is None or is_dtensor(t) else DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim,
                                                                            run_check=False) for t in ts)


def _records_grad(*ts: Tensor | None) -> bool:
    """Whether autograd records a graph through any of `ts` (grad mode on, one of them requires grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _fusable(x: Tensor, params: Sequence[Tensor | None]) -> bool:
    """Where our fused forward/backward pairs around GEMMs apply (the gated MLP's block and op paths, the
    shared-input Linears): a gradient is recorded, the parameters are x's kind (`_one_kind`) and autocast
    is off (they run their GEMMs in the dtypes given)."""
    return _records_grad(x, *params) and _one_kind(x, params) and not _autocast_on(x.device.type)


def _check_float(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a tensor (got {type(t).__name__})")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {t.dtype})")


def _check_same_device(ref_name: str, ref: Tensor, **others: Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; move them together")


def _check_param(name: str, t: Tensor | None, x: Tensor) -> None:
    """An optional (D,) parameter matching x's last dim."""
    if t is None:
        return
    _check_float(name, t)
    if t.dim() != 1 or t.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{name} must have shape ({x.shape[-1]},) to match the last dim of x {tuple(x.shape)} "
            f"(got {tuple(t.shape)})"
        )


def _check_rows(x: Tensor, name: str = "x") -> None:
    """A floating-point (..., D) input with D > 0."""
    _check_float(name, x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension to normalise (got shape {tuple(x.shape)})")


def _resolve(backend: str, op: str, x: Tensor, compiling: bool) -> Path:
    """Which implementation runs `op` on `x` (Path above). Raises for a bad request.

    Args:
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
        compiling: torch.compiler.is_compiling(), asked once by the caller.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
    if backend == "reference":
        return "reference"
    kernel_dtype = x.dtype in KERNEL_DTYPES
    if compiling:
        # decide from what Dynamo guards on (device type, dtype) and whether Triton imports here
        # (a constant to Dynamo); the GPU's own support was checked in eager, and Inductor itself
        # needs Triton on CUDA
        if backend == "triton" and x.device.type != "cuda":
            raise ValueError(f"backend='triton' cannot run {op} on {x.device.type} tensors")
        if not (kernel_dtype and x.device.type in ("cuda", "cpu")):
            return "reference"
        if kernels_ready():
            return "op"
        if backend == "triton":
            raise ValueError(f"backend='triton' cannot run {op}: triton is not installed")
        return "reference"
    active, why = triton_status(x.device)
    if backend == "triton":
        if not active:
            raise ValueError(f"backend='triton' cannot run {op}: {why}")
        if not kernel_dtype:
            raise ValueError(
                f"backend='triton' cannot run {op} on x of dtype {x.dtype}; the kernels take "
                f"{', '.join(str(d) for d in KERNEL_DTYPES)}"
            )
        return "op" if is_dtensor(x) else "eager"
    if active and kernel_dtype:
        # a DTensor takes the registered op, whose sharding rule runs the kernels on its local shards
        return "op" if is_dtensor(x) else "eager"
    if not kernel_dtype:
        log_once(f"kernel_pytorch.{op}: x is {x.dtype}, which the kernels do not take; using the reference")
        return "reference"
    log_once(f"kernel_pytorch.{op}: Triton path inactive ({why}); using the reference")
    # CPU tensors (and DTensors anywhere) still go through the registered op (its CPU kernel is the
    # reference), so eager, compile and export see the same graph on every device that has a registered
    # kernel; without Triton there is no registered op (why says so)
    return "op" if (x.device.type == "cpu" or is_dtensor(x)) and kernels_ready() else "reference"
