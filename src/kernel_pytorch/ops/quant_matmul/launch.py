"""The quantized matmuls' launchers: the plan of a call (path, tiles, K slices) from its shape and the
config in force, the forward launch (one kernel, or two with K slices), the dequantization kernel, the
backward (dx = dy @ dequant(W), dbias = dy summed over rows) and the registration every scheme shares.
The math is kernels.py's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import triton
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher, device_programs, next_power_of_2
from kernel_pytorch.ops._common.register import Impl, RegisteredOp, register_op
from kernel_pytorch.ops.quant_matmul.config import GemvLaunch, QuantMatmulConfig
from kernel_pytorch.ops.quant_matmul.gemv import _gemv_kernel, gemv_runs
from kernel_pytorch.ops.quant_matmul.kernels import (
    SCHEME_CODES,
    _dequant_kernel,
    _quant_matmul_kernel,
    _sum_splits_kernel,
)

_matmul = Launcher(_quant_matmul_kernel)
_gemv = Launcher(_gemv_kernel)
_sum_splits = Launcher(_sum_splits_kernel)
_dequant = Launcher(_dequant_kernel)


class Plan(NamedTuple):
    """How one call runs: `path` ("gemv", "split_k", "tiled" or "dequant"), the tile, the K slices."""

    path: str
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    splits: int
    k_per_split: int
    num_warps: int
    num_stages: int


def _block(size: int, limit: int, least: int) -> int:
    """A power-of-two block of at most `limit`, no wider than `size` needs, at least `least`."""
    return max(least, min(limit, next_power_of_2(max(size, 1))))


@functools.lru_cache(maxsize=1024)
def plan(m: int, n: int, k: int, scheme: str, group: int, device: torch.device, config: QuantMatmulConfig) -> Plan:
    """The plan of an (m, k) @ (n, k).T call of `scheme` (int4's `group`) on `device` (config docstring)."""
    launches = config.scheme(scheme)
    if m > config.decode_max_m:
        if config.prefill == "dequant":
            return Plan("dequant", 0, 0, 0, 0, 1, k, 0, 0)
        t = launches.tiled
        bk = _block(k, t.block_k, 16)
        if scheme == "int4":
            bk = min(bk, group)
        return Plan("tiled", _block(m, t.block_m, 16), _block(n, t.block_n, 16), bk, t.group_m, 1,
                    triton.cdiv(k, bk) * bk, t.num_warps, t.num_stages)
    if m <= config.gemv_max_m:
        return _gemv_plan(n, k, scheme, group, device, launches.gemv)
    launch = launches.split_k
    bm = _block(m, config.decode_max_m, 16)  # tl.dot takes 16 rows or more
    bn = _block(n, launch.block_n, 16)
    bk = _block(k, launch.block_k, 16)
    if scheme == "int4":
        bk = min(bk, group)  # one scale per row per tile
    steps = triton.cdiv(k, bk)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    want = device_programs(device, launch.programs_per_sm)
    splits = max(1, min(launch.max_split, steps, triton.cdiv(want, tiles)))
    k_per_split = max(1, triton.cdiv(steps, splits)) * bk
    splits = max(1, triton.cdiv(k, k_per_split))
    return Plan("split_k", bm, bn, bk, 1, splits, k_per_split, launch.num_warps, launch.num_stages)


def _gemv_plan(n: int, k: int, scheme: str, group: int, device: torch.device, launch: GemvLaunch) -> Plan:
    """gemv: blocks of N, K sliced into the most slices that keep the programs of one row of x at or
    under programs_per_sm per SM (the blocks of N are counted per row: rows run one after another's
    weight in L2). int4's step is at least 32 weights (16 bytes, one load)."""
    bn = _block(n, launch.block_n, 8)
    bk = _block(k, launch.block_k, 32 if scheme == "int4" else 16)
    steps = triton.cdiv(k, bk)
    tiles = triton.cdiv(n, bn)
    splits = max(1, min(launch.max_split, steps, device_programs(device, launch.programs_per_sm) // tiles))
    k_per_split = triton.cdiv(steps, splits) * bk
    splits = triton.cdiv(k, k_per_split)
    return Plan("gemv", 1, bn, bk, 1, splits, k_per_split, launch.num_warps, launch.num_stages)


def _size_hint(size: int | torch.SymInt, unhinted: int) -> int:
    """A size to plan for: itself, or a SymInt's hint (the example input's), else `unhinted`.
    torch.export, AOTInductor and compile with dynamic shapes trace the launch with symbolic sizes: the
    plan's tiles are compile-time constants chosen from the hints, the grid stays symbolic, and every
    plan is correct at every size (the kernels mask their last tiles)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    node = size.node
    return int(node.hint) if node.has_hint() else unhinted


def fp8_native(device: torch.device) -> bool:
    """Whether `device` converts e4m3 in hardware (CUDA compute capability 8.9 and up; the interpreter
    does); elsewhere the kernels decode the bytes."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _dot_fp32(x: Tensor) -> bool:
    """Whether tl.dot runs in IEEE fp32: for fp32 x (no TF32), and for bf16 x off CUDA (Triton's
    interpreter multiplies bf16 tiles as their bit patterns)."""
    return x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.device.type != "cuda")


def _weight_args(scheme: str, qweight: Tensor, scale: Tensor, zero: Tensor | None,
                 native: bool) -> tuple[Tensor, Tensor, Tensor, int, int]:
    """(W, S, Z, stride_sn, stride_zn) as the kernels take them: unit stride along K, fp8 as its bytes
    where the device has no e4m3 conversion, scale itself standing in for int8's and fp8's zero."""
    w = qweight if qweight.stride(-1) == 1 else qweight.contiguous()
    if scheme == "fp8" and not native:
        w = w.view(torch.uint8)
    s = scale.contiguous()
    z = zero.contiguous() if zero is not None else s
    return w, s, z, s.stride(0) if s.dim() == 2 else 1, z.stride(0) if z.dim() == 2 else 1


def quant_matmul(
    scheme: str, x: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor | None, group_size: int,
    bias: Tensor | None, *, eager: bool = False, config: QuantMatmulConfig | None = None,
    native_fp8: bool | None = None,
) -> Tensor:
    """y = x @ dequant(W).T (+ bias): (..., K) -> (..., N) of x's dtype (reference/quant_matmul.py).

    Args:
        scheme: "int8", "int4" or "fp8"; qweight, scale, zero (int4 only), group_size (int4 only, else
            ignored): the weight as reference.quant_matmul.quantize gives it.
        eager: launch directly rather than through wrap_triton.
        config: the launch config (None: `tuning.current("quant_matmul")`).
        native_fp8: decode e4m3 in hardware (None: whether the device can, `fp8_native`).
    """
    cfg = config or tuning.current("quant_matmul")
    k, n = x.shape[-1], qweight.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if n == 0 or (not isinstance(m, torch.SymInt) and m == 0):
        return y.reshape(*lead, n)
    # rows without a hint (data-dependent) plan as prefill: the tiled path suits any M
    p = plan(_size_hint(m, cfg.decode_max_m + 1), _size_hint(n, 4096), _size_hint(k, 4096), scheme, group_size,
             x.device, cfg)
    if p.path == "dequant":
        w = dequantize(scheme, qweight, scale, zero, group_size, k, x.dtype, eager=eager, config=cfg,
                       native_fp8=native_fp8)
        return torch.nn.functional.linear(x2, w, bias).reshape(*lead, n)
    native = fp8_native(x.device) if native_fp8 is None else native_fp8
    w, s, z, stride_sn, stride_zn = _weight_args(scheme, qweight, scale, zero, native)
    partial = p.splits > 1
    out = torch.empty(p.splits, m, n, dtype=torch.float32, device=x.device) if partial else y
    call = Operands(scheme, x2, w, s, z, bias if bias is not None else s, out, y, m, n, k, stride_sn, stride_zn,
                    group_size if scheme == "int4" else 1, native, bias is not None)
    (_launch_gemv if p.path == "gemv" else _launch_matmul)(p, call, eager)
    if partial:
        block = 1024
        _sum_splits((triton.cdiv(m * n, block),), out, call.b, y, m, n, p.splits, y.stride(0),
                    HAS_BIAS=call.has_bias, BLOCK=block, num_warps=4, eager=eager)
    return y.reshape(*lead, n)


class Operands(NamedTuple):
    """One call's tensors and sizes as the kernels take them.

    x: (m, k), unit stride along K; w, s, z: the weight, its scales and zero points (`_weight_args`: s stands
    in for z where the scheme has none); b: the bias, or s standing in when `has_bias` is False; out: y
    itself, or the (splits, m, n) fp32 partials of a plan with K slices; y: the (m, n) result; stride_sn,
    stride_zn: the scales' and zero points' row strides; group: int4's group size (1 for int8 and fp8);
    native: e4m3 decoded in hardware."""

    scheme: str
    x: Tensor
    w: Tensor
    s: Tensor
    z: Tensor
    b: Tensor
    out: Tensor
    y: Tensor
    m: int
    n: int
    k: int
    stride_sn: int
    stride_zn: int
    group: int
    native: bool
    has_bias: bool


def _launch_gemv(p: Plan, c: Operands, eager: bool) -> None:
    """gemv.py's kernel: grid (rows x N blocks, K slices); rows of W in bytes (int4: two weights each)."""
    # int8 as bytes: the kernel turns u ^ 0x80 = q + 128 into fp32 through its bits
    w = c.w.view(torch.uint8) if c.scheme == "int8" else c.w
    chunks, cb = gemv_runs(c.scheme, p.block_k, c.group)
    per_byte = 2 if c.scheme == "int4" else 1
    _gemv(
        (c.m * triton.cdiv(c.n, p.block_n), p.splits), c.x, w, c.s, c.z, c.b, c.out, c.m, c.n, c.k,
        c.k // per_byte, p.k_per_split // per_byte, c.x.stride(0), w.stride(0), c.stride_sn, c.stride_zn,
        c.y.stride(0),
        SCHEME=SCHEME_CODES.index(c.scheme), GROUP=c.group, FP8_NATIVE=c.native, PARTIAL=p.splits > 1,
        HAS_BIAS=c.has_bias, BLOCK_N=p.block_n, CHUNKS=chunks, CB=cb, NUM_STAGES=p.num_stages,
        num_warps=p.num_warps, num_stages=p.num_stages, eager=eager,
    )


def _launch_matmul(p: Plan, c: Operands, eager: bool) -> None:
    """kernels.py's matmul (split_k and tiled): grid (M x N tiles, K slices)."""
    grid = (triton.cdiv(c.m, p.block_m) * triton.cdiv(c.n, p.block_n), p.splits)
    _matmul(
        grid, c.x, c.w, c.s, c.z, c.b, c.out, c.m, c.n, c.k, p.k_per_split, c.x.stride(0), c.w.stride(0),
        c.stride_sn, c.stride_zn, c.y.stride(0),
        SCHEME=SCHEME_CODES.index(c.scheme), GROUP=c.group, FP8_NATIVE=c.native, DOT_FP32=_dot_fp32(c.x),
        PARTIAL=p.splits > 1, HAS_BIAS=c.has_bias, BLOCK_M=p.block_m, BLOCK_N=p.block_n, BLOCK_K=p.block_k,
        GROUP_M=p.group_m, num_warps=p.num_warps, num_stages=p.num_stages, eager=eager,
    )


def dequantize(
    scheme: str, qweight: Tensor, scale: Tensor, zero: Tensor | None, group_size: int, k: int,
    dtype: torch.dtype, *, eager: bool = False, config: QuantMatmulConfig | None = None,
    native_fp8: bool | None = None,
) -> Tensor:
    """The dense (N, K) weight in `dtype` (reference.quant_matmul.dequantize, rounded once to dtype)."""
    cfg = config or tuning.current("quant_matmul")
    n = qweight.shape[0]
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    if n == 0 or k == 0:
        return out
    native = fp8_native(qweight.device) if native_fp8 is None else native_fp8
    w, s, z, stride_sn, stride_zn = _weight_args(scheme, qweight, scale, zero, native)
    bn, bk = cfg.dequant_block_n, cfg.dequant_block_k
    _dequant((triton.cdiv(n, bn), triton.cdiv(k, bk)), w, s, z, out, n, k, w.stride(0), stride_sn, stride_zn,
             SCHEME=SCHEME_CODES.index(scheme), GROUP=group_size if scheme == "int4" else 1, FP8_NATIVE=native,
             BLOCK_N=bn, BLOCK_K=bk, num_warps=4, eager=eager)
    return out


def quant_matmul_backward(
    scheme: str, dy: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor | None, group_size: int,
    has_bias: bool, *, eager: bool = False, config: QuantMatmulConfig | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(dx (..., K), dbias (N,) or None), both of dy's dtype: the weight dequantized into dy's dtype once,
    then torch's matmul (dy @ W: the GEMM of a Linear's input gradient), dbias summed in fp32."""
    n = qweight.shape[0]
    k = qweight.shape[1] * (2 if scheme == "int4" else 1)
    w = dequantize(scheme, qweight, scale, zero, group_size, k, dy.dtype, eager=eager, config=config)
    dy2 = dy.reshape(-1, n)
    dx = (dy2 @ w).reshape(*dy.shape[:-1], k)
    dbias = dy2.sum(0, dtype=torch.float32).to(dy.dtype) if has_bias else None
    return dx, dbias


def register_scheme(
    scheme: str, forward: Callable[..., Any], backward: Callable[..., Any], reference: Callable[..., Any],
    reference_backward: Callable[..., Any], *, weight: Sequence[str] = ("qweight", "scale"),
    keep: Sequence[str] = (),
) -> RegisteredOp:
    """Register `kernel_pytorch::quant_matmul_<scheme>_fwd` (x, *weight, *keep, bias) -> y and `_bwd` (dy,
    *weight, *keep, has_bias) -> (dx, dbias): the weight is frozen, so only x and bias get gradients.

    Args:
        scheme: "int8", "int4" or "fp8"; forward, backward: its launchers; reference, reference_backward:
            reference/quant_matmul.py's math for it.
        weight: the weight's tensors, saved for the backward; keep: its non-tensor arguments (int4's
            group_size), kept for the backward.
    """
    return register_op(
        f"quant_matmul_{scheme}",
        Impl(forward, reference, "reference", outputs=("y",)),
        Impl(backward, reference_backward, "reference", outputs=("dx", "dbias")),
        differentiable=("y",),
        save=weight,
        keep=keep,
        present=("bias",),
        grads={"x": "dx", "bias": "dbias"},
    )
