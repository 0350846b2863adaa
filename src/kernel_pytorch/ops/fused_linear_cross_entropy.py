"""Fused linear + cross-entropy: loss = CE(x @ W.T (+ b), target) without ever holding all the logits.
The chunked algorithm, registered as `kernel_pytorch::fused_linear_cross_entropy_fwd` / `_bwd`.

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
    (ops/_cross_entropy_onepass.py): it writes q = exp(z - m) - D onehot(t) over the logits, the rows'
    factors s = r w[t] / D and s x_c; then grad_x[c] = q @ W, grad_W (+)= q.T @ (s x_c), and after the
    last chunk grad_x's rows are multiplied by s (one pass over grad_x). The two-pass kernel reads each
    row's logits twice; at 128K columns the second read misses L2.
    grad_x's rows are an out= GEMM. grad_W goes through ops/_gemm_into's registered op when traced:
    an out= accumulation would be traced as an out-of-place addmm, which copies the (V, H) accumulator
    for every chunk after the first (one more accumulator alive, and a copy per chunk); the op declares
    its mutation and Inductor keeps it in place. (grad_x's row views are not given to that op: with
    them a compiled step once faulted on the H100, torch 2.11; docs/performance.md.)
Backward: each gradient times the 0-d upstream gradient (ops/_scale.scale_grad_: nothing when it is 1;
under compile ops/_scale.scaled_grad, which Inductor writes over the saved gradient).
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

Registration: the forward op returns (loss, lse, grad_x, grad_w, grad_b, pred), the gradients for an
upstream gradient of 1 (empty where not needed, and for "none"). It is an opaque custom op: compile
keeps it as one node, since with its body traced the AOT partitioner moved the last chunk's grad_W
update into the backward graph and saved that chunk's (C, V) logits gradient and the partial
accumulator instead of grad_W (one accumulator more at the step's peak). The backward op scales them by the
upstream gradient (a new tensor each under compile and export; in place on the eager CUDA path, as
ops/cross_entropy.py explains) or, for "none", recomputes them chunk by chunk.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kernel_pytorch.ops import _cross_entropy_onepass as _onepass
from kernel_pytorch.ops._common.gemm_into import fp32_accumulate_in_place as fp32_accumulate_in_place  # its old home
from kernel_pytorch.ops._common.gemm_into import gemm_into
from kernel_pytorch.ops._common.register import Impl, register_op
from kernel_pytorch.ops._common.row_view import contiguous_rows
from kernel_pytorch.ops._common.scale import scale_grad_, scaled_grad
from kernel_pytorch.ops._cross_entropy_stats import cross_entropy_stats
from kernel_pytorch.ops.cross_entropy import CrossEntropyOptions, flat_token_scale, launch_bwd, launch_fwd
from kernel_pytorch.reference._math import acc, acc_dtype
from kernel_pytorch.reference.cross_entropy_extras import predicted_tokens
from kernel_pytorch.reference.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_backward,
)

# The chunk buffer's default cap: 1024 rows of a 128K bf16 vocabulary, where the grad_W update is
# compute-bound and bf16 accumulation rounds 8 times over 8K tokens. Liger-Kernel's rule (chunk logits
# as large as x) gives 256 rows there: its peak memory, but a memory-bound update (module docstring).
# MIN_ROWS is a floor under that cap: each chunk re-reads and re-writes the (V, H) grad_W accumulator,
# whose traffic against the chunk's three GEMMs depends on the rows only (~11% of their time at 1024
# rows on an H200, ~21% at 512), so at a 262144 vocabulary the cap's 512 rows cost 1.19x the GEMMs and
# 1024 rows 1.08x (benchmarks/results/probes/cross_entropy/probe_flce_chunks_h200.log). The free-memory share
# still wins over the floor. benchmarks/probes/probe_cross_entropy.py measures time and memory at several sizes.
CHUNK_BYTES = 256 * 2**20
MIN_ROWS = 1024
ROW_ALIGN = 128  # rows per chunk come in whole GEMM tiles
FREE_FRACTION = 0.5  # at most this share of the device's free memory goes to the chunk buffer


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
               free_bytes: int | None = None) -> int:
    """Rows per chunk: the most whole tiles of ROW_ALIGN rows whose (rows, vocab) logits buffer fits in
    `max_bytes` (default: CHUNK_BYTES, or MIN_ROWS rows where that is more) and in FREE_FRACTION of
    `free_bytes` (when given); at least one tile, at most n_rows.

    Args:
        n_rows: tokens; vocab: V; element_size: bytes per logit (x's dtype).
        max_bytes: cap on the buffer (no floor then); free_bytes: the device's free memory
            (`free_device_bytes`).
    """
    row_bytes = vocab * element_size
    if max_bytes is None:
        rows = max(CHUNK_BYTES // row_bytes, MIN_ROWS)
    else:
        rows = max_bytes // row_bytes
    if free_bytes is not None:
        rows = min(rows, int(free_bytes * FREE_FRACTION) // row_bytes)
    rows = rows // ROW_ALIGN * ROW_ALIGN
    return max(1, min(max(rows, ROW_ALIGN), n_rows))


# Whether the one-read kernel runs where it applies (module docstring); off: the two-pass kernel everywhere
# (benchmarks compare the two in one run).
ONE_READ = True


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


def _setup(x: Tensor, weight: Tensor, target: Tensor, chunk: int | None) -> tuple[Tensor, Tensor, Tensor, int]:
    """(x as (N, H) rows, flat targets, the chunk buffer, rows per chunk)."""
    x2 = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1).contiguous()
    if t.numel() != x2.shape[0]:
        raise ValueError(f"target has {t.numel()} elements for {x2.shape[0]} rows of x")
    n, v = x2.shape[0], weight.shape[0]
    c = chunk or chunk_rows(n, v, x.element_size(), free_bytes=free_device_bytes(x.device))
    buf = torch.empty((max(1, min(c, n)), v), dtype=x.dtype, device=x.device)
    return x2, t, buf, max(1, c)


def fused_linear_cross_entropy_fwd(
    x: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ce_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    needs: tuple[bool, bool, bool] = (True, True, True),
    chunk: int | None = None,
    grad_w_fp32: bool = False,
    token_scale: Tensor | None = None,
    argmax: bool = False,
    eager: bool = False,
) -> FusedLinearCrossEntropyForward:
    """Loss and lse, and for "mean"/"sum" the gradients for an upstream gradient of 1, chunk by chunk.

    Args:
        x: (..., H) fp32/bf16/fp16; weight: (V, H) of x's dtype; target: (...) class indices, one per
            row of x; bias: (V,) or None.
        ce_weight: (V,) class weights; the other options as in ops.cross_entropy.cross_entropy_fwd.
        needs: which of (grad_x, grad_w, grad_b) to compute (autograd's needs_input_grad); none are
            computed for reduction "none" (`fused_linear_cross_entropy_bwd` does it).
        chunk: rows per chunk (default `chunk_rows`); grad_w_fp32: accumulate grad_W in fp32.
        token_scale: (...) of target's shape, each row's factor, or None; argmax: also return each
            row's argmax (`pred`), taken in the chunk's pass over its logits.
        eager: launch directly rather than through wrap_triton.
    """
    opts = CrossEntropyOptions(ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    x2, t, buf, c = _setup(x, weight, target, chunk)
    n, v = x2.shape[0], weight.shape[0]
    stats = cross_entropy_stats(t, ce_weight, v, ignore_index, eager=eager) if opts.needs_stats(ce_weight) else None
    loss_rows = torch.empty(n, dtype=torch.float32, device=x.device)
    lse = torch.empty_like(loss_rows)
    ts = flat_token_scale(token_scale)
    pred = torch.empty(n, dtype=torch.int64, device=x.device) if argmax else None
    with_grad = reduction != "none" and any(needs)
    grads = _Grads(x2, weight, bias, needs, grad_w_fp32, eager) if with_grad else None
    one_pass = ONE_READ and with_grad and _onepass.applies(label_smoothing, lse_square_scale, reduction,
                                                           grads.b is not None)
    if one_pass:  # the rows' factors s, and s x for grad_W (ops/_cross_entropy_onepass.py)
        scale = torch.empty_like(loss_rows)
        xs = torch.empty((buf.shape[0], x2.shape[1]), dtype=x.dtype, device=x.device) if needs[1] else None
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c = x2[start:end]
        logits = contiguous_rows(_logits_into(buf, x_c, weight, bias))
        ts_c = ts[start:end] if ts is not None else None
        pred_c = pred[start:end] if pred is not None else None
        if one_pass:
            xs_c = xs[: end - start] if xs is not None else None
            _onepass.launch_onepass(logits, t[start:end], ce_weight, stats, loss_rows[start:end], lse[start:end],
                                    scale[start:end], x_c, xs_c, ignore_index=ignore_index,
                                    mean=reduction == "mean", softcap=softcap, token_scale=ts_c, pred=pred_c,
                                    eager=eager)
            grads.add_chunk(logits.tensor, xs_c, start, start == 0)
            continue
        launch_fwd(logits, t[start:end], ce_weight, stats, loss_rows[start:end], lse[start:end],
                   logits if with_grad else None, opts, token_scale=ts_c, pred=pred_c, eager=eager)
        if grads is not None:
            grads.add_chunk(logits.tensor, x_c, start, start == 0)
    if one_pass and grads.x is not None and n:  # grad_x's rows were q @ W: now s times them
        scale_grad_(grads.x, scale, eager=eager)
    loss = loss_rows.view(target.shape) if reduction == "none" else loss_rows.sum()
    gx, gw, gb = grads.result(x.shape) if grads is not None else (None, None, None)
    return FusedLinearCrossEntropyForward(loss, lse, gx, gw, gb, stats, pred)


def fused_linear_cross_entropy_bwd(
    dloss: Tensor,
    x: Tensor,
    weight: Tensor,
    target: Tensor,
    lse: Tensor,
    bias: Tensor | None = None,
    *,
    ce_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "none",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    needs: tuple[bool, bool, bool] = (True, True, True),
    chunk: int | None = None,
    grad_w_fp32: bool = False,
    stats: Tensor | None = None,
    token_scale: Tensor | None = None,
    eager: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients for upstream gradient `dloss`, recomputing each chunk's logits (any reduction;
    needed for "none", where dloss has target's shape).

    Args:
        dloss: target's shape for "none", else 0-d. lse: the forward's. stats: the forward's, if any.
        (the rest as in `fused_linear_cross_entropy_fwd`)
    Returns:
        (grad_x, grad_w, grad_b), None where not needed (or no bias).
    """
    opts = CrossEntropyOptions(ignore_index, reduction, label_smoothing, lse_square_scale, softcap)
    x2, t, buf, c = _setup(x, weight, target, chunk)
    n, v = x2.shape[0], weight.shape[0]
    if stats is None and opts.needs_stats(ce_weight):
        stats = cross_entropy_stats(t, ce_weight, v, ignore_index, eager=eager)
    dl = dloss.reshape(-1).contiguous() if reduction == "none" else dloss.reshape(1)
    grads = _Grads(x2, weight, bias, needs, grad_w_fp32, eager)
    ts = flat_token_scale(token_scale)
    for start in range(0, n, c):
        end = min(start + c, n)
        x_c = x2[start:end]
        logits = contiguous_rows(_logits_into(buf, x_c, weight, bias))
        launch_bwd(dl[start:end] if reduction == "none" else dl, logits, t[start:end], lse[start:end],
                   ce_weight, stats, logits, opts, token_scale=ts[start:end] if ts is not None else None,
                   eager=eager)
        grads.add_chunk(logits.tensor, x_c, start, start == 0)
    return grads.result(x.shape)


# Registration. softcap 0.0 stands for no cap; needs_x/w/b: which gradients autograd wants; argmax=True
# fills `pred` (empty otherwise). No gradient reaches token_scale.


def _fwd_launch(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
                ignore_index: int, reduction: str, label_smoothing: float, lse_square_scale: float, softcap: float,
                needs_x: bool, needs_w: bool, needs_b: bool, token_scale: Tensor | None = None,
                argmax: bool = False, *, eager: bool = False) -> tuple:
    out = fused_linear_cross_entropy_fwd(
        x, weight, target, bias, ce_weight=ce_weight, ignore_index=ignore_index, reduction=reduction,
        label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap or None,
        needs=(needs_x, needs_w, needs_b and bias is not None), token_scale=token_scale, argmax=argmax, eager=eager)
    return out.loss, out.lse, out.grad_x, out.grad_w, out.grad_b, out.pred


def _bwd_launch(dloss: Tensor, grad_x: Tensor | None, grad_w: Tensor | None, grad_b: Tensor | None, x: Tensor,
                weight: Tensor, target: Tensor, lse: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
                token_scale: Tensor | None, ignore_index: int, reduction: str, label_smoothing: float,
                lse_square_scale: float, softcap: float, needs_x: bool, needs_w: bool, needs_b: bool, *,
                eager: bool = False) -> tuple:
    needs = (needs_x, needs_w, needs_b and bias is not None)
    if reduction == "none":
        return fused_linear_cross_entropy_bwd(
            dloss, x, weight, target, lse, bias, ce_weight=ce_weight, ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap or None,
            needs=needs, token_scale=token_scale, eager=eager)
    out = []
    for g, need in zip((grad_x, grad_w, grad_b), needs):
        if not need:
            out.append(None)
        elif eager:  # the saved gradients are this backward's alone (ops/cross_entropy.py)
            out.append(scale_grad_(g, dloss, eager=True))
            torch.autograd.graph.increment_version(g)
        else:
            out.append(scaled_grad(g, dloss))
    return tuple(out)


def _fwd_reference(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
                   ignore_index: int, reduction: str, label_smoothing: float, lse_square_scale: float, softcap: float,
                   needs_x: bool, needs_w: bool, needs_b: bool, token_scale: Tensor | None = None,
                   argmax: bool = False,
                   ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    opts = dict(ce_weight=ce_weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
                lse_square_scale=lse_square_scale, softcap=softcap or None, token_scale=token_scale)
    loss = fused_linear_cross_entropy(x, weight, target, bias, reduction=reduction, **opts)
    low = torch.nn.functional.linear(x, weight, bias)
    pred = predicted_tokens(low, target, ignore_index).reshape(-1) if argmax else None
    logits = acc(low).reshape(-1, weight.shape[0])
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    valid = target.reshape(-1) != ignore_index
    lse = torch.where(valid, torch.logsumexp(logits, -1), torch.zeros((), dtype=logits.dtype))
    if reduction == "none" or not (needs_x or needs_w or needs_b):
        return loss, lse, None, None, None, pred
    dx, dw, db = fused_linear_cross_entropy_backward(torch.ones_like(loss), x, weight, target, bias,
                                                     reduction=reduction, **opts)
    return (loss, lse, dx.contiguous() if needs_x else None, dw.contiguous() if needs_w else None,
            db if needs_b and bias is not None else None, pred)


def _bwd_reference(dloss: Tensor, grad_x: Tensor | None, grad_w: Tensor | None, grad_b: Tensor | None, x: Tensor,
                   weight: Tensor, target: Tensor, lse: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
                   token_scale: Tensor | None, ignore_index: int, reduction: str, label_smoothing: float,
                   lse_square_scale: float, softcap: float, needs_x: bool, needs_w: bool, needs_b: bool,
                   ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    needs = (needs_x, needs_w, needs_b and bias is not None)
    if reduction == "none":
        grads = fused_linear_cross_entropy_backward(
            dloss, x, weight, target, bias, ce_weight=ce_weight, ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap or None,
            token_scale=token_scale)
    else:
        grads = tuple(None if g is None else (acc(g) * acc(dloss)).to(g.dtype) for g in (grad_x, grad_w, grad_b))
    return tuple(g.contiguous() if need and g is not None else None for g, need in zip(grads, needs))


def _fwd_fake(x: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
              ignore_index: int, reduction: str, label_smoothing: float, lse_square_scale: float, softcap: float,
              needs_x: bool, needs_w: bool, needs_b: bool, token_scale: Tensor | None = None, argmax: bool = False,
              ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    dtype = acc_dtype(x.dtype)
    loss = x.new_empty(target.shape if reduction == "none" else (), dtype=dtype)
    lse = x.new_empty(target.numel(), dtype=dtype)
    pred = x.new_empty(target.numel(), dtype=torch.int64) if argmax else None
    if reduction == "none" or not (needs_x or needs_w or needs_b):
        return loss, lse, None, None, None, pred
    return (loss, lse, torch.empty(x.shape, dtype=x.dtype, device=x.device) if needs_x else None,
            torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if needs_w else None,
            torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if needs_b and bias is not None else None,
            pred)


def _bwd_fake(dloss: Tensor, grad_x: Tensor | None, grad_w: Tensor | None, grad_b: Tensor | None, x: Tensor,
              weight: Tensor, target: Tensor, lse: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
              token_scale: Tensor | None, ignore_index: int, reduction: str, label_smoothing: float,
              lse_square_scale: float, softcap: float, needs_x: bool, needs_w: bool, needs_b: bool,
              ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device) if needs_x else None,
            torch.empty(weight.shape, dtype=weight.dtype, device=weight.device) if needs_w else None,
            torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if needs_b and bias is not None else None)


_OPTIONS = ("ignore_index", "reduction", "label_smoothing", "lse_square_scale", "softcap", "needs_x", "needs_w",
            "needs_b")
# kernel_pytorch::fused_linear_cross_entropy_fwd (x, weight, target, bias?, ce_weight?, options...,
# token_scale?, argmax) -> (loss, lse, grad_x, grad_w, grad_b, pred) and _bwd (dloss, the three gradients, x,
# weight, target, lse, bias?, ce_weight?, token_scale?, options...) -> (dx, dweight, dbias);
# fused_linear_cross_entropy_eager(...) -> loss
fused_linear_cross_entropy_fwd_op, fused_linear_cross_entropy_bwd_op, fused_linear_cross_entropy_eager = register_op(
    "fused_linear_cross_entropy",
    Impl(_fwd_launch, _fwd_reference, _fwd_fake, outputs=("loss", "lse", "grad_x", "grad_w", "grad_b", "pred")),
    Impl(_bwd_launch, _bwd_reference, _bwd_fake, outputs=("dx", "dweight", "dbias")),
    differentiable=("loss",),
    save=("grad_x", "grad_w", "grad_b", "x", "weight", "target", "lse", "bias", "ce_weight", "token_scale"),
    keep=_OPTIONS,
    grads={"x": "dx", "weight": "dweight", "bias": "dbias"},
    opaque_forward=True,  # traced, the partitioner moved the last chunk's grad_W update into the backward
)
