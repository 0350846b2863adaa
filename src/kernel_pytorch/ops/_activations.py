"""Shared pieces of the elementwise activation kernels (ops/gated_act.py, ops/bias_act.py): the
activations and their derivatives as Triton device functions, the 2-D views the kernels address, the
tile choice, and two tuning configs: "mlp" (`MlpConfig`, the MLP kernels' tiles and schedules) and
"math" (`MathConfig`, which fp32 math the activation and cross-entropy kernels use). No op math beyond
the activations themselves.

The activations follow reference/_activations.py in fp32, in torch's own order of operations. Without
libdevice (Triton's interpreter has none) GELU-tanh uses 1 + tanh(u) = 2 * sigmoid(2u) and
1 - tanh(u)^2 = 4 * sigmoid(2u) * (1 - sigmoid(2u)), exact in real arithmetic and free of the
cancellation of the tanh form for large negative u.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:  # triton >= 3.0: the backend-dispatching libdevice
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older layouts: the CUDA one, or none (MathConfig.precise off)
    try:
        from triton.language.extra.cuda import libdevice
    except ImportError:
        libdevice = None

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import next_power_of_2

# constexpr: Triton compiles a kernel that reads a plain Python global as an error (the interpreter
# does not check)
_SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1 / sqrt(2)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1 / sqrt(2 pi)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_KAPPA = tl.constexpr(0.044715)


@dataclass(frozen=True)
class MathConfig:
    """Which fp32 math the activation and cross-entropy kernels use on the GPU (the "math" family).

    Fields:
        precise: exp, log and tanh from libdevice (the CUDA math library torch's kernels call) and
            IEEE-rounded divisions (Triton's `/` is approximate), so the fp32 result, hence its rounding
            to bf16, agrees with eager torch more often. On by default where libdevice exists (the
            interpreter has none and uses the tanh-free forms).
        precise_bf16: the precise forms for bf16 tensors too. Off: a bf16 result keeps 8 bits, so a
            2-ulp fp32 error changes its rounding about once in 2^15 elements, while on an H200 the
            precise forms made the SwiGLU forward compute-bound: 89.0% of the copy bandwidth against
            100.4% with the fast forms, the backward level at ~99%
            (benchmarks/results/probes/mlp/probe_mlp_sweep_h200.log, 16384 x 14336).
    """

    precise: bool = libdevice is not None
    precise_bf16: bool = False


tuning.register("math", MathConfig())


def precise_math(t: torch.Tensor, config: MathConfig | None = None) -> bool:
    """The PRECISE constexpr for a launch on t (its device and dtype) under `config` (None: the one in
    force, `tuning.current("math")`)."""
    cfg = config or tuning.current("math")
    return cfg.precise and t.is_cuda and (cfg.precise_bf16 or t.dtype != torch.bfloat16)


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _recip(x, PRECISE: tl.constexpr):
    # 1 / x, IEEE-rounded with PRECISE (a scalar per program: the rounding, not the speed, matters)
    if PRECISE:
        return tl.div_rn(1.0, x)
    else:
        return 1.0 / x


@triton.jit
def _log(x, PRECISE: tl.constexpr):
    # Triton's log is lg2.approx times ln 2 (about 2 ulp); libdevice's rounds as torch's does
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _div(a, b, PRECISE: tl.constexpr):
    """a / b in fp32 for b >= 1 or b = +inf (the activations' denominators); IEEE-rounded with PRECISE.

    Triton's `/` is the approximate div.full.f32 (2 ulp); torch's kernels divide IEEE-rounded. PTX's
    IEEE division (div.rn.f32, which tl.div_rn emits) checks its operands and calls a software slow
    path for those whose quotient may be denormal and for infinite or NaN ones: a cost that depends on
    the data. On an H100 (2026-11-23) the in-place backward, timed on inputs that earlier iterations had
    overwritten with gradients (by then mostly zeros, denormals and NaN), ran at half the bandwidth of the
    same kernel on fresh inputs, while Liger's approximate sigmoid kept full speed; that slow path is
    the one data-dependent cost in these kernels (docs/performance.md). So the IEEE quotient is formed
    here without branches, as the fast path of CUDA's own division does: the approximate reciprocal,
    one Newton step on it and two on the quotient, with selects where a step would turn an exact answer
    into NaN (b = inf, whose quotient is +-0; a = +-inf) or lose the sign of a zero.
    """
    if PRECISE:
        r = 1.0 / b
        e = tl.fma(-b, r, 1.0)
        r = tl.where(e == e, tl.fma(e, r, r), r)  # e is NaN only for b = inf, where r = 0 is exact
        q = a * r
        rem = tl.fma(-b, q, a)  # exact; 0 where q is, NaN where a or b is infinite (q is the answer)
        q = tl.where((rem == rem) & (rem != 0.0), tl.fma(rem, r, q), q)
        rem = tl.fma(-b, q, a)
        return tl.where((rem == rem) & (rem != 0.0), tl.fma(rem, r, q), q)
    else:
        return a / b


@triton.jit
def act_fwd(z, ACT: tl.constexpr, PRECISE: tl.constexpr):
    """act(z) for fp32 z; ACT one of "silu", "gelu", "gelu_tanh", "relu"."""
    if ACT == "silu":
        # torch's form, z / (1 + exp(-z)): -0.0 (not NaN) where exp overflows
        return _div(z, 1.0 + _exp(-z, PRECISE), PRECISE)
    elif ACT == "gelu":
        return z * 0.5 * (1.0 + tl.erf(z * _SQRT1_2))
    elif ACT == "gelu_tanh":
        u = _SQRT_2_OVER_PI * (z + _KAPPA * (z * z * z))  # torch's order: x_cube first
        if PRECISE:
            return z * 0.5 * (1.0 + libdevice.tanh(u))
        else:
            return z / (1.0 + tl.exp(-2.0 * u))
    else:
        # NaN passes through as in torch.relu (NaN < 0 is false)
        return tl.where(z < 0.0, 0.0, z)


@triton.jit
def act_fwd_grad(z, ACT: tl.constexpr, PRECISE: tl.constexpr):
    """(act(z), act'(z)) for fp32 z, act(z) computed exactly as `act_fwd` does."""
    if ACT == "silu":
        e = 1.0 + _exp(-z, PRECISE)
        # act(z) divides exactly as the forward does (the backward's recomputed h and d_up see the same
        # rounded activation); sigmoid only feeds the derivative, where 2 ulp do not matter
        s = 1.0 / e
        return _div(z, e, PRECISE), s * (1.0 + z * (1.0 - s))
    elif ACT == "gelu":
        cdf = 1.0 + tl.erf(z * _SQRT1_2)
        return z * 0.5 * cdf, 0.5 * cdf + z * _exp(-0.5 * z * z, PRECISE) * _INV_SQRT_2PI
    elif ACT == "gelu_tanh":
        u = _SQRT_2_OVER_PI * (z + _KAPPA * (z * z * z))  # torch's order: x_cube first
        d_u = _SQRT_2_OVER_PI * (1.0 + 3.0 * _KAPPA * z * z)
        if PRECISE:
            t = libdevice.tanh(u)
            return z * 0.5 * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * d_u
        else:
            e = 1.0 + tl.exp(-2.0 * u)
            s = 1.0 / e  # (1 + tanh(u)) / 2
            return z / e, s + 2.0 * z * s * (1.0 - s) * d_u
    else:
        return tl.where(z < 0.0, 0.0, z), tl.where(z > 0.0, 1.0, 0.0)


def as_2d(t: torch.Tensor) -> torch.Tensor:
    """View t (..., D) as (rows, D) with any strides; copies only when the leading dims do not collapse
    into one stride (a permuted 3-D tensor, say)."""
    if t.dim() == 1:
        return t.unsqueeze(0)
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t.reshape(-1, t.shape[-1])


def as_2d_out(t: torch.Tensor, name: str) -> torch.Tensor:
    """`as_2d` for an output buffer: a view or an error, never a copy (the kernel's writes would be lost)."""
    try:
        return t.unsqueeze(0) if t.dim() == 1 else t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name} must be viewable as (rows, {t.shape[-1]}) without a copy "
                         f"(got shape {tuple(t.shape)}, strides {t.stride()})") from None


def strides(t2d: torch.Tensor) -> tuple[int, int]:
    """(row stride, column stride) of a 2-D view; a single row or column gets the dense stride, so
    Triton specialises a unit column stride and vectorises."""
    rows, cols = t2d.shape
    sr, sc = t2d.stride()
    return (sr if rows > 1 else cols), (sc if cols > 1 else 1)


def dense(*ts: torch.Tensor) -> bool:
    """Whether every tensor is contiguous: the kernels then stream each as one flat row of numel
    elements (no masked columns at odd widths, and no view to build: the kernel needs the pointer)."""
    for t in ts:
        if not t.is_contiguous():
            return False
    return True


@dataclass(frozen=True)
class MlpConfig:
    """The MLP kernels' launch knobs (the "mlp" family: gated activation, gated down projection, bias +
    activation). Sweeps: benchmarks/probes/probe_mlp.py --sweep.

    Fields:
        tile_elements, elements_per_thread: elements per program tile and per thread of the forward
            passes: 4096-element tiles at 16 elements per thread are 8 warps, two 16-byte vectors per
            thread per bf16 stream. In the H200 sweep (benchmarks/results/probes/mlp/
            probe_mlp_sweep_h200.log, 16384 x 14336 bf16) the forward ran at 100.3-101.8% of copy with
            every tile, warp and column-block variant tried: on the ceiling with any of them.
        max_block_c, min_block_c: the widest column block (wider rows take several) and the narrowest
            one tried for a wide row. A row of 14336 (Llama-3-8B's intermediate size) splits into
            2048-wide blocks with no masked column.
        unhinted_size: the size a symbolic dim without a hint (data-dependent) is tiled for.
        gated_bwd_tile_elements: elements per tile of the gated activation's backward, which streams
            five operands to the forward's three. H200 sweep, flat tiles, 16384 x 14336 bf16, % of
            copy with 2048-element tiles (4 warps) against 4096 (8 warps), in the same run
            (benchmarks/results/probes/mlp/probe_mlp_sweep_h200.log): SwiGLU 100.8 vs 99.5, packed 100.9
            vs 101.1, GEGLU-tanh 100.6 vs 101.2, packed 100.7 vs 98.6; 4096 x 3072 SwiGLU 81.4 vs
            79.7. The sweep before it (git history of that log) had 2048 ahead in all four backward rows.
        bias_bwd_tile_elements: elements per tile of the bias + activation backward ([rows, block_c]
            per stream).
        bias_bwd_programs_per_sm: that backward's programs per SM (column blocks x row groups): enough
            loads in flight per SM with the in-loop prefetch, few enough partial rows. These two have
            no committed result; benchmarks/probes/probe_mlp.py --bias prints the variants beside them.
        dh_chunk_bytes, max_dh_chunks, dh_chunk_align: the whole-block gated MLP's backward
            (functional/mlp.py) makes dh = dy @ W_down (N, I), the one buffer it adds to what the forward
            saved (gate/up, 2 N I elements), in column chunks of at most `dh_chunk_bytes` once it is
            larger (at most `max_dh_chunks`, widths a multiple of `dh_chunk_align` columns): each
            chunk's activation gradient is written over the gate/up columns it covers and W_down's
            gradient over its columns, so every GEMM still reduces over all N rows (no partial sums
            rounded into a low-precision gradient). At Llama-3-8B's MLP (16384 tokens x 14336, bf16)
            that is 4 chunks of 112 MiB in place of one 448 MiB buffer.
    """

    tile_elements: int = 4096
    elements_per_thread: int = 16
    max_block_c: int = 4096
    min_block_c: int = 512
    unhinted_size: int = 8192
    gated_bwd_tile_elements: int = 2048
    bias_bwd_tile_elements: int = 2048
    bias_bwd_programs_per_sm: int = 4
    dh_chunk_bytes: int = 128 << 20
    max_dh_chunks: int = 8
    dh_chunk_align: int = 128


tuning.register("mlp", MlpConfig())


@dataclass(frozen=True)
class Tiles:
    """A [block_r, block_c] tile per program; `row_tiles` x `col_tiles` tiles cover the tensor."""

    block_r: int
    block_c: int
    row_tiles: int
    col_tiles: int
    num_warps: int


def tiles(n_rows: int | torch.SymInt, n_cols: int | torch.SymInt, config: MlpConfig | None = None,
          tile: int | None = None) -> Tiles:
    """Tile shape for an elementwise pass over (n_rows, n_cols) under `config` (None: the one in
    force, `tuning.current("mlp")`); `tile` elements per tile (default `config.tile_elements`).

    Symbolic sizes (torch.export, AOTInductor, compile with dynamic shapes trace the launch with
    SymInts): the block and warps are chosen from the sizes' hints, since they are compile-time
    constants of the kernel, and the tile counts stay symbolic so the grid follows the real size. Any
    block is correct at any size: the kernels mask their last row and column tiles."""
    cfg = config or tuning.current("mlp")
    if isinstance(n_rows, torch.SymInt) or isinstance(n_cols, torch.SymInt):
        t = _tiles(_hint(n_rows, cfg), _hint(n_cols, cfg), tile, cfg)
        return Tiles(t.block_r, t.block_c, (n_rows + t.block_r - 1) // t.block_r,
                     (n_cols + t.block_c - 1) // t.block_c, t.num_warps)
    return _tiles(n_rows, n_cols, tile, cfg)


def _hint(n: int | torch.SymInt, cfg: MlpConfig) -> int:
    """A size's concrete value: itself, or a SymInt's hint (the example input's size)."""
    if not isinstance(n, torch.SymInt):
        return int(n)
    node = n.node
    return int(node.hint) if node.has_hint() else cfg.unhinted_size


@functools.lru_cache(maxsize=1024)
def _tiles(n_rows: int, n_cols: int, tile: int | None, cfg: MlpConfig) -> Tiles:
    # memoised (keyed on the config too): it runs on every eager call
    tile = tile or cfg.tile_elements
    max_c = min(cfg.max_block_c, tile)
    if n_cols <= max_c:
        block_c = next_power_of_2(n_cols)
    else:
        # the widest power-of-two block with the fewest masked columns in the row's last block
        candidates = [c for c in (max_c >> i for i in range(8)) if c >= min(cfg.min_block_c, max_c)]
        block_c = min(candidates, key=lambda c: (triton.cdiv(n_cols, c) * c - n_cols, -c))
    block_r = max(1, min(next_power_of_2(n_rows), tile // block_c))
    warps = next_power_of_2(min(8, max(1, block_r * block_c // (32 * cfg.elements_per_thread))))
    return Tiles(block_r, block_c, triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c), warps)
