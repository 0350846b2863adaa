"""Gated activation kernels (SwiGLU, GEGLU): h = act(gate * m).to(dtype) * up, split or packed layout.

Math (see reference/gated_act.py, the specification), for gate and up (rows, I) and the gate
multiplier m (a float, 1.0 by default; Falcon-H1's):
    z = (gate * m).to(dtype);  a = act(z).to(dtype);  h = (a * up).to(dtype)
    d_up = (dh * a).to(dtype);  d_gate = (dh * up * act'(z) * m).to(dtype)
The multiplier is a runtime fp32 argument (torch rounds a Python float to fp32 for a bf16 or fp32
tensor too), applied to the loaded gate and rounded to the input dtype as `gate_proj(x) * m` is in
eager; with m = 1 both products are exact, so the results are those without a multiplier.
The activation is rounded to the input dtype before the multiply, as Hugging Face's eager MLP does
(act_fn(gate_proj(x)) is a bf16 tensor), and d_up uses that rounded activation, as eager autograd
does: the forward then matches eager bit-for-bit wherever our fp32 activation rounds like torch's
(on the GPU the activation uses libdevice's exp/tanh and IEEE division, torch's own math; see
ops/_activations.MathConfig). Liger-Kernel 0.8.5 rounds silu(gate) the same way in its forward but
forms d_up from the unrounded fp32 silu; its older releases kept fp32 in the forward too.

Layouts. Split: gate and up are two (..., I) tensors with any strides. Packed: one (..., 2I) tensor
[gate | up] (a fused gate_up_proj's output; transformers' Phi3MLP chunks it gate-first), read through
two strided views of itself (no copy), its gradient written as one (..., 2I) tensor.

Kernel design: a memory-bound stream, no reduction. The forward reads gate and up and writes h (3 bytes
per element of I per byte of dtype); the backward reads dh, gate and up and writes d_gate and d_up (5),
recomputing the activation from gate (only the inputs are saved for the backward: nothing of size I
besides them). One program per [BLOCK_R, BLOCK_C] tile of a 1-D grid (ops/_activations.tiles, under
the "mlp" tuning config, ops/_activations.MlpConfig);
operands that are all contiguous are streamed as one flat row, so odd widths mask nothing but the last
tile. Every operand has its own row and column strides; a unit column stride is specialised by Triton
and the loads vectorise to 16 bytes.

Outputs may be given (`out=` / `d_gate=`, `d_up=`, `h=`) and may alias inputs element for element (the
same shape and strides): every output element is stored by the thread that loaded the inputs at that
position, after those loads. Passing gate and up as d_gate and d_up writes the gradient in place, as
Liger-Kernel does: that saves two activation-sized buffers and is safe only when nothing reads gate
or up after the backward (not a leaf the user keeps, not saved by another autograd node, no other view
of them alive). The backward can also recompute h (`with_h`, into a new buffer or into dh's), which a
whole-MLP autograd function needs for the down-projection's weight gradient without saving h.

Host cost per call (the eager path at launch-bound sizes): contiguous operands are passed as they are
(no view is built), so a forward is one allocation and one launch, a backward two allocations (none
when the gradient is written in place) and one launch.

Registered here: the split layout, `kernel_pytorch::gated_act_fwd` / `_bwd`, out of place (a registered
op may not alias its outputs with its inputs without declaring them mutated). The packed layout is
registered in ops/gated_act_packed.py with these launchers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._activations import (
    MlpConfig,
    act_fwd,
    act_fwd_grad,
    as_2d,
    as_2d_out,
    dense,
    precise_math,
    strides,
    tiles,
)
from kernel_pytorch.ops._common.launch import Launcher
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.sharding import all_dims, register_rules, rowwise
from kernel_pytorch.reference.gated_act import gated_act, gated_act_backward


@triton.jit
def _tile_offsets(n_rows, n_cols, col_tiles, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile: int64 row and column indices, and the in-bounds mask."""
    pid = tl.program_id(0)
    rows = (pid // col_tiles).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % col_tiles).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return rows[:, None], cols[None, :], mask


@triton.jit
def _gated_input(g, gate_mul, G):
    """The activation's input: gate * m rounded to the input dtype, as eager's `gate * m` is."""
    return (g * gate_mul).to(G.dtype.element_ty).to(tl.float32)


@triton.jit
def _gated_act_fwd_kernel(
    G, U, H, n_rows, n_cols, col_tiles, gate_mul,
    sg_r, sg_c, su_r, su_c, sh_r, sh_c,
    ACT: tl.constexpr, PRECISE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    r, c, mask = _tile_offsets(n_rows, n_cols, col_tiles, BLOCK_R, BLOCK_C)
    g = tl.load(G + r * sg_r + c * sg_c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + r * su_r + c * su_c, mask=mask, other=0.0).to(tl.float32)
    # round the activation to the input dtype before the multiply, as the eager MLP does
    a = act_fwd(_gated_input(g, gate_mul, G), ACT, PRECISE).to(G.dtype.element_ty).to(tl.float32)
    tl.store(H + r * sh_r + c * sh_c, (a * u).to(H.dtype.element_ty), mask=mask)


@triton.jit
def _gated_act_bwd_kernel(
    DH, G, U, DG, DU, H, n_rows, n_cols, col_tiles, gate_mul,
    sdh_r, sdh_c, sg_r, sg_c, su_r, su_c, sdg_r, sdg_c, sdu_r, sdu_c, sh_r, sh_c,
    ACT: tl.constexpr, PRECISE: tl.constexpr, HAS_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # all loads are issued before any store: outputs may alias inputs element for element
    r, c, mask = _tile_offsets(n_rows, n_cols, col_tiles, BLOCK_R, BLOCK_C)
    dh = tl.load(DH + r * sdh_r + c * sdh_c, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + r * sg_r + c * sg_c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + r * su_r + c * su_c, mask=mask, other=0.0).to(tl.float32)
    a, da = act_fwd_grad(_gated_input(g, gate_mul, G), ACT, PRECISE)
    a = a.to(G.dtype.element_ty).to(tl.float32)
    # the reference's order of the products (the multiplier's chain-rule factor last)
    tl.store(DG + r * sdg_r + c * sdg_c, (dh * u * da * gate_mul).to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + r * sdu_r + c * sdu_c, (dh * a).to(DU.dtype.element_ty), mask=mask)
    if HAS_H:
        tl.store(H + r * sh_r + c * sh_c, (a * u).to(H.dtype.element_ty), mask=mask)


_fwd_kernel = Launcher(_gated_act_fwd_kernel)
_bwd_kernel = Launcher(_gated_act_bwd_kernel)

class Streams(NamedTuple):
    """The operands of one launch as (rows, cols) elements: the tensors in the kernel's order and each
    one's (row, column) strides, flattened in that order."""

    tensors: tuple[Tensor, ...]
    rows: int
    cols: int
    strides: tuple[int, ...]


class Act(NamedTuple):
    """The activation: its name ("silu", "gelu", "gelu_tanh", "relu") and the gate's multiplier."""

    name: str
    gate_mul: float


def _launch_fwd(ops: Streams, act: Act, eager: bool, config: MlpConfig | None) -> None:
    """One launch over (g, u, h)."""
    if ops.rows == 0 or ops.cols == 0:
        return
    t = tiles(ops.rows, ops.cols, config)
    g = ops.tensors[0]
    _fwd_kernel(
        (t.row_tiles * t.col_tiles,), *ops.tensors, ops.rows, ops.cols, t.col_tiles, act.gate_mul, *ops.strides,
        ACT=act.name, PRECISE=precise_math(g), BLOCK_R=t.block_r, BLOCK_C=t.block_c, num_warps=t.num_warps,
        eager=eager,
    )


def _launch_bwd(ops: Streams, has_h: bool, act: Act, eager: bool, config: MlpConfig | None) -> None:
    """One launch over (dh, g, u, dg, du, h); where `has_h` is False dg stands in the h slot, unwritten."""
    if ops.rows == 0 or ops.cols == 0:
        return
    cfg = config or tuning.current("mlp")
    t = tiles(ops.rows, ops.cols, cfg, cfg.gated_bwd_tile_elements)
    g = ops.tensors[1]
    _bwd_kernel(
        (t.row_tiles * t.col_tiles,), *ops.tensors, ops.rows, ops.cols, t.col_tiles, act.gate_mul, *ops.strides,
        ACT=act.name, PRECISE=precise_math(g), HAS_H=has_h, BLOCK_R=t.block_r, BLOCK_C=t.block_c,
        num_warps=t.num_warps, eager=eager,
    )


def _streams(*views: Tensor) -> Streams:
    """(rows, cols) views streamed as they are: their shape is the first one's."""
    return Streams(views, *views[0].shape, tuple(s for v in views for s in strides(v)))


def _flat(n: int, operands: int) -> tuple[int, ...]:
    """Strides of `operands` contiguous tensors streamed as one row of n elements."""
    return (n, 1) * operands


def gated_act_fwd(gate: Tensor, up: Tensor, act: str, gate_multiplier: float = 1.0, *, out: Tensor | None = None,
                  eager: bool = False, config: MlpConfig | None = None) -> Tensor:
    """Launch the forward on the split layout: one allocation (h, unless `out` is given), one launch.

    Args:
        gate, up: (..., I) CUDA tensors (or CPU under TRITON_INTERPRET=1) of one fp32/bf16/fp16 dtype,
            any strides (unchecked: the functional layer validates).
        act: "silu", "gelu", "gelu_tanh" or "relu".
        gate_multiplier: m in act((gate * m).to(dtype)), a finite float.
        out: optional (..., I) buffer for h, any strides.
        eager: launch directly (the eager autograd.Function) rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("mlp")`).
    Returns:
        h of gate's shape and dtype (contiguous unless `out` is given).
    """
    h = torch.empty_like(gate, memory_format=torch.contiguous_format) if out is None else out
    if dense(gate, up, h):
        n = gate.numel()
        _launch_fwd(Streams((gate, up, h), 1, n, _flat(n, 3)), Act(act, gate_multiplier), eager, config)
    else:
        _launch_fwd(_streams(as_2d(gate), as_2d(up), as_2d_out(h, "out")), Act(act, gate_multiplier), eager, config)
    return h


def gated_act_bwd(
    dh: Tensor, gate: Tensor, up: Tensor, act: str, gate_multiplier: float = 1.0, *,
    d_gate: Tensor | None = None, d_up: Tensor | None = None, h: Tensor | None = None,
    with_h: bool = False, eager: bool = False, config: MlpConfig | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the backward on the split layout: one launch; allocations only for outputs not given.

    Args:
        dh, gate, up: (..., I), one dtype, any strides; act, gate_multiplier: the forward's.
        d_gate, d_up, h: optional output buffers (..., I); each may alias an input element for element
            (e.g. d_gate=gate, d_up=up, h=dh: see the module docstring for when that is safe).
        with_h: also recompute h = act(gate).to(dtype) * up (into `h` if given).
        eager: launch directly rather than through wrap_triton.
        config: the launch config (None: the one in force, `tuning.current("mlp")`).
    Returns:
        (d_gate, d_up, h or None), of gate's shape and dtype.
    """
    if d_gate is None:
        d_gate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if d_up is None:
        d_up = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if not with_h:
        h = None
    elif h is None:
        h = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if dense(dh, gate, up, d_gate, d_up) and (h is None or h.is_contiguous()):
        n = gate.numel()
        ops = Streams((dh, gate, up, d_gate, d_up, h if h is not None else d_gate), 1, n, _flat(n, 6))
    else:
        views = (as_2d(dh), as_2d(gate), as_2d(up), as_2d_out(d_gate, "d_gate"), as_2d_out(d_up, "d_up"))
        ops = _streams(*views, as_2d_out(h, "h") if h is not None else views[3])
    _launch_bwd(ops, h is not None, Act(act, gate_multiplier), eager, config)
    return d_gate, d_up, h


def _halves(t2: Tensor) -> tuple[Tensor, Tensor]:
    half = t2.shape[-1] // 2
    return t2[:, :half], t2[:, half:]




def gated_act_packed_fwd(gate_up: Tensor, act: str, gate_multiplier: float = 1.0, *, out: Tensor | None = None,
                         eager: bool = False, config: MlpConfig | None = None) -> Tensor:
    """Launch the forward on the packed layout: one allocation (h, unless `out` is given), one launch.

    Args:
        gate_up: (..., 2I) tensor [gate | up], any strides.
        act, gate_multiplier, out, eager, config: as in `gated_act_fwd` (out is (..., I)).
    Returns:
        h of shape (..., I) and gate_up's dtype.
    """
    shape = gate_up.shape[:-1] + (gate_up.shape[-1] // 2,)
    h = torch.empty(shape, dtype=gate_up.dtype, device=gate_up.device) if out is None else out
    _launch_fwd(_streams(*_halves(as_2d(gate_up)), as_2d_out(h, "out")), Act(act, gate_multiplier), eager, config)
    return h


def gated_act_packed_bwd(
    dh: Tensor, gate_up: Tensor, act: str, gate_multiplier: float = 1.0, *, out: Tensor | None = None,
    h: Tensor | None = None, with_h: bool = False, eager: bool = False, config: MlpConfig | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Launch the backward on the packed layout: one launch; allocations only for outputs not given.

    Args:
        dh: (..., I); gate_up: (..., 2I) [gate | up]; act, gate_multiplier: the forward's.
        out: optional (..., 2I) buffer for [d_gate | d_up]; may be gate_up itself (in place).
        h, with_h, config: as in `gated_act_bwd`.
    Returns:
        ([d_gate | d_up] of gate_up's shape and dtype, h or None).
    """
    d = torch.empty_like(gate_up, memory_format=torch.contiguous_format) if out is None else out
    if not with_h:
        h = None
    elif h is None:
        h = torch.empty(dh.shape, dtype=gate_up.dtype, device=gate_up.device)
    dg2, du2 = _halves(as_2d_out(d, "out"))
    ops = _streams(as_2d(dh), *_halves(as_2d(gate_up)), dg2, du2, as_2d_out(h, "h") if h is not None else dg2)
    _launch_bwd(ops, h is not None, Act(act, gate_multiplier), eager, config)
    return d, h


def _fwd_reference(gate: Tensor, up: Tensor, act: str, gate_multiplier: float = 1.0) -> Tensor:
    return gated_act(gate, up, act, gate_multiplier).contiguous()


def _bwd_reference(dh: Tensor, gate: Tensor, up: Tensor, act: str,
                   gate_multiplier: float = 1.0) -> tuple[Tensor, Tensor]:
    d_gate, d_up = gated_act_backward(dh, gate, up, act, gate_multiplier)
    return d_gate.contiguous(), d_up.contiguous()


# kernel_pytorch::gated_act_fwd (gate, up, act, gate_multiplier=1.0) -> h and gated_act_bwd (dh, gate, up,
# act, gate_multiplier=1.0) -> (d_gate, d_up), both out of place (the in-place gradient is an eager-only
# variant in functional/activation.py); gated_act_eager(gate, up, act[, gate_multiplier]) -> h,
# differentiable, saving gate and up only
gated_act_fwd_op, gated_act_bwd_op, gated_act_eager = register_op(
    "gated_act",
    Impl(gated_act_fwd, _fwd_reference, "reference", outputs=("h",)),
    Impl(gated_act_bwd, _bwd_reference, "reference", outputs=("d_gate", "d_up")),
    differentiable=("h",),
    save=("gate", "up"),
    keep=("act", "gate_multiplier"),
    grads={"gate": "d_gate", "up": "d_up"},
)

# DTensor (ops/_common/sharding.py): elementwise, so gate and up sharded alike on any dim, the intermediate dim
# (Shard(-1), column-parallel gate/up projections) included
register_rules(
    "gated_act",
    rowwise(("gate", "up"), ("rows",), all_dims),
    rowwise(("dh", "gate", "up"), ("rows", "rows"), all_dims),
    "gate and up are sharded alike (Shard(d), any d)",
)
