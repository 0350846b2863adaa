"""Activation family: gated activations (SwiGLU, GEGLU; split and packed layouts) and bias + activation.

Each function validates its arguments once (eager only), resolves the backend (functional/_dispatch.py)
and runs the eager launchers, the registered op or the reference. Activations are named as ours
("silu", "gelu", "gelu_tanh", "relu") or as transformers' ACT2FN names ("swish", "gelu_pytorch_tanh").
`gated_act` and `gated_act_packed` take a `gate_multiplier` (Falcon-H1's): act((gate * m).to(dtype)) * up,
applied inside the kernels, forward and backward.

In-place backward (`inplace_backward=True`, eager CUDA only): the backward writes the input gradients
over the saved inputs (d_gate, d_up over gate, up; [d_gate | d_up] over gate_up; dx over x) instead of
allocating them, as Liger-Kernel's SwiGLU always does: two activation-sized buffers less at the
backward's peak for a gated activation (448 against 1344 MiB for 16384 x 14336 bf16). It is opt-in
because it is correct only when nothing reads those inputs after the backward: they are temporaries
of this one call, such as a Linear's output made inside a module's forward (which is how nn/mlp.py
uses it): not leaves the caller keeps, not saved by another autograd node, no other view of their
memory alive. Autograd cannot tell us that through a public interface (what it saves holds the very
tensor the caller may hold too). What it can do, and does here, is refuse silent reuse: the inputs'
version counters are bumped after the write, so a second backward through the same graph
(retain_graph) or another node that saved them raises autograd's "modified by an inplace operation"
error instead of reading gradients. Where the inputs' memory cannot take the write (overlapping or
broadcast elements, gate and up sharing elements, rows that do not collapse to one stride), the
gradient goes to new memory as usual. Under torch.compile and on CPU the registered, out-of-place ops
run (Inductor plans the buffers itself), and the flag has no effect.

The in-place variants are plain autograd.Functions over the launchers rather than registered ops: a
registered op may not alias its outputs with its inputs without declaring them mutated, and declaring
the saved inputs mutated would only make compile copy them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch.functional._dispatch import Backend, _records_grad, _resolve, kernels
from kernel_pytorch.reference._act_checks import (
    check_activation,
    check_bias_act,
    check_gated,
    check_gated_packed,
    check_multiplier,
)
from kernel_pytorch.reference.gated_act import gelu_name

_increment_version = torch.autograd.graph.increment_version


def _check_flag(inplace_backward: object) -> None:
    if not isinstance(inplace_backward, bool):
        raise TypeError(f"inplace_backward must be a bool (got {type(inplace_backward).__name__})")


def _rows(t: Tensor) -> tuple[int, int, int, int] | None:
    """(rows, cols, row stride, column stride) of t seen as rows of its last dim without a copy."""
    if t.dim() == 1:
        return 1, t.shape[0], t.shape[0], t.stride(0)
    try:
        v = t.view(-1, t.shape[-1])
    except RuntimeError:
        return None
    return v.shape[0], v.shape[1], v.stride(0), v.stride(1)


def _distinct_rows(t: Tensor) -> tuple[int, int, int] | None:
    """(rows, cols, row stride) where t's elements are distinct addresses in unit-stride rows, else None."""
    r = _rows(t)
    if r is None:
        return None
    rows, cols, sr, sc = r
    if sc != 1 and cols > 1:
        return None
    if rows > 1 and sr < cols:
        return None
    return rows, cols, sr


def _writable_in_place(*ts: Tensor) -> bool:
    """Whether each of `ts` can be overwritten element for element by a gradient of its shape: unit-stride
    rows of distinct elements, and no two of them sharing an element (the two halves of one packed
    tensor, say, share none)."""
    spans = []
    for t in ts:
        r = _distinct_rows(t)
        if r is None:
            return False
        rows, cols, sr = r
        start = t.data_ptr()
        spans.append((start, start + ((rows - 1) * sr + cols) * t.element_size(), t, r))
    for i, (a0, a1, a, ra) in enumerate(spans):
        for b0, b1, b, rb in spans[i + 1:]:
            if a1 <= b0 or b1 <= a0:
                continue
            # overlapping spans: disjoint only as interleaved rows of one stride (chunks of one tensor)
            if ra[2] != rb[2] or a.element_size() != b.element_size():
                return False
            shift = abs(b0 - a0) // a.element_size()
            lo, hi = (ra, rb) if a0 <= b0 else (rb, ra)
            if not (lo[1] <= shift and shift + hi[1] <= ra[2]):
                return False
    return True


class _GatedActInPlace(torch.autograd.Function):
    """h = act(gate) * up whose backward writes d_gate, d_up over gate, up (module docstring)."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor, act: str, gate_multiplier: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        ctx.act, ctx.gate_multiplier = act, gate_multiplier
        return kernels().gated_act_fwd(gate, up, act, gate_multiplier, eager=True)

    @staticmethod
    def backward(ctx, dh: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:  # type: ignore[override]
        gate, up = ctx.saved_tensors
        # only an input that takes a gradient is overwritten (a frozen one keeps its values)
        need_gate, need_up = ctx.needs_input_grad[:2]
        d_gate, d_up, _ = kernels().gated_act_bwd(
            dh, gate, up, ctx.act, ctx.gate_multiplier, d_gate=gate if need_gate else None,
            d_up=up if need_up else None, eager=True,
        )
        for t, written in ((gate, need_gate), (up, need_up)):
            if written:
                _increment_version(t)
        return d_gate if need_gate else None, d_up if need_up else None, None, None


class _GatedActPackedInPlace(torch.autograd.Function):
    """The packed layout's: [d_gate | d_up] written over gate_up."""

    @staticmethod
    def forward(ctx, gate_up: Tensor, act: str, gate_multiplier: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(gate_up)
        ctx.act, ctx.gate_multiplier = act, gate_multiplier
        return kernels().gated_act_packed_fwd(gate_up, act, gate_multiplier, eager=True)

    @staticmethod
    def backward(ctx, dh: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (gate_up,) = ctx.saved_tensors
        d, _ = kernels().gated_act_packed_bwd(dh, gate_up, ctx.act, ctx.gate_multiplier, out=gate_up, eager=True)
        _increment_version(gate_up)
        return d, None, None


class _BiasActInPlace(torch.autograd.Function):
    """y = act(x + bias) whose backward writes dx over x."""

    @staticmethod
    def forward(ctx, x: Tensor, bias: Tensor | None, act: str) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, bias)
        ctx.act = act
        return kernels().bias_act_fwd(x, bias, act, eager=True)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor | None, None]:  # type: ignore[override]
        x, bias = ctx.saved_tensors
        need_x = ctx.needs_input_grad[0]
        dx, dbias = kernels().bias_act_bwd(dy, x, bias, ctx.act, out=x if need_x else None, eager=True)
        if need_x:
            _increment_version(x)
        return dx if need_x else None, dbias, None


def gated_act(
    gate: Tensor, up: Tensor, activation: str = "silu", *, gate_multiplier: float = 1.0,
    inplace_backward: bool = False, backend: Backend = "auto",
) -> Tensor:
    """act(gate * m) * up with Hugging Face's rounding (gate * m and the activation each rounded to the
    input dtype, as Falcon-H1's `up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)`; m = 1: Llama's).

    Args:
        gate, up: (..., I) tensors of one shape, dtype (fp32/bf16/fp16 for the kernels) and device, any
            strides.
        activation: "silu", "gelu", "gelu_tanh", "relu" (or transformers' names for them).
        gate_multiplier: m, a finite real number (the kernels take it as fp32, as torch does).
        inplace_backward: write d_gate, d_up over gate, up in the backward (module docstring: only where
            nothing reads gate and up afterwards).
        backend: "auto", "triton" or "reference" (kernel_pytorch.functional's docstring).
    Returns:
        (..., I) tensor of gate's dtype. Only gate and up are saved for the backward.
    """
    act = check_activation(activation)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        check_gated(gate, up)
        _check_flag(inplace_backward)
        gate_multiplier = check_multiplier("gate_multiplier", gate_multiplier)
    path = _resolve(backend, "gated_act", gate, compiling)
    if path == "eager":
        if inplace_backward and _records_grad(gate, up) and _writable_in_place(gate, up):
            return _GatedActInPlace.apply(gate, up, act, gate_multiplier)
        return kernels().gated_act_eager(gate, up, act, gate_multiplier)
    if path == "op":
        return torch.ops.kernel_pytorch.gated_act_fwd(gate, up, act, gate_multiplier)
    return reference.gated_act(gate, up, act, gate_multiplier)


def swiglu(gate: Tensor, up: Tensor, *, inplace_backward: bool = False, backend: Backend = "auto") -> Tensor:
    """silu(gate) * up (Llama, Mistral, Qwen MLPs): `gated_act` with activation="silu"."""
    return gated_act(gate, up, "silu", inplace_backward=inplace_backward, backend=backend)


def geglu(
    gate: Tensor, up: Tensor, approximate: str = "none", *, inplace_backward: bool = False, backend: Backend = "auto"
) -> Tensor:
    """gelu(gate) * up; approximate "none" (exact erf, HF "gelu") or "tanh" (HF "gelu_pytorch_tanh", Gemma)."""
    return gated_act(gate, up, gelu_name(approximate), inplace_backward=inplace_backward, backend=backend)


def gated_act_packed(
    gate_up: Tensor, activation: str = "silu", *, gate_multiplier: float = 1.0, inplace_backward: bool = False,
    backend: Backend = "auto",
) -> Tensor:
    """`gated_act` of the halves of one packed tensor [gate | up], read in place (no copy).

    Args:
        gate_up: (..., 2I) tensor, gate first (as transformers' Phi3MLP chunks its gate_up_proj output).
        activation, gate_multiplier, backend: as in `gated_act`.
        inplace_backward: write [d_gate | d_up] over gate_up in the backward (module docstring).
    Returns:
        (..., I) tensor of gate_up's dtype; its gradient is one (..., 2I) tensor. Only gate_up is saved.
    """
    act = check_activation(activation)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        check_gated_packed(gate_up)
        _check_flag(inplace_backward)
        gate_multiplier = check_multiplier("gate_multiplier", gate_multiplier)
    path = _resolve(backend, "gated_act_packed", gate_up, compiling)
    if path == "eager":
        if inplace_backward and _records_grad(gate_up) and _writable_in_place(gate_up):
            return _GatedActPackedInPlace.apply(gate_up, act, gate_multiplier)
        return kernels().gated_act_packed_eager(gate_up, act, gate_multiplier)
    if path == "op":
        return torch.ops.kernel_pytorch.gated_act_packed_fwd(gate_up, act, gate_multiplier)
    return reference.gated_act_packed(gate_up, act, gate_multiplier)


def swiglu_packed(gate_up: Tensor, *, inplace_backward: bool = False, backend: Backend = "auto") -> Tensor:
    """silu(gate) * up of a packed (..., 2I) [gate | up] tensor (Phi-3's gate_up_proj output)."""
    return gated_act_packed(gate_up, "silu", inplace_backward=inplace_backward, backend=backend)


def geglu_packed(
    gate_up: Tensor, approximate: str = "none", *, inplace_backward: bool = False, backend: Backend = "auto"
) -> Tensor:
    """gelu(gate) * up of a packed (..., 2I) [gate | up] tensor; approximate as in `geglu`."""
    return gated_act_packed(gate_up, gelu_name(approximate), inplace_backward=inplace_backward, backend=backend)


def bias_act(
    x: Tensor, bias: Tensor | None, activation: str, *, inplace_backward: bool = False, backend: Backend = "auto"
) -> Tensor:
    """act(x + bias), the bias added and rounded as a Linear's output would be, then the activation.

    For `Linear -> activation` stacks that keep a bias (GPT-2, ViT, BERT MLPs): run the Linear without
    its bias and hand the bias here, so the add costs no pass over memory of its own.

    Args:
        x: (..., D) tensor (fp32/bf16/fp16 for the kernels), any strides.
        bias: (D,) tensor of x's dtype and device, or None (the activation alone).
        activation: "silu", "gelu", "gelu_tanh", "relu" (or transformers' names for them).
        inplace_backward: write dx over x in the backward (module docstring).
        backend: "auto", "triton" or "reference".
    Returns:
        (..., D) tensor of x's dtype. Only x (and the bias) are saved for the backward.
    """
    act = check_activation(activation)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        check_bias_act(x, bias)
        _check_flag(inplace_backward)
    path = _resolve(backend, "bias_act", x, compiling)
    if path == "eager":
        if inplace_backward and _records_grad(x, bias) and _writable_in_place(x):
            return _BiasActInPlace.apply(x, bias, act)
        return kernels().bias_act_eager(x, bias, act)
    if path == "op":
        return torch.ops.kernel_pytorch.bias_act_fwd(x, bias, act)
    return reference.bias_act(x, bias, act)
