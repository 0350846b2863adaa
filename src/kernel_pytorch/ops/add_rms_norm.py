"""Fused residual add + RMSNorm, registered as `kernel_pytorch::add_rms_norm_fwd` / `_bwd`.

Math (see reference/add_rms_norm.py), for x, residual (rows, D) and weight (D,):
    h = (x + residual).to(dtype);  y = rms_norm(h)          -> returns (y, h, rstd)
    d_sum = rms_norm_backward(dy on h) + dh;  dx = dresidual = d_sum
rms_norm's casting ("llama", "gemma", "torch", "none") says where y rounds, as in ops/rms_norm.py.

The kernels are RMSNorm's (ops/rms_norm.py) with their residual flags on: the forward reads x and
residual once and writes y and h; the backward adds dh while it writes the gradient, so the add
costs no extra pass over memory in either direction.
"""

from __future__ import annotations

from torch import Tensor

from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import register_rules, rowwise
from kernel_pytorch.ops.norm_config import NormConfig
from kernel_pytorch.ops.rms_norm import rms_norm_bwd, rms_norm_fwd
from kernel_pytorch.reference.add_rms_norm import add_residual, add_rms_norm_backward
from kernel_pytorch.reference.rms_norm import rms_norm_from_rstd, rms_norm_rstd


def add_rms_norm_fwd(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, casting: str = "llama",
    *, eager: bool = False, config: NormConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the fused forward (RMSNorm's launch choices, `config.rms_norm`). Returns y, h (both x's
    shape and dtype, contiguous), rstd (fp32)."""
    y, rstd, h = rms_norm_fwd(x, weight, eps, offset, casting, residual=residual, eager=eager, config=config)
    assert h is not None
    return y, h, rstd


def add_rms_norm_bwd(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting: str = "llama",
    *, eager: bool = False, config: NormConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Launch the fused backward. Returns d_sum (h's shape and dtype) and dweight."""
    return rms_norm_bwd(dy, h, weight, rstd, offset, casting, dres=dh, eager=eager, config=config)


def _fwd_reference(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float, casting: str = "llama"
) -> tuple[Tensor, Tensor, Tensor]:
    h = add_residual(x, residual)
    rstd = rms_norm_rstd(h, eps)
    return rms_norm_from_rstd(h, weight, rstd, offset, casting).contiguous(), h.contiguous(), rstd


def _bwd_reference(
    dy: Tensor, dh: Tensor, h: Tensor, weight: Tensor, rstd: Tensor, offset: float, casting: str = "llama"
) -> tuple[Tensor, Tensor]:
    d_sum, dw = add_rms_norm_backward(dy, dh, h, weight, rstd, offset, casting)
    return d_sum.contiguous(), dw


# kernel_pytorch::add_rms_norm_fwd (x, residual, weight, eps, offset, casting="llama") -> (y, h, rstd) and
# add_rms_norm_bwd (dy, dh, h, weight, rstd, offset, casting="llama") -> (d_sum, dweight), d_sum the
# gradient of both x and residual; add_rms_norm_eager(x, residual, weight, eps, offset, casting="llama")
# -> (y, h), differentiable
add_rms_norm_fwd_op, add_rms_norm_bwd_op, add_rms_norm_eager = register_op(
    "add_rms_norm",
    Impl(add_rms_norm_fwd, _fwd_reference, "reference", outputs=("y", "h", "rstd")),
    Impl(add_rms_norm_bwd, _bwd_reference, "reference", outputs=("d_sum", "dweight")),
    differentiable=("y", "h"),
    save=("h", "weight", "rstd"),
    keep=("offset", "casting"),
    grads={"x": "d_sum", "residual": "d_sum", "weight": "dweight"},
)
# DTensor: as rms_norm's rule, x and residual sharded alike
register_rules(
    "add_rms_norm", rowwise(("x", "residual"), ("rows", "rows", "rows")),
    rowwise(("dy", "dh", "h", "rstd"), ("rows", "sum")),
    "x and residual are sharded alike on a dim other than the last (Shard(d), d < x.ndim - 1) and the weight "
    "Replicate",
)
