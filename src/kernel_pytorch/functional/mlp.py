"""MLP blocks: the gated MLP (split or packed gate/up projections) and Linear -> activation -> Linear.

gated_mlp(x, ...) = down_proj(act(gate_proj(x)) * up_proj(x)), HF's eager MLP (reference/mlp.py); with
Falcon-H1's multipliers down_proj(act(gate_proj(x) * m_g) * up_proj(x)) * m_d. Every path below applies
m_g inside the gated-activation kernels (forward and backward) and m_d to the down projection's output
(its backward to dy), so the multipliers cost the fused paths none of their savings.

The whole-block path (eager CUDA, recording gradients, x and every parameter of one dtype and device,
no autocast): one autograd.Function runs the projections (cuBLAS, as torch's Linear does) and the
gated-activation kernels, and saves only x and the gate/up projections' outputs (gate_up: one (N, 2I)
buffer; split: two (N, I)). Its backward

    dh = dy @ W_down                                      (N, I), a new buffer
    [d_gate | d_up] written over gate/up, h written over dh      one kernel, no allocation
    dW_down = dy.T @ h;  dx = d_gate @ W_gate + d_up @ W_up;  dW_gate_up = [d_gate | d_up].T @ x

recomputes h instead of keeping it, and writes the activation's gradients over buffers it owns: the
gate/up outputs exist only inside this function (nothing else holds them), and dh is made by the
backward itself. So what lives from forward to backward is x and gate/up alone, where eager keeps
gate, up, act(gate) and h. A large dh is made in column chunks (`dh_column_spans`: at most the "mlp"
tuning config's `dh_chunk_bytes` each, ops/_activations.MlpConfig), each chunk's part of the three
lines above done before the next, so the backward's peak adds at most one chunk to gate/up instead of
a whole (N, I) buffer. A second backward through the same graph raises (the saved buffers' versions
are bumped after the write).

The registered-op path (CPU, and torch.compile anywhere), recording gradients with x and the
parameters of one dtype and device, no autocast: gate/up come from torch's GEMMs (functional/linears.py:
the backward adds up_proj's part of dx to gate_proj's inside the GEMM), and the gated
activation and the down projection are one registered op (`kernel_pytorch::gated_down_fwd`, packed:
`gated_down_packed_fwd`, ops/gated_down.py) whose backward recomputes h in the kernel that computes
d_gate, d_up. Autograd keeps x, gate and up (gate_up) and the weights, not h: under compile the AOT
partitioner sees the op as one node and saves its declared inputs.

Anywhere else (export, autocast, mixed dtypes, inference) the block is composed of torch's Linear and
the gated activation (`functional.gated_act`, registered op under compile and export), whose gate/up
inputs are this call's own temporaries, so its eager backward writes its gradients over them. An
exported program has no backward, so nothing is saved there: it keeps the plain Linear nodes.

bias_act_mlp(x, ...) = fc2(act(fc1(x))) with fc1's bias added by the fused bias + activation (one pass instead
of two; its gradient written over fc1's bias-free output, which this call owns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch.functional._dispatch import (
    Backend,
    _autocast_on,
    _check_float,
    _check_same_device,
    _exporting,
    _fusable,
    _one_mesh,
    _records_grad,
    _resolve,
    kernels,
)
from kernel_pytorch.functional.activation import bias_act, gated_act, gated_act_packed
from kernel_pytorch.functional.linears import shared_input_linears
from kernel_pytorch.reference._act_checks import check_activation, check_multiplier

if TYPE_CHECKING:  # kernel_pytorch.ops imports Triton: loaded on first use (kernels())
    from kernel_pytorch.ops._activations import MlpConfig

_increment_version = torch.autograd.graph.increment_version


class _Act(NamedTuple):
    """The block's non-tensor arguments: the activation and the two multipliers."""

    name: str
    gate_multiplier: float
    down_multiplier: float


def dh_column_spans(
    n_rows: int, inter: int, element_size: int, config: MlpConfig | None = None
) -> list[tuple[int, int]]:
    """The [start, stop) column spans of dh (n_rows, inter) that the backward makes one at a time: one
    span, or column chunks of at most `config.dh_chunk_bytes` (None: the "mlp" config in force;
    ops/_activations.MlpConfig says why)."""
    cfg = config or kernels().tuning.current("mlp")
    chunks = min(cfg.max_dh_chunks, -(-n_rows * inter * element_size // cfg.dh_chunk_bytes))
    width = -(-inter // max(chunks, 1))
    width = -(-width // cfg.dh_chunk_align) * cfg.dh_chunk_align
    if chunks <= 1 or width >= inter:
        return [(0, inter)]
    return [(start, min(start + width, inter)) for start in range(0, inter, width)]


def _chunked_act_backward(k, act: _Act, dy2: Tensor, w_down: Tensor, acts: tuple[Tensor, ...],
                          spans: list[tuple[int, int]], want_h: bool) -> tuple[tuple[Tensor, ...], Tensor | None]:
    """dh span by span (`dh_column_spans`: one span, or column chunks of at most dh_chunk_bytes): d_gate,
    d_up written over gate, up, and dW_down's columns from each span's recomputed h. Returns (the
    activation gradients, as the whole-dh path returns them: (gate_up,) or (gate, up); dW_down or None)."""
    inter = w_down.shape[1]
    gate, up = (acts[0][:, :inter], acts[0][:, inter:]) if len(acts) == 1 else acts
    dw_down = torch.empty_like(w_down) if want_h else None
    for start, stop in spans:
        dh = dy2 @ w_down[:, start:stop]
        g, u = gate[:, start:stop], up[:, start:stop]
        _, _, h = k.gated_act_bwd(dh, g, u, act.name, act.gate_multiplier, d_gate=g, d_up=u, h=dh, with_h=want_h,
                                  eager=True)
        if dw_down is not None:
            torch.mm(dy2.t(), h, out=dw_down[:, start:stop])
        del dh, h
    return acts, dw_down


class _GatedMLPBlock(torch.autograd.Function):
    """The whole-block autograd function (module docstring). Inputs: act (an `_Act`), x, W_down, b_down,
    then (W_gate_up, b_gate_up) for the packed layout or (W_gate, b_gate, W_up, b_up) for the split one."""

    @staticmethod
    def forward(ctx, act: _Act, x: Tensor, w_down: Tensor, b_down: Tensor | None,  # type: ignore[override]
                *in_params: Tensor | None) -> Tensor:
        k = kernels()
        x2 = x.reshape(-1, x.shape[-1])
        weights = in_params[0::2]
        if len(weights) == 1:
            gate_up = F.linear(x2, in_params[0], in_params[1])
            acts: tuple[Tensor, ...] = (gate_up,)
            h = k.gated_act_packed_fwd(gate_up, act.name, act.gate_multiplier, eager=True)
        else:
            acts = (F.linear(x2, in_params[0], in_params[1]), F.linear(x2, in_params[2], in_params[3]))
            h = k.gated_act_fwd(acts[0], acts[1], act.name, act.gate_multiplier, eager=True)
        y = F.linear(h, w_down, b_down)
        if act.down_multiplier != 1.0:  # over y, this call's own: rounded as eager's `y * m`
            y.mul_(act.down_multiplier)
        ctx.save_for_backward(x2, w_down, *acts, *weights)
        ctx.act, ctx.n_acts, ctx.x_shape = act, len(acts), x.shape
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        k = kernels()
        x2, w_down, *rest = ctx.saved_tensors
        acts, weights = rest[: ctx.n_acts], rest[ctx.n_acts:]
        needs = ctx.needs_input_grad  # act, x, W_down, b_down, then weight, bias per input projection
        dy2 = dy.reshape(-1, dy.shape[-1])
        if ctx.act.down_multiplier != 1.0:  # a new buffer: dy is autograd's
            dy2 = dy2 * ctx.act.down_multiplier
        want_h = needs[2]
        n_rows, inter = dy2.shape[0], w_down.shape[1]
        spans = dh_column_spans(n_rows, inter, dy2.element_size())
        if len(spans) == 1 and len(acts) == 1:  # the whole dh at once: the packed kernel reads gate_up as it is
            dh = dy2 @ w_down
            d_gate_up, h = k.gated_act_packed_bwd(dh, acts[0], ctx.act.name, ctx.act.gate_multiplier, out=acts[0], h=dh,
                                                  with_h=want_h, eager=True)
            d_acts: tuple[Tensor, ...] = (d_gate_up,)
            dw_down = dy2.t() @ h if want_h else None
            del dh, h  # before dx and the weight gradients: the backward's peak is gate/up + one (N, I)
        else:  # span by span (one span: the whole dh), gate and up as two column views of their buffers
            d_acts, dw_down = _chunked_act_backward(k, ctx.act, dy2, w_down, acts, spans, want_h)
        for t in acts:
            _increment_version(t)
        db_down = dy2.sum(0) if needs[3] else None
        dx = None
        if needs[1]:
            dx = d_acts[0] @ weights[0]
            for d, w in zip(d_acts[1:], weights[1:]):
                dx.addmm_(d, w)
            dx = dx.view(ctx.x_shape)
        grads: list[Tensor | None] = []
        for i, d in enumerate(d_acts):
            grads.append(d.t() @ x2 if needs[4 + 2 * i] else None)
            grads.append(d.sum(0) if needs[5 + 2 * i] else None)
        return (None, dx, dw_down, db_down, *grads)


def _check_linear(name: str, weight: Tensor, bias: Tensor | None, in_features: int, x: Tensor) -> int:
    """A (out, in_features) weight and an optional (out,) bias on x's device; returns out."""
    _check_float(name, weight)
    if weight.dim() != 2 or weight.shape[1] != in_features:
        raise ValueError(f"{name} must have shape (out_features, {in_features}) (got {tuple(weight.shape)})")
    bias_name = name.replace("weight", "bias")
    if bias is not None:
        _check_float(bias_name, bias)
        if bias.shape != weight.shape[:1]:
            raise ValueError(f"{bias_name} must have shape ({weight.shape[0]},) (got {tuple(bias.shape)})")
    _check_same_device("x", x, **{name: weight, bias_name: bias})
    return weight.shape[0]


def _check_x(x: Tensor) -> None:
    _check_float("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (got a scalar)")


def _gated_args(
    x: Tensor, activation: str, gate_multiplier: float, down_multiplier: float, compiling: bool
) -> tuple[str, float, float]:
    """The gated block's activation name and multipliers; in eager, x and the multipliers are checked and
    the multipliers returned as floats."""
    act = check_activation(activation)
    if compiling:
        return act, gate_multiplier, down_multiplier
    _check_x(x)
    gate_multiplier = check_multiplier("gate_multiplier", gate_multiplier)
    return act, gate_multiplier, check_multiplier("down_multiplier", down_multiplier)


def _down(h: Tensor, down_weight: Tensor, down_bias: Tensor | None, down_multiplier: float) -> Tensor:
    """The composed paths' down projection, times the down multiplier (rounded as eager's `y * m`)."""
    y = F.linear(h, down_weight, down_bias)
    return y if down_multiplier == 1.0 else y * down_multiplier


def gated_mlp(
    x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor, activation: str = "silu", *,
    gate_bias: Tensor | None = None, up_bias: Tensor | None = None, down_bias: Tensor | None = None,
    gate_multiplier: float = 1.0, down_multiplier: float = 1.0, backend: Backend = "auto",
) -> Tensor:
    """The gated MLP block down_proj(act(gate_proj(x) * m_g) * up_proj(x)) * m_d (module docstring for its
    paths).

    Args:
        x: (..., H) input.
        gate_weight, up_weight: (I, H) projections; down_weight: (H_out, I).
        activation: "silu" (SwiGLU), "gelu", "gelu_tanh" (GEGLU), "relu", or transformers' names.
        gate_bias, up_bias: optional (I,); down_bias: optional (H_out,).
        gate_multiplier, down_multiplier: m_g and m_d, finite real numbers (Falcon-H1's mlp_multipliers;
            1.0: Llama's block).
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
    Returns:
        (..., H_out) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    act, gate_multiplier, down_multiplier = _gated_args(x, activation, gate_multiplier, down_multiplier, compiling)
    if not compiling:
        inter = _check_linear("gate_weight", gate_weight, gate_bias, x.shape[-1], x)
        if _check_linear("up_weight", up_weight, up_bias, x.shape[-1], x) != inter:
            raise ValueError(f"up_weight must have gate_weight's shape {tuple(gate_weight.shape)} "
                             f"(got {tuple(up_weight.shape)})")
        _check_linear("down_weight", down_weight, down_bias, inter, x)
    params = (down_weight, down_bias, gate_weight, gate_bias, up_weight, up_bias)
    route = _gated_route(backend, x, params, compiling)
    if route == "block":
        return _GatedMLPBlock.apply(_Act(act, gate_multiplier, down_multiplier), x, *params)
    gate, up = shared_input_linears(x, (gate_weight, up_weight), (gate_bias, up_bias))  # dx: one GEMM sum
    if route == "gated_down":
        return torch.ops.kernel_pytorch.gated_down_fwd(gate, up, down_weight, down_bias, act, gate_multiplier,
                                                       down_multiplier)
    # gate and up are this call's own: their gradient may be written over them
    h = gated_act(gate, up, act, gate_multiplier=gate_multiplier, inplace_backward=True, backend=backend)
    return _down(h, down_weight, down_bias, down_multiplier)


def gated_mlp_packed(
    x: Tensor, gate_up_weight: Tensor, down_weight: Tensor, activation: str = "silu", *,
    gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None, gate_multiplier: float = 1.0,
    down_multiplier: float = 1.0, backend: Backend = "auto",
) -> Tensor:
    """The gated MLP with one gate_up projection (2I, H) = [W_gate; W_up], as Phi-3 stores it.

    Args:
        x: (..., H) input.
        gate_up_weight: (2I, H), gate rows first; down_weight: (H_out, I).
        activation, gate_multiplier, down_multiplier, backend: as in `gated_mlp`.
        gate_up_bias: optional (2I,); down_bias: optional (H_out,).
    Returns:
        (..., H_out) tensor of x's dtype.
    """
    compiling = torch.compiler.is_compiling()
    act, gate_multiplier, down_multiplier = _gated_args(x, activation, gate_multiplier, down_multiplier, compiling)
    if not compiling:
        inter2 = _check_linear("gate_up_weight", gate_up_weight, gate_up_bias, x.shape[-1], x)
        if inter2 % 2:
            raise ValueError(f"gate_up_weight holds [gate; up] rows, so an even number of them (got {inter2})")
        _check_linear("down_weight", down_weight, down_bias, inter2 // 2, x)
    params = (down_weight, down_bias, gate_up_weight, gate_up_bias)
    route = _gated_route(backend, x, params, compiling)
    if route == "block":
        return _GatedMLPBlock.apply(_Act(act, gate_multiplier, down_multiplier), x, *params)
    gate_up = F.linear(x, gate_up_weight, gate_up_bias)
    if route == "gated_down":
        return torch.ops.kernel_pytorch.gated_down_packed_fwd(gate_up, down_weight, down_bias, act, gate_multiplier,
                                                              down_multiplier)
    h = gated_act_packed(gate_up, act, gate_multiplier=gate_multiplier, inplace_backward=True, backend=backend)
    return _down(h, down_weight, down_bias, down_multiplier)


def _gated_route(backend: str, x: Tensor, params: tuple[Tensor | None, ...], compiling: bool) -> str:
    """How a gated MLP call runs: "block" (the eager whole-block function, `_block`), "gated_down" (the
    gated_down op, `_recompute_h`) or "composed" (the projections, then `gated_act` on `backend`)."""
    path = _resolve(backend, "gated_mlp", x, compiling)
    if path == "eager" and _block(x, params):
        return "block"
    if path == "op" and _recompute_h(x, params):
        return "gated_down"
    return "composed"


def _block(x: Tensor, params: tuple[Tensor | None, ...]) -> bool:
    """Whether an eager-path call takes the whole-block function: it records a gradient, and x and
    the parameters share a dtype and device with autocast off (the block runs its GEMMs as given)."""
    return _fusable(x, params)


def _recompute_h(x: Tensor, params: tuple[Tensor | None, ...]) -> bool:
    """Whether an op-path call takes the gated_down op: as `_block` or `_sharded`, and not under torch.export
    (an exported program has no backward to save h for; it keeps the composed Linear nodes)."""
    return (_block(x, params) or _sharded(x, params)) and not _exporting()


def _sharded(x: Tensor, params: tuple[Tensor | None, ...]) -> bool:
    """Whether DTensor x and parameters (`params`' order: down weight and bias, then the gate/up ones) are
    placed as the gated_down op's sharding rule takes the projections' outputs (ops/gated_down.py), gradients
    recorded and autocast off: on each mesh dimension every parameter Replicate with x's rows sharded or
    whole, or, split layout with no down bias, x Replicate, the gate and up weights (and biases) sharded on
    their rows (column-parallel) and the down weight on its columns (row-parallel). Other placements take
    the composed path, where DTensor's own Linear places the data."""
    if not (_records_grad(x, *params) and _one_mesh(x, params) and not _autocast_on(x.device.type)):
        return False
    down_weight, down_bias, *inputs = params
    for i, px in enumerate(x.placements):
        placed = [p.placements[i] for p in params if p is not None]
        if all(p.is_replicate() for p in placed):
            if not (px.is_replicate() or (px.is_shard() and px.dim % x.ndim != x.ndim - 1)):
                return False
        elif not (len(inputs) == 4 and down_bias is None and px.is_replicate() and down_weight.placements[i].is_shard(1)
                  and all(p.placements[i].is_shard(0) for p in inputs if p is not None)):
            return False
    return True


def bias_act_mlp(
    x: Tensor, fc1_weight: Tensor, fc1_bias: Tensor | None, fc2_weight: Tensor, fc2_bias: Tensor | None,
    activation: str, *, backend: Backend = "auto",
) -> Tensor:
    """Linear -> activation -> Linear, fc1's bias added by the fused bias + activation.

    Args:
        x: (..., H) input.
        fc1_weight: (I, H); fc1_bias: (I,) or None; fc2_weight: (H_out, I); fc2_bias: (H_out,) or None.
        activation: "gelu", "gelu_tanh", "silu", "relu", or transformers' names.
        backend: "auto", "triton" or "reference".
    Returns:
        (..., H_out) tensor of x's dtype (of autocast's dtype under autocast).
    """
    act = check_activation(activation)
    if not torch.compiler.is_compiling():
        _check_x(x)
        inter = _check_linear("fc1_weight", fc1_weight, fc1_bias, x.shape[-1], x)
        _check_linear("fc2_weight", fc2_weight, fc2_bias, inter, x)
    z = F.linear(x, fc1_weight)
    if fc1_bias is not None and fc1_bias.dtype != z.dtype:  # autocast: the Linear's output dtype
        fc1_bias = fc1_bias.to(z.dtype)
    # z is this call's own: its gradient may be written over it
    return F.linear(bias_act(z, fc1_bias, act, inplace_backward=True, backend=backend), fc2_weight, fc2_bias)
