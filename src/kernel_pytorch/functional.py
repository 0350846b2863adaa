"""Functional entry points: validate the arguments once (eager only), pick a backend, dispatch.

backend:
    "auto"      Triton kernels on CUDA; on CPU the registered op's reference kernel; the pure-torch
                reference anywhere else. Why the Triton path is not taken is logged once.
                One exception, also logged once: a LayerNorm call that records gradients in eager
                mode on at most ATEN_LAYER_NORM_MAX_NUMEL elements runs ATen's fused layer_norm.
                There the call is host-bound: ATen's single C++ autograd node costs ~100 us of host
                time per fwd+bwd on our GPU host, our Python autograd.Function and three launches
                ~230 us, against tens of microseconds of GPU work (benchmarks/NOTES.md).

In eager mode on CUDA the kernels are launched through a thin autograd.Function (same launchers, less
host time than the op dispatcher); under torch.compile / torch.export the registered ops
`torch.ops.kernel_pytorch.*` appear in the graph.
    "triton"    the Triton kernels, or a ValueError saying why they cannot run here.
    "reference" the pure-torch specification in kernel_pytorch.reference (autograd through torch).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch._env import log_once, triton_status
from kernel_pytorch.ops._triton import KERNEL_DTYPES
from kernel_pytorch.ops.add_rms_norm import add_rms_norm_eager
from kernel_pytorch.ops.layer_norm import layer_norm_eager
from kernel_pytorch.ops.rms_norm import rms_norm_eager

Backend = Literal["auto", "triton", "reference"]
# Elements up to which backend="auto" hands an eager, gradient-recording LayerNorm to ATen (measured
# crossover on the H100 host: ATen faster at 8192x2048, ours at 16384x2048; benchmarks/NOTES.md).
ATEN_LAYER_NORM_MAX_NUMEL = 1 << 24
_BACKENDS = ("auto", "triton", "reference")


def _check_float(name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (got {t.dtype})")


def _check_same_device(ref_name: str, ref: Tensor, **others: Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}; move them together")


def _check_param(name: str, t: Tensor | None, x: Tensor) -> None:
    if t is None:
        return
    _check_float(name, t)
    if t.dim() != 1 or t.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{name} must have shape ({x.shape[-1]},) to match the last dim of x {tuple(x.shape)} "
            f"(got {tuple(t.shape)})"
        )


def _check_rows(x: Tensor, name: str = "x") -> None:
    _check_float(name, x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension to normalise (got shape {tuple(x.shape)})")


Path = Literal["eager", "op", "reference"]


def _resolve(backend: str, op: str, x: Tensor, compiling: bool) -> Path:
    """Which implementation runs. Raises for a bad request.

    Returns:
        "eager": the Triton launchers through the thin autograd.Function (CUDA, not compiling);
        "op": the registered torch op (under compile/export, and on CPU, where its kernel is the
        reference); "reference": the pure-torch reference.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
    if backend == "reference":
        return "reference"
    kernel_dtype = x.dtype in KERNEL_DTYPES
    if compiling:
        # decide from what Dynamo guards on (device type, dtype); availability was checked in eager,
        # and Inductor itself needs Triton on CUDA
        if backend == "triton" and x.device.type != "cuda":
            raise ValueError(f"backend='triton' cannot run {op} on {x.device.type} tensors")
        return "op" if kernel_dtype and x.device.type in ("cuda", "cpu") else "reference"
    active, why = triton_status(x.device)
    if backend == "triton":
        if not active:
            raise ValueError(f"backend='triton' cannot run {op}: {why}")
        if not kernel_dtype:
            raise ValueError(
                f"backend='triton' cannot run {op} on x of dtype {x.dtype}; the kernels take "
                f"{', '.join(str(d) for d in KERNEL_DTYPES)}"
            )
        return "eager"
    if active and kernel_dtype:
        return "eager"
    if not kernel_dtype:
        log_once(f"kernel_pytorch.{op}: x is {x.dtype}, which the kernels do not take; using the reference")
        return "reference"
    log_once(f"kernel_pytorch.{op}: Triton path inactive ({why}); using the reference")
    # CPU tensors still go through the registered op (its CPU kernel is the reference), so eager,
    # compile and export see the same graph on every device that has a registered kernel
    return "op" if x.device.type == "cpu" else "reference"


def _host_bound_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> bool:
    """Whether an eager CUDA LayerNorm call is small enough, and records gradients, so that host time
    decides its speed (ATen's fused op then wins); parameters of another dtype keep our kernels."""
    if x.numel() > ATEN_LAYER_NORM_MAX_NUMEL or not torch.is_grad_enabled():
        return False
    params = [t for t in (weight, bias) if t is not None]
    if any(t.dtype != x.dtype for t in params):
        return False
    return x.requires_grad or any(t.requires_grad for t in params)


def rms_norm(
    x: Tensor, weight: Tensor, eps: float = 1e-6, *, offset: float = 0.0, backend: Backend = "auto"
) -> Tensor:
    """RMSNorm with HF-Llama semantics: (x * rstd).to(x.dtype) * (offset + weight).

    Args:
        x: (..., D) input, fp32/bf16/fp16 (any strides).
        weight: (D,) scale, on x's device; any float dtype.
        eps: added to the mean square.
        offset: added to the weight; 1.0 reproduces Gemma's `(1 + weight)`.
        backend: "auto", "triton" or "reference" (module docstring).
    Returns:
        (..., D) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check_rows(x)
        _check_param("weight", weight, x)
        _check_same_device("x", x, weight=weight)
    path = _resolve(backend, "rms_norm", x, compiling)
    if path == "eager":
        return rms_norm_eager(x, weight, float(eps), float(offset))
    if path == "op":
        return torch.ops.kernel_pytorch.rms_norm_fwd(x, weight, float(eps), float(offset))[0]
    return reference.rms_norm(x, weight, eps, offset)


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor]:
    """Fused residual add + RMSNorm: returns (rms_norm(x + residual), x + residual).

    Args:
        x: (..., D) block output.
        residual: (..., D) residual stream, same shape and dtype as x.
        weight: (D,) scale.
        eps, offset, backend: as in `rms_norm`.
    Returns:
        (y, h): both of x's shape and dtype; h is the updated residual stream.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check_rows(x)
        _check_float("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)} (got {tuple(residual.shape)})")
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must have x's dtype {x.dtype} (got {residual.dtype})")
        _check_param("weight", weight, x)
        _check_same_device("x", x, residual=residual, weight=weight)
    path = _resolve(backend, "add_rms_norm", x, compiling)
    if path == "eager":
        return add_rms_norm_eager(x, residual, weight, float(eps), float(offset))
    if path == "op":
        y, h, _rstd = torch.ops.kernel_pytorch.add_rms_norm_fwd(x, residual, weight, float(eps), float(offset))
        return y, h
    return reference.add_rms_norm(x, residual, weight, eps, offset)


def layer_norm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    backend: Backend = "auto",
) -> Tensor:
    """LayerNorm over the last dim (torch.nn.LayerNorm semantics, fp32 statistics).

    Args:
        x: (..., D) input, fp32/bf16/fp16 (any strides).
        weight: (D,) scale or None.
        bias: (D,) shift or None.
        eps: added to the variance.
        backend: "auto", "triton" or "reference".
    Returns:
        (..., D) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check_rows(x)
        _check_param("weight", weight, x)
        _check_param("bias", bias, x)
        _check_same_device("x", x, weight=weight, bias=bias)
    path = _resolve(backend, "layer_norm", x, compiling)
    if path == "eager":
        if backend == "auto" and _host_bound_layer_norm(x, weight, bias):
            log_once(
                "kernel_pytorch.layer_norm: backend='auto' runs ATen's fused layer_norm for eager calls that "
                f"record gradients on at most {ATEN_LAYER_NORM_MAX_NUMEL} elements (host-bound there); "
                "backend='triton' forces the kernels"
            )
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        return layer_norm_eager(x, weight, bias, float(eps))
    if path == "op":
        return torch.ops.kernel_pytorch.layer_norm_fwd(x, weight, bias, float(eps))[0]
    return reference.layer_norm(x, weight, bias, eps)


__all__ = ["ATEN_LAYER_NORM_MAX_NUMEL", "Backend", "add_rms_norm", "layer_norm", "rms_norm"]
