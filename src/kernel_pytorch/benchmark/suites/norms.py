"""The norms suite: RMSNorm, LayerNorm and fused residual add + RMSNorm against the usual peers.

Providers:
    ours     kernel_pytorch.functional.{rms_norm, layer_norm, add_rms_norm}; backend="triton" on CUDA
             (on CPU the registered ops' CPU kernels, which are the reference).
    ours-auto  the same with backend="auto", what a default call gets; rows only where that differs
             from "ours" (LayerNorm on CUDA: see kernel_pytorch.functional).
    eager    the code as Hugging Face transformers writes it (LlamaRMSNorm's forward;
             torch.nn.functional.layer_norm; `h = x + residual` then the same norm).
    compile  torch.compile(fullgraph=True, dynamic=False) of that eager code.
    liger    Liger-Kernel's LigerRMSNorm / LigerLayerNorm / LigerFusedAddRMSNorm when importable.

Passes: "fwd" under no_grad; "fwd+bwd" with torch.autograd.grad and a fixed random upstream gradient.
Every provider first passes a correctness gate against kernel_pytorch.reference (outputs and
gradients, the tolerance table, weight gradients by the fp64-derived budget with eager as the
yardstick) at the benchmark's own shape, row-wise results checked on a sample of rows; a provider
that fails is reported as failed and not timed.

Bytes are the minimum each pass must move (E = rows * cols elements, D = cols, s = element size):
    rms_norm      fwd: read x, write y, read w                      (2E + D) s
                  bwd: read dy, x, w; write dx, dw                   (3E + 2D) s
    layer_norm    fwd: read x, write y, read w, b                   (2E + 2D) s
                  bwd: read dy, x, w; write dx, dw, db               (3E + 3D) s
    add_rms_norm  fwd: read x, residual; write y, h; read w          (4E + D) s
                  bwd: read dy, dh, h, w; write d(x + residual), dw  (4E + 2D) s
fwd+bwd counts both. FLOPs are nominal counts (for the roofline chart only).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch._env import recompile_headroom
from kernel_pytorch._errors import short_error
from kernel_pytorch.benchmark.ceilings import Ceilings, device_name, measure_ceilings, roofline
from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.benchmark.module import upstream_gradients
from kernel_pytorch.benchmark.results import BenchmarkResults, Row
from kernel_pytorch.benchmark.timer import resolve_device, rotation_copies, time_cuda_graph, time_fn
from kernel_pytorch.validation.compare import TensorCheck, check_tensor, failures

NAME = "norms"
OPS = ("rms_norm", "layer_norm", "add_rms_norm")
PROVIDERS = ("ours", "ours-auto", "eager", "compile", "liger")
PASSES = ("fwd", "fwd+bwd")
RMS_EPS = 1e-5  # Llama-3's rms_norm_eps
LN_EPS = 1e-5  # torch.nn.LayerNorm's default


@dataclass(frozen=True)
class Shape:
    """A (rows, cols) problem and the model configuration it comes from."""

    rows: int
    cols: int
    config: str


CUDA_SHAPES = (
    Shape(16384, 4096, "Llama-3-8B: hidden 4096, 16384 tokens per step"),
    Shape(2048, 16384, "Llama-3.1-405B: hidden 16384, 2048 tokens"),
    Shape(4096, 1024, "Qwen3-0.6B: hidden 1024, 4096 tokens (launch-bound)"),
    Shape(256, 262144, "wide rows: Gemma-3 vocabulary width 262144, 256 rows"),
)
CPU_SHAPES = (
    Shape(256, 1024, "CPU smoke: Qwen3-0.6B hidden 1024, 256 tokens"),
    Shape(64, 4096, "CPU smoke: Llama-3-8B hidden 4096, 64 tokens"),
)
# --quick: one small shape per device, for smoke tests of the whole pipeline
QUICK_SHAPES = {
    "cuda": Shape(4096, 1024, "Qwen3-0.6B: hidden 1024, 4096 tokens (launch-bound)"),
    "cpu": Shape(32, 1024, "CPU smoke: Qwen3-0.6B hidden 1024, 32 tokens"),
}

Progress = Callable[[int, int, str], None]  # (done, total, what is running)


# ---- the eager code, as Hugging Face transformers writes it --------------------------------------


def hf_rms_norm(hidden_states: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm.forward: (..., D) -> (..., D)."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def hf_layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """nn.LayerNorm.forward: (..., D) -> (..., D)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def hf_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """A decoder layer's `hidden_states = residual + hidden_states` then its RMSNorm: (y, h)."""
    h = x + residual
    return hf_rms_norm(h, weight, eps), h


# ---- per-op facts --------------------------------------------------------------------------------


def tensor_names(op: str) -> tuple[str, ...]:
    """Inputs in call order; the last one or two are parameters."""
    return {"rms_norm": ("x", "weight"), "layer_norm": ("x", "weight", "bias"),
            "add_rms_norm": ("x", "residual", "weight")}[op]


def make_inputs(
    op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, Tensor]:
    """Random inputs (never zeros), drawn in fp32 on `device` from `seed` and rounded once.

    The generator lives on the device: drawing 67M values on the host for every timed row would cost
    more than the timing (the values differ between device types, never between runs).
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    draw = lambda *size: torch.randn(*size, generator=gen, device=device)
    t: dict[str, Tensor] = {"x": draw(rows, cols)}
    if op == "add_rms_norm":
        t["residual"] = draw(rows, cols)
    t["weight"] = 1.0 + 0.1 * draw(cols)
    if op == "layer_norm":
        t["bias"] = 0.1 * draw(cols)
    return {k: v.to(device=device, dtype=dtype) for k, v in t.items()}


def min_bytes(op: str, rows: int, cols: int, element_size: int, pass_name: str) -> int:
    """Minimum bytes a pass moves (module docstring)."""
    e, d = rows * cols, cols
    fwd = {"rms_norm": 2 * e + d, "layer_norm": 2 * e + 2 * d, "add_rms_norm": 4 * e + d}[op]
    bwd = {"rms_norm": 3 * e + 2 * d, "layer_norm": 3 * e + 3 * d, "add_rms_norm": 4 * e + 2 * d}[op]
    return (fwd + bwd if "bwd" in pass_name else fwd) * element_size


def nominal_flops(op: str, rows: int, cols: int, pass_name: str) -> int:
    """Nominal FLOPs per element: square+sum, scale, weight (+ centring for LayerNorm, + add)."""
    per_fwd = {"rms_norm": 4, "layer_norm": 7, "add_rms_norm": 5}[op]
    per_bwd = {"rms_norm": 8, "layer_norm": 11, "add_rms_norm": 9}[op]
    per = per_fwd + (per_bwd if "bwd" in pass_name else 0)
    return per * rows * cols


def _reference(op: str, t: dict[str, Tensor]) -> Any:
    if op == "rms_norm":
        return reference.rms_norm(t["x"], t["weight"], RMS_EPS)
    if op == "layer_norm":
        return reference.layer_norm(t["x"], t["weight"], t["bias"], LN_EPS)
    return reference.add_rms_norm(t["x"], t["residual"], t["weight"], RMS_EPS)


def _eager(op: str) -> Callable[..., Any]:
    if op == "rms_norm":
        return lambda x, weight: hf_rms_norm(x, weight, RMS_EPS)
    if op == "layer_norm":
        return lambda x, weight, bias: hf_layer_norm(x, weight, bias, LN_EPS)
    return lambda x, residual, weight: hf_add_rms_norm(x, residual, weight, RMS_EPS)


def _ours(op: str, backend: str) -> Callable[..., Any]:
    if op == "rms_norm":
        return lambda x, weight: kpf.rms_norm(x, weight, RMS_EPS, backend=backend)
    if op == "layer_norm":
        return lambda x, weight, bias: kpf.layer_norm(x, weight, bias, LN_EPS, backend=backend)
    return lambda x, residual, weight: kpf.add_rms_norm(x, residual, weight, RMS_EPS, backend=backend)


def liger_status(op: str) -> tuple[type | None, str]:
    """Liger-Kernel's module class for `op`, or None and the row status ("not installed" / reason)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return None, "not installed"
    try:
        if op == "rms_norm":
            from liger_kernel.transformers.rms_norm import LigerRMSNorm as cls
        elif op == "layer_norm":
            from liger_kernel.transformers.layer_norm import LigerLayerNorm as cls
        else:
            from liger_kernel.transformers.fused_add_rms_norm import LigerFusedAddRMSNorm as cls
    except Exception as exc:  # an installed Liger without this op, or a broken install
        return None, f"not available: {type(exc).__name__}: {exc}"
    return cls, "ok"


LIGER_NOTE = {
    "rms_norm": "in_place=False, so the fixed upstream gradient is not overwritten by dx "
    "(Liger's default reuses dy's memory: one activation-sized buffer less in fwd+bwd)",
}


def liger_kwargs(cls: type, op: str) -> dict[str, Any]:
    """Constructor arguments beyond (hidden_size, eps) for Liger's module `cls`."""
    import inspect

    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    if op == "layer_norm" and "bias" in params:
        kwargs["bias"] = True
    if op == "rms_norm" and "in_place" in params:
        kwargs["in_place"] = False
    return kwargs


@dataclass
class Bound:
    """A provider bound to one set of inputs: `call()` runs the forward, `wrt` are what the
    backward differentiates (x, residual, weight, bias as the op has them)."""

    call: Callable[[], Any]
    wrt: list[Tensor]


def _bind(op: str, provider: str, fn: Any, t: dict[str, Tensor], grad: bool) -> Bound:
    args = {k: (v.detach().requires_grad_(grad) if grad else v) for k, v in t.items()}
    names = tensor_names(op)
    if provider != "liger":
        return Bound(lambda: fn(*(args[n] for n in names)), [args[n] for n in names])
    module = fn(args["x"].shape[-1], eps=RMS_EPS if op != "layer_norm" else LN_EPS, **liger_kwargs(fn, op))
    module = module.to(device=args["x"].device, dtype=args["x"].dtype)
    with torch.no_grad():
        module.weight.copy_(args["weight"])
        if op == "layer_norm":
            module.bias.copy_(args["bias"])
    module.weight.requires_grad_(grad)
    params = [module.weight] + ([module.bias] if op == "layer_norm" else [])
    if op == "layer_norm":
        module.bias.requires_grad_(grad)
    if op == "add_rms_norm":
        return Bound(lambda: module(args["x"], args["residual"]), [args["x"], args["residual"], *params])
    return Bound(lambda: module(args["x"]), [args["x"], *params])


def _outs(result: Any) -> list[Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _pass_fn(bound: Bound, pass_name: str, seed: int) -> Callable[[], Any]:
    if pass_name == "fwd":
        def fwd() -> Any:
            with torch.no_grad():
                return bound.call()

        return fwd
    with torch.enable_grad():
        first = _outs(bound.call())
    grads = upstream_gradients(first, seed)

    def fwd_bwd() -> Any:
        with torch.enable_grad():
            # the same upstream gradient every call: no copy inside the timed region
            return torch.autograd.grad(_outs(bound.call()), bound.wrt, grads)

    return fwd_bwd


# ---- the correctness gate ------------------------------------------------------------------------

# The gate runs each provider at the benchmark's own shape (the very kernels and compiled graphs that
# are then timed), but the checks run in float64 on the host, so row-wise tensors (y, h, dx) are
# checked on an evenly spaced sample of rows; weight and bias gradients, which sum over every row, are
# checked whole.
GATE_MAX_ELEMENTS = 1 << 22
GATE_MIN_ROWS = 8


def gate_rows(rows: int, cols: int) -> list[int] | None:
    """Row indices the gate checks for row-wise tensors (None: all), at most ~4M elements' worth."""
    n = max(GATE_MIN_ROWS, GATE_MAX_ELEMENTS // cols)
    if rows <= n:
        return None
    # evenly spaced, first and last included: every program of a row-parallel grid gets looked at
    return sorted({round(k * (rows - 1) / (n - 1)) for k in range(n)})


def _check_rows(name: str, actual: Tensor, expected: Tensor, base: Tensor | None, hi: Tensor,
                rows: list[int] | None) -> TensorCheck:
    if rows is None:
        return check_tensor(name, actual, expected, baseline_lowp=base, reference_hi=hi)
    idx = torch.tensor(rows, device=actual.device)
    pick = lambda t: t.index_select(0, idx.to(t.device)) if t is not None else None
    c = check_tensor(name, pick(actual), pick(expected), baseline_lowp=pick(base), reference_hi=pick(hi))
    # report the row of the full tensor, not of the sample
    where = (rows[c.worst_index[0]], *c.worst_index[1:]) if c.worst_index else c.worst_index
    note = f"{len(rows)} of {actual.shape[0]} rows checked" + (f"; {c.note}" if c.note else "")
    return dataclasses.replace(c, worst_index=where, shape=tuple(actual.shape), note=note)


def gate(op: str, provider: str, fn: Any, shape: tuple[int, int], dtype: torch.dtype,
         device: torch.device, eager_result: tuple[list[Tensor], list[Tensor]] | None,
         seed: int = 1234) -> tuple[list[TensorCheck], tuple[list[Tensor], list[Tensor]]]:
    """Forward and backward of `provider` against kernel_pytorch.reference on random inputs.

    Args:
        shape: (rows, cols) to run at; row-wise results are checked on `gate_rows(rows, cols)`.
        eager_result: eager's (outputs, grads) on the same inputs: the budget's yardstick.
    Returns:
        (checks, (outputs, grads)) of this provider.
    """
    rows, cols = shape
    sample = gate_rows(rows, cols)
    t = make_inputs(op, rows, cols, dtype, device, seed)
    bound = _bind(op, provider, fn, t, grad=True)
    with torch.enable_grad():
        outs = _outs(bound.call())
    ups = upstream_gradients(outs, seed)
    # clones: an in-place backward (Liger's default) may overwrite the upstream gradient it is given
    grads = list(torch.autograd.grad(outs, bound.wrt, [g.clone() for g in ups], allow_unused=True))
    outs = [o.detach() for o in outs]
    del bound

    names = tensor_names(op)
    expected = []
    # the reference computes in fp64 when given fp64: the budget's high-precision yardstick
    for cast in (lambda v: v, lambda v: v.double()):
        ref_in = {k: cast(v.detach()).requires_grad_(True) for k, v in t.items()}
        with torch.enable_grad():
            r_outs = _outs(_reference(op, ref_in))
        r_up = [u.to(o.dtype) for u, o in zip(ups, r_outs)]
        r_grads = torch.autograd.grad(r_outs, [ref_in[n] for n in names], r_up)
        expected.append(([o.detach() for o in r_outs], list(r_grads)))
    (lo_out, lo_grad), (hi_out, hi_grad) = expected
    if eager_result is not None:
        base_out, base_grad = eager_result
    else:
        # eager itself: outputs and input gradients are held to the reference (table, or the budget
        # measured against the reference rounded to this dtype); its parameter gradients, sums over
        # every row, are PyTorch's own accumulation and so define the budget rather than face it
        base_out = None
        base_grad = [g if n in ("weight", "bias") else None for n, g in zip(names, grads)]
    checks: list[TensorCheck] = []
    out_names = ["y", "h"] if op == "add_rms_norm" else ["y"]
    for i, name in enumerate(out_names):
        checks.append(_check_rows(f"{op} {name}", outs[i], lo_out[i], base_out[i] if base_out else None,
                                  hi_out[i], sample))
    for i, name in enumerate(names):
        if grads[i] is None:
            checks.append(TensorCheck(f"{op} d{name}", False, "structure", note="no gradient"))
            continue
        row_wise = grads[i].dim() == 2
        checks.append(_check_rows(f"{op} d{name}", grads[i], lo_grad[i], base_grad[i], hi_grad[i],
                                  sample if row_wise else None))
    return checks, (outs, [g.detach() if g is not None else None for g in grads])


# ---- the run -------------------------------------------------------------------------------------


def _provider_fn(op: str, provider: str, device: torch.device) -> tuple[Any, str, str]:
    """(callable or module class, status, note) for one provider on this device."""
    if provider == "eager":
        return _eager(op), "ok", ""
    if provider == "ours":
        if device.type == "cuda":
            return _ours(op, "triton"), "ok", ""
        return _ours(op, "auto"), "ok", "cpu: the registered op's CPU kernel (the reference); Triton runs on CUDA"
    if provider == "ours-auto":
        # what a default call gets: it differs from "ours" only for LayerNorm on CUDA
        if device.type != "cuda" or op != "layer_norm":
            return None, "same", ""
        return _ours(op, "auto"), "ok", (
            "backend='auto': ATen's fused layer_norm for gradient-recording calls on at most "
            f"{kpf.ATEN_LAYER_NORM_MAX_NUMEL} elements (so fwd+bwd at small shapes), our kernels otherwise")
    if provider == "compile":
        return torch.compile(_eager(op), fullgraph=True, dynamic=False), "ok", ""
    if provider == "liger":
        cls, status = liger_status(op)
        if cls is None:
            return None, "not installed" if status == "not installed" else "not available", (
                "" if status == "not installed" else status.removeprefix("not available: "))
        if device.type != "cuda":
            return None, "not available", "Liger-Kernel runs on CUDA"
        return cls, "ok", LIGER_NOTE.get(op, "")
    raise ValueError(f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}")


def run(
    *,
    device: torch.device | str | None = None,
    providers: tuple[str, ...] | None = None,
    ops: tuple[str, ...] = OPS,
    shapes: tuple[Shape, ...] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    quick: bool = False,
    ceilings: Ceilings | None = None,
    progress: Progress | None = None,
) -> BenchmarkResults:
    """Run the suite and return its results (the caller writes them).

    Args:
        device: CUDA device or "cpu" (default: current CUDA device, else CPU).
        providers: subset of PROVIDERS. Default: all on CUDA; on CPU all but "compile", whose
            compile time would dominate a small CPU run (ask for it explicitly).
        ops: subset of OPS.
        shapes: override the shape list (default: CUDA_SHAPES on CUDA, CPU_SHAPES on CPU).
        dtype: input dtype (bf16 by default).
        quick: smoke-test mode: one small shape (QUICK_SHAPES), shortest CPU timing.
        ceilings: use these instead of measuring them in this run.
        progress: called as progress(done, total, description) before each step.
    """
    dev = resolve_device(device)
    on_cuda = dev.type == "cuda"
    default = PROVIDERS if on_cuda else tuple(p for p in PROVIDERS if p != "compile")
    chosen = tuple(providers) if providers else default
    for p in chosen:
        if p not in PROVIDERS:
            raise ValueError(f"unknown provider {p!r}; known: {', '.join(PROVIDERS)}")
    for o in ops:
        if o not in OPS:
            raise ValueError(f"unknown op {o!r}; known: {', '.join(OPS)}")
    # eager first: its results are the budget's yardstick for the others' gates
    order = ("eager",) + tuple(p for p in chosen if p != "eager")
    if shapes:
        shape_list = shapes
    elif quick:
        shape_list = (QUICK_SHAPES["cuda" if on_cuda else "cpu"],)
    else:
        shape_list = CUDA_SHAPES if on_cuda else CPU_SHAPES
    timing = (dict(warmup_ms=25.0, rep_ms=100.0) if on_cuda
              else dict(cpu_min_run_time=0.02 if quick else 0.1))
    total = 1 + len(ops) * len(shape_list) * len(order)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        if progress is not None:
            progress(done, total, what)
        done += 1

    started = time.perf_counter()
    step("measuring copy and matmul ceilings")
    ceil = ceilings or measure_ceilings(dev, force=True)
    results = BenchmarkResults(name=NAME, device=device_name(dev), ceilings=ceil)
    results.notes.append(
        f"dtype {str(dtype).removeprefix('torch.')}; GB/s counts minimum bytes (each input read once, each "
        "output written once, weights included); % copy is of the copy ceiling measured in this run"
    )
    results.notes.append("fwd runs under no_grad; fwd+bwd uses torch.autograd.grad with a fixed upstream gradient")
    if not on_cuda:
        results.notes.append("CPU run: small shapes, CPU kernels; these numbers say nothing about GPU speed")
        if "compile" not in chosen:
            results.notes.append("torch.compile not measured on CPU unless asked for (--providers ...,compile)")
    # one compiled function per op sees every shape in both grad modes: more than Dynamo's default
    # 8 cache entries per code object, after which it would silently run eager
    with recompile_headroom(64):
        for op in ops:
            fns = {p: _provider_fn(op, p, dev) for p in order}
            for shape in shape_list:
                eager_result = None
                for provider in order:
                    step(f"{op} {shape.rows}x{shape.cols} {provider}")
                    fn, status, note = fns[provider]
                    rows, gated = _measure(op, provider, fn, status, note, shape, dtype, dev, ceil,
                                           eager_result, timing, timed=provider in chosen)
                    if provider == "eager":
                        eager_result = gated
                    for r in rows:
                        results.add(r)
    # compile times and first-call kernel builds included: how long the whole run took
    results.notes.append(f"suite wall time {time.perf_counter() - started:.0f} s")
    if progress is not None:
        progress(total, total, "done")
    return results


def _row(op: str, shape: Shape, dtype: torch.dtype, provider: str, pass_name: str, **kw: Any) -> Row:
    return Row(op=op, shape=[shape.rows, shape.cols], config=shape.config,
               dtype=str(dtype).removeprefix("torch."), provider=provider, pass_name=pass_name, **kw)


GateResult = tuple[list[Tensor], list[Tensor]]


def _measure(
    op: str, provider: str, fn: Any, status: str, note: str, shape: Shape, dtype: torch.dtype,
    dev: torch.device, ceil: Ceilings, eager_result: GateResult | None, timing: dict[str, float],
    *, timed: bool,
) -> tuple[list[Row], GateResult | None]:
    """Gate, then time, one provider at one shape.

    Returns:
        (rows, the provider's gate outputs and gradients, or None when it did not run); with
        `timed=False` (eager run only as the yardstick) no rows.
    """
    # every CUDA shape also gets a CUDA-graph replay time: the kernels' own time, without the host
    # overhead of eager dispatch and autograd (which dominates the launch-bound shape, and on a slow
    # host CPU even fwd+bwd at large shapes)
    graph = dev.type == "cuda"
    if status == "same":  # the provider runs exactly another provider's code here: no rows
        return [], None
    if status != "ok":
        return [_row(op, shape, dtype, provider, p, status=status, note=note) for p in PASSES], None
    try:
        checks, result = gate(op, provider, fn, (shape.rows, shape.cols), dtype, dev, eager_result)
    except Exception as exc:
        note = short_error(exc, 300, lines=1)
        return [_row(op, shape, dtype, provider, p, status="error", note=note) for p in PASSES], None
    bad = failures(checks)
    if bad:
        msg = "; ".join(c.message() for c in bad[:2])
        rows = [_row(op, shape, dtype, provider, p, status="failed", note=f"correctness: {msg}") for p in PASSES]
        return rows, result
    if not timed:
        return [], result
    es = torch.empty((), dtype=dtype).element_size()
    out: list[Row] = []
    for pass_name in PASSES:
        row = _row(op, shape, dtype, provider, pass_name, note=note)
        row.bytes = min_bytes(op, shape.rows, shape.cols, es, pass_name)
        row.flops = nominal_flops(op, shape.rows, shape.cols, pass_name)
        try:
            # the graph replay has no L2 flush between calls: rotate input copies instead
            copies = rotation_copies(row.bytes, dev) if graph else 1
            fns = []
            for c in range(copies):
                t = make_inputs(op, shape.rows, shape.cols, dtype, dev, seed=c)
                fns.append(_pass_fn(_bind(op, provider, fn, t, grad=pass_name != "fwd"), pass_name, seed=99))
            t_main = time_fn(fns[0], device=dev, **timing)
            row.set_timing(t_main)
            row.set_roofline(roofline(t_main.median_ms, nbytes=row.bytes, flops=row.flops, ceilings=ceil))
            mem = peak_memory(fns[0], dev)
            row.peak_mem_bytes, row.peak_mem_method = mem.peak_bytes, mem.method
            out.append(row)
            if graph:
                out.append(_graph_row(op, shape, dtype, provider, pass_name, fns, dev, row, ceil))
        except Exception as exc:
            row.status, row.note = "error", short_error(exc, 300, lines=1)
            out.append(row)
    return out, result


def _graph_row(op, shape, dtype, provider, pass_name, fns, dev, base: Row, ceil: Ceilings) -> Row:
    row = _row(op, shape, dtype, provider, f"{pass_name} (cuda graph)", bytes=base.bytes, flops=base.flops)
    try:
        t = time_cuda_graph(fns, device=dev)
    except Exception as exc:
        row.status, row.note = "error", short_error(exc, 300, lines=1)
        return row
    row.set_timing(t)
    row.set_roofline(roofline(t.median_ms, nbytes=row.bytes, flops=row.flops, ceilings=ceil))
    row.note = "launch overhead removed; inputs rotated so each call reads cold data"
    return row


__all__ = [
    "CPU_SHAPES",
    "CUDA_SHAPES",
    "NAME",
    "OPS",
    "PROVIDERS",
    "Shape",
    "gate",
    "gate_rows",
    "hf_add_rms_norm",
    "hf_layer_norm",
    "hf_rms_norm",
    "liger_status",
    "make_inputs",
    "min_bytes",
    "nominal_flops",
    "run",
]
