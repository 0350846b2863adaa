"""Norm family: rms_norm, add_rms_norm, layer_norm. Each validates its arguments once (eager only),
resolves the backend (functional/_dispatch.py) and runs the eager launchers, the registered op or the
reference. The ops are reached through `kernels()` and torch.ops (registered by `_resolve` when it
picks them): this module does not import Triton.

LayerNorm's ATen route (backend="auto" only, logged once): an eager call (not compiling) that records
gradients (grad mode on; x, weight or bias requires grad) on a non-empty CUDA x of at most
ATEN_LAYER_NORM_MAX_NUMEL elements and a kernel dtype (fp32/bf16/fp16), with weight and bias (where
given) of x's dtype, runs ATen's fused layer_norm, whether or not the Triton path is active. There the
call is host-bound: ATen's single C++ autograd node costs ~90 us of host time per fwd+bwd on our GPU
host, our Python autograd.Function and its launches ~210 us, against tens of microseconds of GPU work
(docs/performance.md). The route is decided before the argument checks, which run only when ATen
refuses the arguments: they then raise our error naming the argument (where they pass, ATen's error
stands).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch._env import log_once
from kernel_pytorch.functional._dispatch import (
    KERNEL_DTYPES,
    Backend,
    _check_float,
    _check_param,
    _check_rows,
    _check_same_device,
    _resolve,
    kernels,
)
from kernel_pytorch.reference.rms_norm import Casting, rounds_normed

# Elements up to which backend="auto" hands an eager, gradient-recording LayerNorm to ATen (measured
# crossover on the H100 host: ATen faster at 8192x2048, ours at 16384x2048; docs/performance.md).
ATEN_LAYER_NORM_MAX_NUMEL = 1 << 24
# A constant, so the once-only check is one dict lookup in log_once's cache.
_ATEN_LAYER_NORM_LOG = (
    "kernel_pytorch.layer_norm: backend='auto' runs ATen's fused layer_norm for eager CUDA calls that "
    f"record gradients on at most {ATEN_LAYER_NORM_MAX_NUMEL} elements (host-bound there); "
    "backend='triton' forces the kernels"
)


def _check_layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None) -> None:
    _check_rows(x)
    _check_param("weight", weight, x)
    _check_param("bias", bias, x)
    _check_same_device("x", x, weight=weight, bias=bias)


def _check_rms_norm(x: Tensor, weight: Tensor, casting: str, residual: Tensor | None = None) -> None:
    """rms_norm's and add_rms_norm's eager checks, in order: x, the residual (x's shape and dtype),
    weight, one device for all, a known casting."""
    _check_rows(x)
    if residual is not None:
        _check_float("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)} (got {tuple(residual.shape)})")
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must have x's dtype {x.dtype} (got {residual.dtype})")
    _check_param("weight", weight, x)
    _check_same_device("x", x, residual=residual, weight=weight)
    rounds_normed(casting)  # ValueError naming the values for an unknown casting


def _aten_layer_norm_route(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, backend: str, compiling: bool
) -> bool:
    """Whether `layer_norm` hands this call to ATen's fused layer_norm (module docstring): the one
    place the route is decided. x on CUDA first (getattr: a non-tensor x goes on to the checks, which
    name it), then the device-free rule."""
    return getattr(x, "is_cuda", False) and _aten_layer_norm_rule(x, weight, bias, backend, compiling)


def _aten_layer_norm_rule(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, backend: str, compiling: bool
) -> bool:
    """The ATen route's conditions other than the device: backend "auto", eager, non-empty and small
    enough that host time decides its speed, recording gradients, and of dtypes our kernels take;
    parameters of another dtype keep our kernels.

    Ordered so that the calls that do not qualify leave early; compiling first, so Dynamo never
    guards on x.numel(). Never raises for arguments of the wrong type: those reach the checks.
    """
    if compiling or backend != "auto" or not torch.is_grad_enabled():
        return False
    # an empty x takes the checked path: ATen accepts an empty last dim, our checks reject it
    if not 0 < x.numel() <= ATEN_LAYER_NORM_MAX_NUMEL:
        return False
    dtype = x.dtype
    if dtype not in KERNEL_DTYPES:
        return False
    if weight is not None and getattr(weight, "dtype", None) is not dtype:
        return False
    if bias is not None and getattr(bias, "dtype", None) is not dtype:
        return False
    return x.requires_grad or (weight is not None and weight.requires_grad) or (bias is not None and bias.requires_grad)


def rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting: Casting = "llama",
    backend: Backend = "auto",
) -> Tensor:
    """RMSNorm: x * rstd * (offset + weight), math in fp32, rounded to x's dtype where `casting` says.

    Args:
        x: (..., D) input, fp32/bf16/fp16 (any strides).
        weight: (D,) scale, on x's device; any float dtype.
        eps: added to the mean square.
        offset: added to the weight; 1.0 reproduces Gemma's `(1 + weight)`.
        casting: "llama" (HF LlamaRMSNorm: x * rstd rounded to x's dtype before the weight; the
            default), "gemma" (HF GemmaRMSNorm: one rounding at the end; use with offset=1.0),
            "torch" (torch.nn.RMSNorm / F.rms_norm: one rounding at the end) or "none" (Liger-Kernel's
            casting_mode="none": the products in x's dtype, rounded at each). Only bf16/fp16 differ.
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
    Returns:
        (..., D) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check_rms_norm(x, weight, casting)
    path = _resolve(backend, "rms_norm", x, compiling)
    if path == "eager":
        return kernels().rms_norm_eager(x, weight, float(eps), float(offset), casting)
    if path == "op":
        return torch.ops.kernel_pytorch.rms_norm_fwd(x, weight, float(eps), float(offset), casting)[0]
    return reference.rms_norm(x, weight, eps, offset, casting)


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    offset: float = 0.0,
    casting: Casting = "llama",
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor]:
    """Fused residual add + RMSNorm: returns (rms_norm(x + residual), x + residual).

    Args:
        x: (..., D) block output.
        residual: (..., D) residual stream, same shape and dtype as x.
        weight: (D,) scale.
        eps, offset, casting, backend: as in `rms_norm` (casting: where y rounds; h is x + residual
            rounded once in every mode).
    Returns:
        (y, h): both of x's shape and dtype; h is the updated residual stream.
    """
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _check_rms_norm(x, weight, casting, residual)
    path = _resolve(backend, "add_rms_norm", x, compiling)
    if path == "eager":
        return kernels().add_rms_norm_eager(x, residual, weight, float(eps), float(offset), casting)
    if path == "op":
        y, h, _rstd = torch.ops.kernel_pytorch.add_rms_norm_fwd(
            x, residual, weight, float(eps), float(offset), casting
        )
        return y, h
    return reference.add_rms_norm(x, residual, weight, eps, offset, casting)


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
        backend: "auto", "triton" or "reference"; "auto" may run ATen's layer_norm (module docstring).
    Returns:
        (..., D) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    if _aten_layer_norm_route(x, weight, bias, backend, compiling):
        log_once(_ATEN_LAYER_NORM_LOG)
        try:
            # F.layer_norm less its Python: the binding handles __torch_function__ itself, and its
            # trailing cudnn_enable (F.layer_norm reads torch.backends.cudnn.enabled, ~0.2 us) is
            # ignored by ATen, so it keeps its default
            return torch.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        except (RuntimeError, TypeError, ValueError, IndexError) as err:  # IndexError: 0-dim x
            aten_error = err
        # ATen refused the arguments: our checks name the bad one (raised outside the handler, so not
        # chained to ATen's message); if they all pass, ATen's own error stands
        _check_layer_norm(x, weight, bias)
        raise aten_error
    if not compiling:
        _check_layer_norm(x, weight, bias)
    path = _resolve(backend, "layer_norm", x, compiling)
    if path == "eager":
        return kernels().layer_norm_eager(x, weight, bias, float(eps))
    if path == "op":
        return torch.ops.kernel_pytorch.layer_norm_fwd(x, weight, bias, float(eps))[0]
    return reference.layer_norm(x, weight, bias, eps)
