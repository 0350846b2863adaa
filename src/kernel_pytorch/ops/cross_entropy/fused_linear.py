"""Fused linear + cross-entropy: loss = CE(x @ W.T (+ b), target) without ever holding all the logits.
The chunked algorithm (fused_linear_register.py registers it as `kernel_pytorch::fused_linear_cross_entropy_*`).

Shapes: x (..., H) -> N rows; weight W (V, H) of x's dtype; bias b (V,); target (...) -> N.
Math: reference/fused_linear_cross_entropy.py; cross-entropy options as in reference/cross_entropy.py.

Forward ("mean"/"sum"; it computes the gradients, the backward only scales them):
    stats = cross_entropy_stats(target)            the means' denominators, once for all chunks, no sync
    for each chunk of C rows (`chunk_rows`):
        logits = x_c @ W.T (+ b)                   cuBLAS, into one preallocated (C, V) buffer
        cross-entropy forward kernel               loss rows, lse, and the gradient over the logits
        grad_x[c] = logits @ W                     written straight into grad_x's rows
        grad_W (+)= logits.T @ x_c                 the first chunk writes, the others accumulate
        grad_b += column sums of logits            fp32
    Without label smoothing, z-loss or a bias gradient, the cross-entropy step is the one-read kernel
    (one_read.py): it writes q = exp(z - m) - D onehot(t) over the logits, the rows'
    factors s = r w[t] / D and s x_c; then grad_x[c] = q @ W, grad_W (+)= q.T @ (s x_c), and after the
    last chunk grad_x's rows are multiplied by s (one pass over grad_x). The two-pass kernel reads each
    row's logits twice; at 128K columns the second read misses L2.
    grad_x's rows are an out= GEMM. grad_W goes through ops/_common/gemm_into's registered op when traced:
    an out= accumulation would be traced as an out-of-place addmm, which copies the (V, H) accumulator
    for every chunk after the first (one more accumulator alive, and a copy per chunk); the op declares
    its mutation and Inductor keeps it in place. (grad_x's row views are not given to that op: with
    them a compiled step once faulted on the H100, torch 2.11; docs/performance.md.)
Backward: each gradient times the 0-d upstream gradient (ops/_common/scale.scale_grad_: nothing when it
is 1; under compile ops/_common/scale.scaled_grad, which Inductor writes over the saved gradient).
reduction "none": the forward computes loss and lse only (each row's upstream gradient is not known
yet); `fused_linear_cross_entropy_bwd` recomputes each chunk's logits, runs the cross-entropy backward
kernel with the rows' upstream gradients in place, then the two gradient GEMMs: four GEMMs in all
against three, and no more memory than the forward.

grad_W accumulates in W's dtype by default (cuBLAS's fp32 math within each chunk's product, one
rounding per chunk: C rows per rounding instead of N), or in an fp32 buffer (`grad_w_fp32`: V * H * 4
more bytes, one rounding at the end). Each chunk's update reads and writes the accumulator: 2 V H s
bytes for 2 C V H flops, C / s flops per byte, so on an H100 (~800 TFLOP/s, ~3 TB/s: ~270 flops per
byte) chunks under about 270 s rows (540 in bf16, 1080 in fp32 mode) leave that GEMM memory-bound.
Memory beyond inputs and outputs is the (C, V) buffer, plus the fp32 accumulator in fp32 mode (and,
where torch cannot accumulate into fp32 in place, an fp32 product per chunk: see
`fp32_accumulate_in_place`). A tied weight (the
input embedding) is only read here; adding grad_W to its other gradient is autograd's job.

Token scales (N,) multiply each row's loss and gradient in the cross-entropy kernels (in the one-read
kernel, its factor s); with `argmax` those kernels also return each row's argmax (`pred`) from the pass
over the chunk's logits, which are never all held.

Chunk sizes and the one-read switch: config.FusedLinearCrossEntropyConfig (tuning family
"fused_linear_cross_entropy").
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.gemm_into import gemm_into
from kernel_pytorch.ops._common.row_view import contiguous_rows
from kernel_pytorch.ops._common.scale import scale_grad_
from kernel_pytorch.ops.cross_entropy import one_read
from kernel_pytorch.ops.cross_entropy.config import FusedLinearCrossEntropyConfig
from kernel_pytorch.ops.cross_entropy.launch import RowInputs, RowOutputs, launch_bwd, launch_fwd, row_inputs
from kernel_pytorch.reference.cross_entropy import DEFAULT_OPTIONS, CrossEntropyOptions


class FusedLinearCrossEntropyForward(NamedTuple):
    """What `fused_linear_cross_entropy_fwd` returns."""

    loss: Tensor  # 0-d fp32, or target's shape ("none")
    lse: Tensor  # (N,) fp32
    grad_x: Tensor | None  # x's shape and dtype, for an upstream gradient of 1 (None for "none")
    grad_w: Tensor | None  # (V, H), W's dtype
    grad_b: Tensor | None  # (V,), bias's dtype
    stats: Tensor | None  # (3,) fp32 cross_entropy_stats where needed
    pred: Tensor | None = None  # (N,) int64 argmax of each row, -1 on ignored rows (argmax=True)


def free_device_bytes(device: torch.device) -> int | None:
    """Memory an allocation on `device` can still get: the driver's free memory plus what PyTorch's
    caching allocator holds unused. None off CUDA (no limit applied)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def chunk_rows(n_rows: int, vocab: int, element_size: int, *, max_bytes: int | None = None,
               free_bytes: int | None = None, config: FusedLinearCrossEntropyConfig | None = None) -> int:
    """Rows per chunk: the most whole tiles of config.row_align rows whose (rows, vocab) logits buffer
    fits in `max_bytes` (default: config.chunk_bytes, or config.min_rows rows where that is more) and in
    config.free_fraction of `free_bytes` (when given); at least one tile, at most n_rows.

    Args:
        n_rows: tokens; vocab: V; element_size: bytes per logit (x's dtype).
        max_bytes: cap on the buffer (no floor then); free_bytes: the device's free memory
            (`free_device_bytes`); config: the one in force by default.
    """
    config = config or tuning.current("fused_linear_cross_entropy")
    row_bytes = vocab * element_size
    if max_bytes is None:
        rows = max(config.chunk_bytes // row_bytes, config.min_rows)
    else:
        rows = max_bytes // row_bytes
    if free_bytes is not None:
        rows = min(rows, int(free_bytes * config.free_fraction) // row_bytes)
    rows = rows // config.row_align * config.row_align
    return max(1, min(max(rows, config.row_align), n_rows))


class FusedLinearArgs(NamedTuple):
    """The fused loss's inputs beside x and the options (the ops' Python side takes them as one)."""

    weight: Tensor  # (V, H), x's dtype
    target: Tensor  # (...) class indices, one per row of x
    bias: Tensor | None = None  # (V,)
    ce_weight: Tensor | None = None  # (V,) class weights of the cross-entropy
    token_scale: Tensor | None = None  # target's shape, each row's factor


class _Grads:
    """The gradient buffers of one pass and the per-chunk GEMMs that fill them."""

    def __init__(self, x2: Tensor, weight: Tensor, bias: Tensor | None, needs: tuple[bool, bool, bool],
                 grad_w_fp32: bool, eager: bool) -> None:
        need_x, need_w, need_b = needs
        self.weight, self.bias, self.eager = weight, bias, eager
        self.x = torch.empty_like(x2) if need_x else None
        acc_dtype = torch.float32 if grad_w_fp32 else weight.dtype
        self.w = torch.empty(weight.shape, dtype=acc_dtype, device=weight.device) if need_w else None
        self.b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) \
            if need_b and bias is not None else None

    def add_chunk(self, g: Tensor, x_c: Tensor, start: int, first: bool) -> None:
        """Gradients from one chunk's logits gradient g (C, V) and inputs x_c (C, H)."""
        if self.x is not None:  # an out= GEMM on a row view (module docstring)
            torch.mm(g, self.weight, out=self.x[start:start + g.shape[0]])
        if self.w is not None:  # traced: the registered op, which stays in place (module docstring)
            gemm_into(self.w, g.t(), x_c, not first, eager=self.eager)
        if self.b is not None:
            self.b += g.sum(0, dtype=torch.float32)

    def result(self, x_shape: torch.Size) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        if self.w is not None and x_shape.numel() == 0:  # no chunk ran: nothing wrote the accumulator
            self.w.zero_()
        gx = self.x.view(x_shape) if self.x is not None else None
        gw = self.w.to(self.weight.dtype) if self.w is not None else None
        gb = self.b.to(self.bias.dtype) if self.b is not None else None
        return gx, gw, gb


def _logits_into(buf: Tensor, x_c: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x_c @ W.T (+ b) into the first x_c.shape[0] rows of the chunk buffer."""
    out = buf[: x_c.shape[0]]
    if bias is not None:
        torch.addmm(bias, x_c, weight.t(), out=out)
    else:
        torch.mm(x_c, weight.t(), out=out)
    return out


def _setup(x: Tensor, a: FusedLinearArgs, options: CrossEntropyOptions, chunk: int | None,
           eager: bool) -> tuple[Tensor, RowInputs, Tensor, int]:
    """(x as (N, H) rows, the kernels' row inputs, the chunk buffer, rows per chunk)."""
    x2 = x.reshape(-1, x.shape[-1])
    if a.target.numel() != x2.shape[0]:
        raise ValueError(f"target has {a.target.numel()} elements for {x2.shape[0]} rows of x")
    n, v = x2.shape[0], a.weight.shape[0]
    inputs = row_inputs(a.target, a.ce_weight, options, v, a.token_scale, eager=eager)
    c = chunk or chunk_rows(n, v, x.element_size(), free_bytes=free_device_bytes(x.device))
    buf = torch.empty((max(1, min(c, n)), v), dtype=x.dtype, device=x.device)
    return x2, inputs, buf, max(1, c)


def fused_linear_cross_entropy_fwd(
    x: Tensor, args: FusedLinearArgs, options: CrossEntropyOptions = DEFAULT_OPTIONS, *,
    needs: tuple[bool, bool, bool] = (True, True, True), chunk: int | None = None, grad_w_fp32: bool = False,
    argmax: bool = False, eager: bool = False,
) -> FusedLinearCrossEntropyForward:
    """Loss and lse, and for "mean"/"sum" the gradients for an upstream gradient of 1, chunk by chunk.

    Args:
        x: (..., H) fp32/bf16/fp16; args: weight, target, bias, class weights and token scales.
        needs: which of (grad_x, grad_w, grad_b) to compute (autograd's needs_input_grad); none are
            computed for reduction "none" (`fused_linear_cross_entropy_bwd` does it).
        chunk: rows per chunk (default `chunk_rows`); grad_w_fp32: accumulate grad_W in fp32.
        argmax: also return each row's argmax (`pred`), taken in the chunk's pass over its logits.
        eager: launch directly rather than through wrap_triton.
    """
    weight, bias = args.weight, args.bias
    x2, inputs, buf, c = _setup(x, args, options, chunk, eager)
    n = x2.shape[0]
    loss_rows = torch.empty(n, dtype=torch.float32, device=x.device)
    pred = torch.empty(n, dtype=torch.int64, device=x.device) if argmax else None
    out = RowOutputs(loss_rows, torch.empty_like(loss_rows), pred)
    with_grad = options.reduction != "none" and any(needs)
    grads = _Grads(x2, weight, bias, needs, grad_w_fp32, eager) if with_grad else None
    one_pass = (with_grad and tuning.current("fused_linear_cross_entropy").one_read
                and one_read.applies(options, grads.b is not None))
    if one_pass:  # the rows' factors s, and s x for grad_W (one_read.py)
        scale = torch.empty_like(loss_rows)
        xs = torch.empty((buf.shape[0], x2.shape[1]), dtype=x.dtype, device=x.device) if needs[1] else None
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c = x2[start:end]
        logits = contiguous_rows(_logits_into(buf, x_c, weight, bias))
        if one_pass:
            xs_c = xs[: end - start] if xs is not None else None
            one_read.launch_one_read(logits, inputs.chunk(start, end), out.chunk(start, end), scale[start:end], x_c,
                                     xs_c, options, eager=eager)
            grads.add_chunk(logits.tensor, xs_c, start, start == 0)
            continue
        launch_fwd(logits, inputs.chunk(start, end), out.chunk(start, end), logits if with_grad else None, options,
                   eager=eager)
        if grads is not None:
            grads.add_chunk(logits.tensor, x_c, start, start == 0)
    if one_pass and grads.x is not None and n:  # grad_x's rows were q @ W: now s times them
        scale_grad_(grads.x, scale, eager=eager)
    loss = loss_rows.view(args.target.shape) if options.reduction == "none" else loss_rows.sum()
    gx, gw, gb = grads.result(x.shape) if grads is not None else (None, None, None)
    return FusedLinearCrossEntropyForward(loss, out.lse, gx, gw, gb, inputs.stats, pred)


def fused_linear_cross_entropy_bwd(
    dloss: Tensor, x: Tensor, args: FusedLinearArgs, lse: Tensor, options: CrossEntropyOptions = DEFAULT_OPTIONS, *,
    needs: tuple[bool, bool, bool] = (True, True, True), chunk: int | None = None, grad_w_fp32: bool = False,
    eager: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients for upstream gradient `dloss`, recomputing each chunk's logits (any reduction;
    needed for "none", where dloss has target's shape).

    Args:
        dloss: target's shape for "none", else 0-d. lse: the forward's (the stats are recomputed on the
            device where needed: one small kernel).
        (the rest as in `fused_linear_cross_entropy_fwd`)
    Returns:
        (grad_x, grad_w, grad_b), None where not needed (or no bias).
    """
    x2, inputs, buf, c = _setup(x, args, options, chunk, eager)
    n = x2.shape[0]
    none = options.reduction == "none"
    dl = dloss.reshape(-1).contiguous() if none else dloss.reshape(1)
    grads = _Grads(x2, args.weight, args.bias, needs, grad_w_fp32, eager)
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c = x2[start:end]
        logits = contiguous_rows(_logits_into(buf, x_c, args.weight, args.bias))
        launch_bwd(dl[start:end] if none else dl, logits, inputs.chunk(start, end), lse[start:end], logits, options,
                   eager=eager)
        grads.add_chunk(logits.tensor, x_c, start, start == 0)
    return grads.result(x.shape)
