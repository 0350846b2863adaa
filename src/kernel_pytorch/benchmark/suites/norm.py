"""The norm suite: RMSNorm, LayerNorm and fused residual add + RMSNorm against the usual peers.

Providers (see suites/providers.py; the runner is suites/runner.py):
    ours     kernel_pytorch.functional.{rms_norm, layer_norm, add_rms_norm}; backend="triton" on CUDA
             (on CPU the registered ops' CPU kernels, which are the reference).
    ours-auto  the same with backend="auto", what a default call gets; rows only where that differs
             from "ours" (LayerNorm on CUDA: see kernel_pytorch.functional).
    eager    the code as Hugging Face transformers writes it (LlamaRMSNorm's forward;
             torch.nn.functional.layer_norm; `h = x + residual` then the same norm).
    compile  torch.compile(fullgraph=True, dynamic=False) of that eager code.
    liger    Liger-Kernel's LigerRMSNorm / LigerLayerNorm / LigerFusedAddRMSNorm when importable.

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

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.module import PASSES
from kernel_pytorch.benchmark.results import BenchmarkResults
from kernel_pytorch.benchmark.suites import runner, spec
from kernel_pytorch.benchmark.suites.gate import GATE_MAX_ELEMENTS, GATE_MIN_ROWS, GateResult, gate_rows
from kernel_pytorch.benchmark.suites.gate import gate as _gate
from kernel_pytorch.benchmark.suites.providers import Impl, load_peer, peer_kwargs
from kernel_pytorch.benchmark.suites.spec import ExtraProvider, ModulePeer, OpBench, Suite, generator
from kernel_pytorch.validation.compare import TensorCheck

NAME = "norm"
RMS_EPS = 1e-5  # Llama-3's rms_norm_eps
LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def rows_cols(rows: int, cols: int, config: str) -> spec.Shape:
    """A norm problem: `rows` token rows of `cols` features, from model configuration `config`."""
    return spec.Shape.of(config, rows=rows, cols=cols)


CUDA_SHAPES = (
    rows_cols(16384, 4096, "Llama-3-8B: hidden 4096, 16384 tokens per step"),
    rows_cols(2048, 16384, "Llama-3.1-405B: hidden 16384, 2048 tokens"),
    rows_cols(4096, 1024, "Qwen3-0.6B: hidden 1024, 4096 tokens (launch-bound)"),
    rows_cols(256, 262144, "wide rows: Gemma-3 vocabulary width 262144, 256 rows"),
)
CPU_SHAPES = (
    rows_cols(256, 1024, "CPU smoke: Qwen3-0.6B hidden 1024, 256 tokens"),
    rows_cols(64, 4096, "CPU smoke: Llama-3-8B hidden 4096, 64 tokens"),
)
# --quick: one small shape per device, for smoke tests of the whole pipeline
QUICK_SHAPES = {
    "cuda": rows_cols(4096, 1024, "Qwen3-0.6B: hidden 1024, 4096 tokens (launch-bound)"),
    "cpu": rows_cols(32, 1024, "CPU smoke: Qwen3-0.6B hidden 1024, 32 tokens"),
}


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


# ---- the three op benchmarks ---------------------------------------------------------------------


def _inputs(with_residual: bool = False, with_bias: bool = False) -> Callable[..., dict[str, Tensor]]:
    """The input factory: x (rows, cols) [, residual (rows, cols)], weight (cols,) [, bias (cols,)],
    drawn in fp32 on the device and rounded once; weights near 1, never zeros."""

    def make(shape: spec.Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
        draw = generator(device, seed)
        t = {"x": draw(shape.rows, shape.cols)}
        if with_residual:
            t["residual"] = draw(shape.rows, shape.cols)
        t["weight"] = 1.0 + 0.1 * draw(shape.cols)
        if with_bias:
            t["bias"] = 0.1 * draw(shape.cols)
        return {k: v.to(device=device, dtype=dtype) for k, v in t.items()}

    return make


def _counts(fwd_e: int, fwd_d: int, bwd_e: int, bwd_d: int) -> Callable[[spec.Shape, int], tuple[int, int]]:
    """Minimum bytes as (a E + b D) s for fwd and bwd (module docstring)."""
    return lambda s, es: ((fwd_e * s.rows * s.cols + fwd_d * s.cols) * es,
                          (bwd_e * s.rows * s.cols + bwd_d * s.cols) * es)


def _flops(per_fwd: int, per_bwd: int) -> Callable[[spec.Shape], tuple[int, int]]:
    """Nominal FLOPs per element: square+sum, scale, weight (+ centring for LayerNorm, + add)."""
    return lambda s: (per_fwd * s.rows * s.cols, per_bwd * s.rows * s.cols)


def _liger(target: str, call: tuple[str, ...], params: tuple[str, ...], eps: float, note: str = "",
           **optional: Any) -> ModulePeer:
    """Liger's module `liger_kernel.transformers.<target>`, built as cls(hidden_size, eps=eps, ...)."""
    return ModulePeer(target=f"liger_kernel.transformers.{target}", init_args=lambda t: (t["x"].shape[-1],),
                      call=call, params=params, init_kwargs={"eps": eps}, optional_kwargs=optional, note=note)


LIGER_IN_PLACE_NOTE = ("in_place=False, so the fixed upstream gradient is not overwritten by dx "
                       "(Liger's default reuses dy's memory: one activation-sized buffer less in fwd+bwd)")


def _ln_auto(device: torch.device) -> tuple[Callable[..., Any] | None, str]:
    # what a default call gets: it differs from "ours" only for LayerNorm on CUDA
    if device.type != "cuda":
        return None, ""
    return (lambda x, weight, bias: kpf.layer_norm(x, weight, bias, LN_EPS, backend="auto")), (
        "backend='auto': ATen's fused layer_norm for gradient-recording calls on at most "
        f"{kpf.ATEN_LAYER_NORM_MAX_NUMEL} elements (so fwd+bwd at small shapes), our kernels otherwise")


_SHAPES = dict(cuda_shapes=CUDA_SHAPES, cpu_shapes=CPU_SHAPES, quick_shapes=QUICK_SHAPES)

RMS_NORM = OpBench(
    name="rms_norm", make_inputs=_inputs(),
    arg_names=("x", "weight"), grad_names=("x", "weight"), param_names=("weight",), out_names=("y",),
    reference=lambda x, weight: reference.rms_norm(x, weight, RMS_EPS),
    eager=lambda x, weight: hf_rms_norm(x, weight, RMS_EPS),
    ours=lambda x, weight, *, backend: kpf.rms_norm(x, weight, RMS_EPS, backend=backend),
    liger=_liger("rms_norm:LigerRMSNorm", ("x",), ("weight",), RMS_EPS, LIGER_IN_PLACE_NOTE, in_place=False),
    min_bytes=_counts(2, 1, 3, 2), flops=_flops(4, 8), **_SHAPES,
)
LAYER_NORM = OpBench(
    name="layer_norm", make_inputs=_inputs(with_bias=True),
    arg_names=("x", "weight", "bias"), grad_names=("x", "weight", "bias"), param_names=("weight", "bias"),
    out_names=("y",),
    reference=lambda x, weight, bias: reference.layer_norm(x, weight, bias, LN_EPS),
    eager=lambda x, weight, bias: hf_layer_norm(x, weight, bias, LN_EPS),
    ours=lambda x, weight, bias, *, backend: kpf.layer_norm(x, weight, bias, LN_EPS, backend=backend),
    liger=_liger("layer_norm:LigerLayerNorm", ("x",), ("weight", "bias"), LN_EPS, bias=True),
    min_bytes=_counts(2, 2, 3, 3), flops=_flops(7, 11), extras=(ExtraProvider("ours-auto", _ln_auto),), **_SHAPES,
)
ADD_RMS_NORM = OpBench(
    name="add_rms_norm", make_inputs=_inputs(with_residual=True),
    arg_names=("x", "residual", "weight"), grad_names=("x", "residual", "weight"), param_names=("weight",),
    out_names=("y", "h"),
    reference=lambda x, residual, weight: reference.add_rms_norm(x, residual, weight, RMS_EPS),
    eager=lambda x, residual, weight: hf_add_rms_norm(x, residual, weight, RMS_EPS),
    ours=lambda x, residual, weight, *, backend: kpf.add_rms_norm(x, residual, weight, RMS_EPS, backend=backend),
    liger=_liger("fused_add_rms_norm:LigerFusedAddRMSNorm", ("x", "residual"), ("weight",), RMS_EPS),
    min_bytes=_counts(4, 1, 4, 2), flops=_flops(5, 9), **_SHAPES,
)

SPECS = {s.name: s for s in (RMS_NORM, LAYER_NORM, ADD_RMS_NORM)}
SUITE = Suite(NAME, tuple(SPECS.values()))
OPS = SUITE.ops
PROVIDERS = SUITE.providers  # ours, ours-auto, eager, compile, liger


def run(
    *,
    device: torch.device | str | None = None,
    providers: tuple[str, ...] | None = None,
    ops: tuple[str, ...] = OPS,
    shapes: tuple[spec.Shape, ...] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    quick: bool = False,
    ceilings: Ceilings | None = None,
    progress: runner.Progress | None = None,
) -> BenchmarkResults:
    """Run the suite (see `runner.run` for the arguments) and return its results."""
    return runner.run(SUITE, device=device, providers=providers, ops=ops, shapes=shapes, dtype=dtype,
                      quick=quick, ceilings=ceilings, progress=progress)


# ---- the per-op helpers by op name, as earlier versions of this module had them ------------------

def tensor_names(op: str) -> tuple[str, ...]:
    """Inputs in call order; the last one or two are parameters."""
    return SPECS[op].arg_names


def make_inputs(op: str, rows: int, cols: int, dtype: torch.dtype, device: torch.device,
                seed: int) -> dict[str, Tensor]:
    """Random inputs (never zeros), drawn in fp32 on `device` from `seed` and rounded once."""
    return SPECS[op].make_inputs(rows_cols(rows, cols, ""), dtype, device, seed)


def min_bytes(op: str, rows: int, cols: int, element_size: int, pass_name: str) -> int:
    """Minimum bytes a pass moves (module docstring)."""
    return SPECS[op].pass_bytes(rows_cols(rows, cols, ""), element_size, pass_name)


def nominal_flops(op: str, rows: int, cols: int, pass_name: str) -> int:
    """Nominal FLOPs of a pass."""
    return SPECS[op].pass_flops(rows_cols(rows, cols, ""), pass_name)


def liger_status(op: str) -> tuple[type | None, str]:
    """Liger-Kernel's module class for `op`, or None and the row status ("not installed" / reason)."""
    return load_peer(SPECS[op].liger.target)


def liger_kwargs(cls: type, op: str) -> dict[str, Any]:
    """Constructor arguments beyond (hidden_size, eps) for Liger's module `cls`."""
    return peer_kwargs(SPECS[op].liger, cls)


def gate(op: str, provider: str, fn: Any, shape: tuple[int, int] | spec.Shape, dtype: torch.dtype,
         device: torch.device, eager_result: GateResult | None,
         seed: int = 1234) -> tuple[list[TensorCheck], GateResult]:
    """`gate.gate` by op name: `fn` takes the inputs positionally, or is Liger's module class
    when `provider` is "liger"; `shape` is (rows, cols) or a Shape."""
    bench = SPECS[op]
    where = shape if isinstance(shape, spec.Shape) else rows_cols(*shape, "")
    impl = Impl(fn, bench.liger if provider == "liger" else None)
    return _gate(bench, impl, where, dtype, device, eager_result, seed)


def __getattr__(name: str) -> Any:
    # `Shape(rows, cols, config)` was this module's shape class; shapes are now spec.Shape with named dims
    if name == "Shape":
        warnings.warn("norm.Shape(rows, cols, config) is deprecated: use norm.rows_cols(rows, cols, config) "
                      "(a spec.Shape)", DeprecationWarning, stacklevel=2)
        return rows_cols
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADD_RMS_NORM",
    "CPU_SHAPES",
    "CUDA_SHAPES",
    "GATE_MAX_ELEMENTS",
    "GATE_MIN_ROWS",
    "LAYER_NORM",
    "NAME",
    "OPS",
    "PASSES",
    "PROVIDERS",
    "RMS_NORM",
    "SPECS",
    "SUITE",
    "gate",
    "gate_rows",
    "hf_add_rms_norm",
    "hf_layer_norm",
    "hf_rms_norm",
    "liger_kwargs",
    "liger_status",
    "make_inputs",
    "min_bytes",
    "nominal_flops",
    "rows_cols",
    "run",
]
