"""Weight-only quantized matmul: the quantizers (float weight -> packed parts), the dequantization, and
y = x @ dequant(W).T + bias, the specification of ops/quant_matmul.

For x (..., K) in fp32/bf16/fp16 and an (N, K) weight quantized by one of SCHEMES:

    int8  qweight int8 (N, K), scale fp32 (N,):        W[n, k] = qweight[n, k] * scale[n]
          symmetric: scale = max|W[n]| / 127, qweight = round(W / scale) in [-127, 127]
    fp8   qweight float8_e4m3fn (N, K), scale fp32 (N,): W[n, k] = float(qweight[n, k]) * scale[n]
          scale = max|W[n]| / 448 (e4m3's largest finite value), qweight = W / scale rounded to nearest
    int4  qweight uint8 (N, K / 2), scale (N, G), zero uint8 (N, G), G = ceil(K / group_size):
          W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g],  g = k // group_size,  q in [0, 15]
          asymmetric per group, zero included in the range: lo = min(0, min W), hi = max(0, max W),
          scale = (hi - lo) / 15 rounded up to the scale's dtype, zero = round(-lo / scale) in [0, 15],
          q = round(W / scale) + zero clamped to [0, 15]. K must be even; groups of 32, 64 or 128
          (a last group may be short: K need not be a multiple of the group size).
          Packing (INT4_PACKING), K-major so that a run of K is a run of bytes:
              qweight[n, j] = q[n, 2j] | q[n, 2j + 1] << 4     (the even k in the low nibble)
          scale's dtype is the weight's for bf16/fp16 weights (half the bytes of fp32), fp32 otherwise.

    y = (acc(x) @ acc(dequant(W)).T + acc(bias)).to(x.dtype)     (..., N), acc = fp32 (fp64 for fp64)

Every quantizer rounds each weight to the nearest point of its grid, so |dequant(W) - W| <= step / 2
per weight (`rounding_step`), of variance step^2 / 12 when the weights are spread over many steps.

Backward with respect to x and bias only (the quantized weight is frozen):
    dx = (acc(dy) @ acc(dequant(W))).to(dy.dtype),  dbias = sum of acc(dy) over rows, to dy's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch.reference._math import acc_dtype

SCHEMES = ("int8", "int4", "fp8")
INT4_GROUPS = (32, 64, 128)
INT4_PACKING = "uint8 [N, K/2], K-major; byte j of row n = q[n, 2j] | q[n, 2j+1] << 4 (even k in the low nibble)"
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
INT8_MAX = 127


# --- quantizers ------------------------------------------------------------------------------------


def _rows(weight: Tensor) -> Tensor:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a floating (N, K) matrix, got {weight.dtype} of shape {tuple(weight.shape)}")
    return weight.detach().to(torch.float32)


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(qweight int8 (N, K), scale fp32 (N,)): symmetric, one scale per output row (module docstring)."""
    w = _rows(weight)
    scale = w.abs().amax(dim=1) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: any scale, q = 0
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_fp8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(qweight float8_e4m3fn (N, K), scale fp32 (N,)): each row scaled to an absmax of 448 (e4m3's
    largest finite value), then rounded to nearest (clamped first: e4m3fn has no infinity)."""
    w = _rows(weight)
    scale = w.abs().amax(dim=1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (w / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def int4_scale_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype int4's group scales are stored in: the weight's for bf16/fp16, fp32 otherwise."""
    return weight_dtype if weight_dtype in (torch.bfloat16, torch.float16) else torch.float32


def _round_up(scale: Tensor, dtype: torch.dtype) -> Tensor:
    """scale rounded to `dtype`, upwards: the 16 levels then still span the group's range."""
    low = scale.to(dtype)
    below = low.to(torch.float32) < scale
    return torch.where(below, torch.nextafter(low, torch.full_like(low, float("inf"))), low)


def check_int4(k: int, group_size: int) -> None:
    """ValueError unless group_size is one of INT4_GROUPS and K (the weight's columns) is even."""
    if group_size not in INT4_GROUPS:
        raise ValueError(f"group_size must be one of {INT4_GROUPS}, got {group_size!r}")
    if k % 2:
        raise ValueError(f"int4 packs two values per byte along K: K must be even, got {k}")


def quantize_int4(weight: Tensor, group_size: int = 128,
                  scale_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(qweight uint8 (N, K/2), scale (N, G), zero uint8 (N, G)): asymmetric groups of `group_size`
    along K, two values per byte (module docstring). scale_dtype: default `int4_scale_dtype`."""
    w = _rows(weight)
    n, k = w.shape
    check_int4(k, group_size)
    groups = -(-k // group_size)
    padded = torch.zeros(n, groups * group_size, dtype=torch.float32, device=w.device)
    padded[:, :k] = w  # zeros pad the last group: zero is in every group's range anyway
    g = padded.reshape(n, groups, group_size)
    lo = g.amin(dim=-1).clamp_max(0)
    hi = g.amax(dim=-1).clamp_min(0)
    scale = (hi - lo) / 15
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale = _round_up(scale, scale_dtype or int4_scale_dtype(weight.dtype))
    s = scale.to(torch.float32)
    zero = torch.round(-lo / s).clamp_(0, 15)
    q = (torch.round(g / s[..., None]) + zero[..., None]).clamp_(0, 15).reshape(n, -1)[:, :k].to(torch.uint8)
    return pack_int4(q), scale, zero.to(torch.uint8)


def pack_int4(q: Tensor) -> Tensor:
    """uint8 (N, K) values in [0, 15] -> uint8 (N, K/2), INT4_PACKING."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """uint8 (N, K/2) -> uint8 (N, K) values in [0, 15], the inverse of `pack_int4`."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def quantize(weight: Tensor, scheme: str, group_size: int = 128) -> dict[str, Tensor]:
    """{"qweight", "scale"} (and "zero" for int4) of `weight` under `scheme`; group_size is int4's."""
    if scheme == "int8":
        q, s = quantize_int8(weight)
        return {"qweight": q, "scale": s}
    if scheme == "fp8":
        q, s = quantize_fp8(weight)
        return {"qweight": q, "scale": s}
    if scheme == "int4":
        q, s, z = quantize_int4(weight, group_size)
        return {"qweight": q, "scale": s, "zero": z}
    raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")


def part_shapes(scheme: str, n: int, k: int, group_size: int = 128,
                weight_dtype: torch.dtype = torch.float32) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{part: (shape, dtype)} that `quantize` gives an (n, k) weight of `weight_dtype` under `scheme`."""
    if scheme in ("int8", "fp8"):
        q = torch.int8 if scheme == "int8" else torch.float8_e4m3fn
        return {"qweight": ((n, k), q), "scale": ((n,), torch.float32)}
    if scheme != "int4":
        raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    check_int4(k, group_size)
    groups = -(-k // group_size)
    return {"qweight": ((n, k // 2), torch.uint8), "scale": ((n, groups), int4_scale_dtype(weight_dtype)),
            "zero": ((n, groups), torch.uint8)}


# --- dequantization and the rounding step -----------------------------------------------------------


def dequantize_int8(qweight: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, K) qweight * scale[:, None] in `dtype`."""
    return (qweight.to(dtype) * scale.to(dtype)[:, None]).to(dtype)


def dequantize_fp8(qweight: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, K) float(qweight) * scale[:, None] in `dtype`."""
    return qweight.to(dtype) * scale.to(dtype)[:, None]


def dequantize_int4(qweight: Tensor, scale: Tensor, zero: Tensor, group_size: int,
                    dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, K) (q - zero[g]) * scale[g], g = k // group_size, in `dtype` (K = 2 x qweight's columns)."""
    q = unpack_int4(qweight).to(dtype)
    k = q.shape[1]
    s = scale.to(dtype).repeat_interleave(group_size, dim=1)[:, :k]
    z = zero.to(dtype).repeat_interleave(group_size, dim=1)[:, :k]
    return (q - z) * s


def dequantize(parts: dict[str, Tensor], scheme: str, group_size: int = 128,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """The (N, K) weight `quantize(weight, scheme, group_size)` stands for, in `dtype`."""
    if scheme == "int8":
        return dequantize_int8(parts["qweight"], parts["scale"], dtype)
    if scheme == "fp8":
        return dequantize_fp8(parts["qweight"], parts["scale"], dtype)
    if scheme == "int4":
        return dequantize_int4(parts["qweight"], parts["scale"], parts["zero"], group_size, dtype)
    raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")


def rounding_step(weight: Tensor, scheme: str, group_size: int = 128) -> Tensor:
    """The grid step at each weight of an (N, K) matrix under our `scheme` (fp64), as the quantizers
    above choose it: every weight is rounded to within step / 2, variance step^2 / 12.
      int8: max|W[n]| / 127 per row
      fp8: 2^(e - 3) x scale, e the scaled weight's binary exponent (at least -6: the subnormals' fixed step)
      int4: (max(0, max W) - min(0, min W)) / 15 per group (before the scale's rounding up, which
            widens it by at most one unit in the scale dtype's last place)"""
    w = weight.detach().to(torch.float64).reshape(weight.shape[0], -1)
    if scheme == "int8":
        return (w.abs().amax(dim=1, keepdim=True) / INT8_MAX).expand_as(w)
    if scheme == "fp8":
        scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
        y = (w / scale.clamp_min(torch.finfo(torch.float64).tiny)).abs()
        exponent = torch.floor(torch.log2(y.clamp_min(2.0 ** -9))).clamp_min(-6)
        return torch.exp2(exponent - 3) * scale
    if scheme != "int4":
        raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    n, k = w.shape
    groups = -(-k // group_size)
    padded = torch.zeros(n, groups * group_size, dtype=torch.float64, device=w.device)
    padded[:, :k] = w
    g = padded.reshape(n, groups, group_size)
    step = (g.amax(dim=-1).clamp_min(0) - g.amin(dim=-1).clamp_max(0)) / 15
    return step.repeat_interleave(group_size, dim=1)[:, :k]


# --- the matmuls (the ops' schemas: the first parameter's device picks the kernel) ------------------


def _linear(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    a = acc_dtype(x.dtype)
    y = x.to(a) @ w.to(a).t()
    if bias is not None:
        y = y + bias.to(a)
    return y.to(x.dtype)


def int8_matmul(x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) @ (qweight * scale[:, None]).T + bias -> (..., N) of x's dtype; int8 qweight (N, K),
    fp32 scale (N,), bias (N,) or None."""
    return _linear(x, dequantize_int8(qweight, scale, acc_dtype(x.dtype)), bias)


def fp8_matmul(x: Tensor, qweight: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., K) @ (float(qweight) * scale[:, None]).T + bias -> (..., N) of x's dtype;
    float8_e4m3fn qweight (N, K), fp32 scale (N,)."""
    return _linear(x, dequantize_fp8(qweight, scale, acc_dtype(x.dtype)), bias)


def int4_matmul(x: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor, group_size: int,
                bias: Tensor | None) -> Tensor:
    """x (..., K) @ dequant(W).T + bias -> (..., N) of x's dtype; packed uint8 qweight (N, K/2),
    scale (N, G) and uint8 zero (N, G) per group of `group_size` along K."""
    return _linear(x, dequantize_int4(qweight, scale, zero, group_size, acc_dtype(x.dtype)), bias)


def _linear_backward(dy: Tensor, w: Tensor, has_bias: bool) -> tuple[Tensor, Tensor | None]:
    a = acc_dtype(dy.dtype)
    d = dy.to(a)
    dx = (d @ w.to(a)).to(dy.dtype)
    dbias = d.reshape(-1, d.shape[-1]).sum(0).to(dy.dtype) if has_bias else None
    return dx, dbias


def int8_matmul_backward(dy: Tensor, qweight: Tensor, scale: Tensor, has_bias: bool) -> tuple[Tensor, Tensor | None]:
    """(dx (..., K), dbias (N,) or None) of `int8_matmul` given dy (..., N); both of dy's dtype."""
    return _linear_backward(dy, dequantize_int8(qweight, scale, acc_dtype(dy.dtype)), has_bias)


def fp8_matmul_backward(dy: Tensor, qweight: Tensor, scale: Tensor, has_bias: bool) -> tuple[Tensor, Tensor | None]:
    """(dx, dbias) of `fp8_matmul`, as `int8_matmul_backward`."""
    return _linear_backward(dy, dequantize_fp8(qweight, scale, acc_dtype(dy.dtype)), has_bias)


def int4_matmul_backward(dy: Tensor, qweight: Tensor, scale: Tensor, zero: Tensor, group_size: int,
                         has_bias: bool) -> tuple[Tensor, Tensor | None]:
    """(dx, dbias) of `int4_matmul`, as `int8_matmul_backward`."""
    return _linear_backward(dy, dequantize_int4(qweight, scale, zero, group_size, acc_dtype(dy.dtype)), has_bias)


__all__ = [
    "FP8_MAX",
    "INT4_GROUPS",
    "INT4_PACKING",
    "INT8_MAX",
    "SCHEMES",
    "check_int4",
    "dequantize",
    "dequantize_fp8",
    "dequantize_int4",
    "dequantize_int8",
    "fp8_matmul",
    "fp8_matmul_backward",
    "int4_matmul",
    "int4_matmul_backward",
    "int4_scale_dtype",
    "int8_matmul",
    "int8_matmul_backward",
    "pack_int4",
    "part_shapes",
    "quantize",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8",
    "rounding_step",
    "unpack_int4",
]
