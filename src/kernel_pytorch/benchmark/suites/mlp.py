"""The MLP suite: the gated activations alone (SwiGLU, GEGLU-tanh, packed SwiGLU) and the whole gated MLP.

Providers (suites/providers.py; the runner is suites/runner.py):
    ours          kernel_pytorch.functional.{swiglu, geglu, swiglu_packed, gated_mlp}; backend="triton"
                  on CUDA (on CPU the registered ops' CPU kernels, which are the reference).
    ours-inplace  the activations with inplace_backward=True (gradients written over gate/up: Liger's
                  memory); CUDA only. Its timed calls reuse their inputs, so from the second call on
                  they read the gradients the previous call wrote: the row also shows that the
                  kernels' cost does not depend on the data (docs/performance.md; H100, 2026-11-23).
    eager         the code as Hugging Face transformers writes it (LlamaMLP's `act_fn(gate) * up`,
                  Phi3MLP's chunk, GemmaMLP with gelu_pytorch_tanh; the block as LlamaMLP.forward).
    compile       torch.compile(fullgraph=True, dynamic=False) of that eager code.
    gemms         the block's floor: its nine GEMMs alone (cuBLAS), timed without the correctness gate;
                  the block cannot run faster than this row.
    liger         Liger-Kernel 0.8.5: LigerSiLUMulFunction / LigerGELUMulFunction (in-place backward,
                  as Liger always runs them) and LigerFusedGateUpSiLUMulFunction (packed; its default
                  in_place=False) for the activations, LigerSwiGLUMLP for the block.

Bytes are the minimum each pass must move (E = tokens * I elements, s = element size):
    activations   fwd: read gate, up; write h                        3E s
                  bwd: read dh, gate, up; write d_gate, d_up          5E s
    gated_mlp     fwd: read x, the three weights; write y             (2 T H + 3 H I) s
                  bwd: read dy, x, weights; write dx, weight grads    (3 T H + 6 H I) s
The block is bound by its GEMMs: its FLOPs (6 T H I forward, twice that backward) and % of the
matmul ceiling are the numbers to read; the activations are memory-bound (% of copy).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as TF
from torch import Tensor

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch.benchmark.suites import spec
from kernel_pytorch.benchmark.suites.spec import ExtraProvider, ModulePeer, OpBench, Suite, generator

NAME = "mlp"


def act_shape(tokens: int, inter: int, config: str) -> spec.Shape:
    """An activation problem: `tokens` rows of `inter` (the MLP's intermediate size) features."""
    return spec.Shape.of(config, tokens=tokens, inter=inter)


def block_shape(tokens: int, hidden: int, inter: int, config: str) -> spec.Shape:
    """A whole-MLP problem: `tokens` rows, hidden size, intermediate size."""
    return spec.Shape.of(config, tokens=tokens, hidden=hidden, inter=inter)


ACT_CUDA_SHAPES = (
    act_shape(16384, 14336, "Llama-3-8B: intermediate 14336, 16384 tokens per step"),
    act_shape(4096, 3072, "Qwen3-0.6B-like: intermediate 3072, 4096 tokens"),
    act_shape(4096, 1024, "launch-bound: 4096 tokens x 1024"),
)
ACT_CPU_SHAPES = (act_shape(64, 512, "CPU smoke: 64 tokens x 512"),)
ACT_QUICK = {"cuda": ACT_CUDA_SHAPES[2], "cpu": act_shape(16, 256, "CPU smoke: 16 tokens x 256")}

BLOCK_CUDA_SHAPES = (
    block_shape(16384, 4096, 14336, "Llama-3-8B MLP: hidden 4096, intermediate 14336, 16384 tokens"),
    block_shape(4096, 1024, 3072, "Qwen3-0.6B MLP: hidden 1024, intermediate 3072, 4096 tokens"),
)
BLOCK_CPU_SHAPES = (block_shape(32, 64, 128, "CPU smoke: 32 tokens, hidden 64, intermediate 128"),)
BLOCK_QUICK = {"cuda": BLOCK_CUDA_SHAPES[1], "cpu": block_shape(8, 32, 64, "CPU smoke: 8 tokens, 32 -> 64")}


# ---- the eager code, as Hugging Face transformers writes it --------------------------------------

def hf_gated(act: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """LlamaMLP's `self.act_fn(self.gate_proj(x)) * self.up_proj(x)` on the projections' outputs."""
    return lambda gate, up: act(gate) * up


def hf_gated_packed(gate_up: Tensor) -> Tensor:
    """Phi3MLP: `gate, up = gate_up.chunk(2, dim=-1); up * silu(gate)`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return up * TF.silu(gate)


def hf_gated_mlp(x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor) -> Tensor:
    """LlamaMLP.forward (no biases): down_proj(silu(gate_proj(x)) * up_proj(x))."""
    return TF.linear(TF.silu(TF.linear(x, gate_weight)) * TF.linear(x, up_weight), down_weight)


def _gelu_tanh(t: Tensor) -> Tensor:
    return TF.gelu(t, approximate="tanh")  # transformers' GELUTanh ("gelu_pytorch_tanh")


# ---- inputs and counts ---------------------------------------------------------------------------

def _act_inputs(packed: bool = False) -> spec.InputFactory:
    """gate, up (tokens, I) or gate_up (tokens, 2I): standard normals, as a projection's outputs are."""

    def make(shape: spec.Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
        draw = generator(device, seed)
        if packed:
            return {"gate_up": draw(shape.tokens, 2 * shape.inter).to(dtype)}
        return {"gate": draw(shape.tokens, shape.inter).to(dtype), "up": draw(shape.tokens, shape.inter).to(dtype)}

    return make


def _block_inputs(shape: spec.Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    """x (tokens, H) and weights scaled as a Linear's initialisation keeps the outputs near unit size."""
    draw = generator(device, seed)
    h, i = shape.hidden, shape.inter
    return {"x": draw(shape.tokens, h).to(dtype), "gate_weight": (draw(i, h) * h ** -0.5).to(dtype),
            "up_weight": (draw(i, h) * h ** -0.5).to(dtype), "down_weight": (draw(h, i) * i ** -0.5).to(dtype)}


def _act_bytes(s: spec.Shape, es: int) -> tuple[int, int]:
    e = s.tokens * s.inter
    return 3 * e * es, 5 * e * es


def _act_flops(s: spec.Shape) -> tuple[int, int]:
    return 6 * s.tokens * s.inter, 12 * s.tokens * s.inter  # nominal: the sigmoid/gelu and products


def _block_bytes(s: spec.Shape, es: int) -> tuple[int, int]:
    th, hi = s.tokens * s.hidden, s.hidden * s.inter
    return (2 * th + 3 * hi) * es, (3 * th + 6 * hi) * es


def _block_flops(s: spec.Shape) -> tuple[int, int]:
    gemm = 2 * s.tokens * s.hidden * s.inter
    return 3 * gemm, 6 * gemm


def _inplace(fn: Callable[..., Tensor]) -> Callable[[torch.device], tuple[Callable[..., Any] | None, str]]:
    """The ours-inplace provider: on CUDA only (elsewhere the flag has no effect: no rows)."""

    def make(device: torch.device) -> tuple[Callable[..., Any] | None, str]:
        if device.type != "cuda":
            return None, ""
        return fn, ("inplace_backward=True: d_gate, d_up written over gate, up; timed calls reuse the "
                    "inputs, so they read the previous call's gradients")

    return make


def _liger_fn(target: str, call: tuple[str, ...]) -> ModulePeer:
    return ModulePeer(target=f"liger_kernel.ops:{target}", init_args=lambda t: (), call=call, function=True,
                      note="Liger's backward writes d_gate, d_up over its inputs (always in place)")


GEMMS_NOTE = ("the floor: the block's nine GEMMs alone (cuBLAS on CUDA), no activation: gate stands in for h "
              "in the down projection and dh for d_gate and d_up")


class _NineGemms(torch.autograd.Function):
    """The gated MLP's GEMMs and nothing else, at the block's shapes: forward gate = x @ Wg.T,
    up = x @ Wu.T, y = gate @ Wd.T (gate in h's place); backward dh = dy @ Wd, dWd = dy.T @ gate,
    dx = dh @ Wg + dh @ Wu, dWg = dh.T @ x, dWu = dh.T @ x (dh in d_gate's and d_up's places). Every
    operand is data of the block's own scale, not a constant (cuBLAS runs faster on constants)."""

    @staticmethod
    def forward(ctx, x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor) -> Tensor:  # noqa: ANN001
        x2 = x.reshape(-1, x.shape[-1])
        gate = x2 @ gate_weight.t()
        x2 @ up_weight.t()  # the up projection's GEMM, timed; its output is not needed
        ctx.save_for_backward(x2, gate, gate_weight, up_weight, down_weight)
        ctx.x_shape = x.shape
        return (gate @ down_weight.t()).view(*x.shape[:-1], down_weight.shape[0])

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # noqa: ANN001
        x2, gate, gate_weight, up_weight, down_weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dh = dy2 @ down_weight
        d_down = dy2.t() @ gate
        dx = dh @ gate_weight
        dx.addmm_(dh, up_weight)
        return dx.view(ctx.x_shape), dh.t() @ x2, dh.t() @ x2, d_down


def _block_gemms(x: Tensor, gate_weight: Tensor, up_weight: Tensor, down_weight: Tensor) -> Tensor:
    """The block's floor (`_NineGemms`); under no_grad its three forward GEMMs."""
    if not torch.is_grad_enabled():
        gate = x @ gate_weight.t()
        x @ up_weight.t()
        return gate @ down_weight.t()
    return _NineGemms.apply(x, gate_weight, up_weight, down_weight)


_ACT = dict(min_bytes=_act_bytes, flops=_act_flops, cuda_shapes=ACT_CUDA_SHAPES, cpu_shapes=ACT_CPU_SHAPES,
            quick_shapes=ACT_QUICK)

SWIGLU = OpBench(
    name="swiglu", make_inputs=_act_inputs(), arg_names=("gate", "up"), grad_names=("gate", "up"), param_names=(),
    out_names=("h",),
    reference=lambda gate, up: reference.gated_act(gate, up, "silu"),
    eager=hf_gated(TF.silu),
    ours=lambda gate, up, *, backend: kpf.swiglu(gate, up, backend=backend),
    liger=_liger_fn("LigerSiLUMulFunction", ("gate", "up")),
    extras=(ExtraProvider("ours-inplace", _inplace(
        lambda gate, up: kpf.swiglu(gate, up, inplace_backward=True, backend="triton"))),),
    **_ACT,
)
GEGLU = OpBench(
    name="geglu_tanh", make_inputs=_act_inputs(), arg_names=("gate", "up"), grad_names=("gate", "up"),
    param_names=(), out_names=("h",),
    reference=lambda gate, up: reference.gated_act(gate, up, "gelu_tanh"),
    eager=hf_gated(_gelu_tanh),
    ours=lambda gate, up, *, backend: kpf.geglu(gate, up, "tanh", backend=backend),
    liger=_liger_fn("LigerGELUMulFunction", ("gate", "up")),
    extras=(ExtraProvider("ours-inplace", _inplace(
        lambda gate, up: kpf.geglu(gate, up, "tanh", inplace_backward=True, backend="triton"))),),
    **_ACT,
)
SWIGLU_PACKED = OpBench(
    name="swiglu_packed", make_inputs=_act_inputs(packed=True), arg_names=("gate_up",), grad_names=("gate_up",),
    param_names=(), out_names=("h",),
    reference=lambda gate_up: reference.gated_act_packed(gate_up, "silu"),
    eager=hf_gated_packed,
    ours=lambda gate_up, *, backend: kpf.swiglu_packed(gate_up, backend=backend),
    liger=ModulePeer(target="liger_kernel.ops:LigerFusedGateUpSiLUMulFunction", init_args=lambda t: (),
                     call=("gate_up",), function=True,
                     note="LigerFusedGateUpSiLUMulFunction with its default in_place=False"),
    extras=(ExtraProvider("ours-inplace", _inplace(
        lambda gate_up: kpf.swiglu_packed(gate_up, inplace_backward=True, backend="triton"))),),
    **_ACT,
)
GATED_MLP = OpBench(
    name="gated_mlp", make_inputs=_block_inputs, arg_names=("x", "gate_weight", "up_weight", "down_weight"),
    grad_names=("x", "gate_weight", "up_weight", "down_weight"),
    param_names=("gate_weight", "up_weight", "down_weight"), out_names=("y",),
    reference=lambda x, gw, uw, dw: reference.gated_mlp(x, gw, uw, dw, "silu"),
    eager=hf_gated_mlp,
    ours=lambda x, gw, uw, dw, *, backend: kpf.gated_mlp(x, gw, uw, dw, "silu", backend=backend),
    liger=ModulePeer(
        target="liger_kernel.transformers.swiglu:LigerSwiGLUMLP",
        init_args=lambda t: (SimpleNamespace(hidden_size=t["x"].shape[-1], intermediate_size=t["up_weight"].shape[0],
                                             hidden_act="silu"),),
        call=("x",), params=("gate_weight", "up_weight", "down_weight"),
        param_paths={"gate_weight": "gate_proj.weight", "up_weight": "up_proj.weight",
                     "down_weight": "down_proj.weight"},
        note="LigerSwiGLUMLP: torch's Linears around LigerSiLUMulFunction"),
    min_bytes=_block_bytes, flops=_block_flops, cuda_shapes=BLOCK_CUDA_SHAPES, cpu_shapes=BLOCK_CPU_SHAPES,
    quick_shapes=BLOCK_QUICK, extras=(ExtraProvider("gemms", lambda device: (_block_gemms, GEMMS_NOTE), floor=True),),
)

SPECS = {s.name: s for s in (SWIGLU, GEGLU, SWIGLU_PACKED, GATED_MLP)}
SUITE = Suite(NAME, tuple(SPECS.values()))

__all__ = ["GATED_MLP", "GEGLU", "NAME", "SPECS", "SUITE", "SWIGLU", "SWIGLU_PACKED", "act_shape", "block_shape",
           "hf_gated", "hf_gated_mlp", "hf_gated_packed"]
