"""From torch.profiler events to kernel statistics: what ran per step, for how long, and how much work
(FLOPs, minimum bytes) each call did, where its shapes allow saying so.

A *kernel* is a CUDA kernel (memcpy and memset included) on the GPU. On the CPU it is the aten op that
does the work: an op outside the view and allocation ops whose time is not mostly spent in such ops
below it (`aten::linear` is dispatch around `aten::addmm`; `aten::addmm` is the kernel). Inductor's
generated C++ kernels do not show one by one: a compiled graph's own CPU time is one `generated` entry.

Each kernel is placed: `eager` (a run without compiled regions, or between graphs of a compiled one),
`generated` (Inductor's own kernels), `extern` (a library GEMM, convolution or attention kernel Inductor
calls on purpose) or `fallback` (any other aten op inside a compiled graph: an op Inductor did not
generate, so nothing fuses across it).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# ops that only change metadata or allocate: never a kernel of their own on the CPU
_NOT_WORK = frozenset(
    "view reshape _reshape_alias as_strided expand expand_as transpose t permute unsqueeze squeeze select "
    "slice narrow split split_with_sizes chunk unbind _unsafe_view detach alias lift_fresh empty empty_like "
    "empty_strided resize_ flatten unflatten view_as numpy_T result_type size stride contiguous to "
    "_to_copy lift is_nonzero set_ _local_scalar_dense item dim broadcast_tensors matmul linear dropout "
    "_has_compatible_shallow_copy_type new_empty new_empty_strided movedim swapaxes unfold resolve_conj "
    "resolve_neg _conj conj zeros_like_meta".split()
)
# aten ops Inductor calls on purpose in compiled code (library GEMMs, convolutions, attention)
_EXTERN = re.compile(
    r"^(mm|addmm|bmm|baddbmm|_int_mm|_scaled_mm|convolution|_convolution|cudnn_convolution\w*|"
    r"mkldnn_convolution|miopen_convolution\w*|_mkl_linear|mkldnn_linear|_scaled_dot_product\w*|"
    r"_flash_attention\w*|_efficient_attention\w*|_cudnn_attention\w*|_fused_sdp\w*|convolution_backward|"
    r"copy_|zero_|zeros|fill_|full|ones)$"  # (the last: buffers Inductor's wrapper code fills on purpose)
)
_COMPILED_REGION = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph")
_GENERATED_BLOCK = "## Call CompiledFxGraph"
_ELEMENT_SIZE = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}  # fmt: skip
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
_NORM_OPS = frozenset({"native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm", "native_batch_norm",
                       "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "native_group_norm"})
# nominal FLOPs per output element of ops that are more than one operation per element
_FLOPS_PER_ELEMENT = {"_softmax": 5, "softmax": 5, "_log_softmax": 5, "gelu": 8, "silu": 4, "sigmoid": 4}


@dataclass(frozen=True)
class KernelStat:
    """One kernel (or CPU op) of a profiled run, identical calls merged, per step.

    Attributes:
        name: the CUDA kernel's name; on the CPU the op's (`aten::mm`), or "Inductor-generated code".
        op: the op or launcher that ran it (`aten::mm`, `triton_poi_fused_mul_0`), "" when unknown.
        shapes: the op's input shapes (scalars are ()).
        dtypes: the op's input dtypes as the profiler names them ("float", "c10::BFloat16").
        where: "eager", "generated", "extern" or "fallback" (see the module docstring).
        calls: calls per step.
        ms: time per step, all calls together.
        flops: nominal FLOPs of one call (None: not attributable).
        nbytes: minimum bytes one call moves, each input read and each output written once (None: not
            attributable).
    """

    name: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    where: str
    calls: float
    ms: float
    flops: float | None = None
    nbytes: float | None = None

    @property
    def ms_per_call(self) -> float:
        return self.ms / self.calls if self.calls else 0.0

    @property
    def base_op(self) -> str:
        """The op's name without its namespace and overload: "aten::addmm" -> "addmm"."""
        return self.op.split("::")[-1].split(".")[0]


@dataclass(frozen=True)
class GpuActivity:
    """How busy the GPU was over the profiled steps (CUDA only).

    Attributes:
        busy_ms: time per step with at least one kernel running.
        span_ms: per step, from the first kernel's start to the last one's end.
        idle_fraction: 1 - busy / span: the GPU waiting for the host between kernels.
        median_kernel_us: the median kernel duration.
    """

    busy_ms: float
    span_ms: float
    idle_fraction: float
    median_kernel_us: float


def element_size(dtype: str) -> int | None:
    return _ELEMENT_SIZE.get(dtype)


def _shape(s: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in s) if isinstance(s, (list, tuple)) and all(isinstance(v, int) for v in s) else ()


def _tensor_args(shapes: Sequence[Any], dtypes: Sequence[str]) -> list[tuple[tuple[int, ...], int]]:
    """(shape, element size) of every tensor input, tensor lists flattened; scalars left out."""
    out: list[tuple[tuple[int, ...], int]] = []
    for i, s in enumerate(shapes):
        dtype = dtypes[i] if i < len(dtypes) else ""
        size = element_size(dtype)
        if isinstance(s, (list, tuple)) and s and all(isinstance(v, (list, tuple)) for v in s):
            known = size or next((element_size(d) for d in dtypes if element_size(d)), 4)
            out.extend((_shape(t), known) for t in s)
        elif size is not None and isinstance(s, (list, tuple)) and (s or dtype):
            out.append((_shape(s), size))
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _conv_out(spatial: Sequence[int], kernel: Sequence[int], concrete: Sequence[Any]) -> list[int] | None:
    """Output spatial size of aten::convolution from its stride/padding/dilation arguments."""
    try:
        stride, padding, dilation = (list(concrete[i]) for i in (3, 4, 5))
    except (IndexError, TypeError):
        return None
    n = len(spatial)
    stride, padding, dilation = ((v * n if len(v) == 1 else v) for v in (stride, padding, dilation))
    if not (len(stride) == len(padding) == len(dilation) == n):
        return None
    return [
        (spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(n)
    ]


def op_cost(
    op: str, shapes: Sequence[Any], dtypes: Sequence[str], concrete: Sequence[Any] = ()
) -> tuple[float | None, float | None]:
    """(nominal FLOPs, minimum bytes) of one call of `op` on inputs of these shapes; None where the op's
    work cannot be told from its shapes.

    Matmuls (mm, addmm, bmm, baddbmm): 2*M*N*K FLOPs. Convolutions: 2 * output elements * input
    channels per group * kernel size. Attention kernels: 4*B*H*L*S*E (QK^T and PV). Norms: 5 FLOPs per
    element. Elementwise and reductions: one FLOP per output element. Bytes: each tensor input once plus
    the output once (in-place ops write their first input).
    """
    base = op.split("::")[-1].split(".")[0]
    args = _tensor_args(shapes, dtypes)
    if not args:
        return None, None
    in_bytes = float(sum(_numel(s) * e for s, e in args))
    elt = args[0][1]
    if base in MATMUL_OPS:
        mats = [s for s, _ in args][1 if base in ("addmm", "baddbmm") else 0 :]  # addmm's first is the bias
        if len(mats) < 2:
            return None, None
        a, b = mats[0], mats[1]
        if len(a) not in (2, 3) or len(b) != len(a) or a[-1] != b[-2]:
            return None, None
        m, k, n = a[-2], a[-1], b[-1]
        batch = a[0] if len(a) == 3 else 1
        written = 0 if len(mats) > 2 else batch * m * n * elt  # an out= tensor is among the inputs
        return 2.0 * batch * m * n * k, in_bytes + written
    if base in ("convolution", "_convolution") and len(args) >= 2:
        x, w = args[0][0], args[1][0]
        if len(x) < 3 or len(w) != len(x):
            return None, None
        spatial = _conv_out(x[2:], w[2:], concrete)
        if spatial is None:
            return None, in_bytes
        out = x[0] * w[0] * _numel(spatial)
        return 2.0 * out * w[1] * _numel(w[2:]), in_bytes + out * elt
    if base.startswith(("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")):
        qkv = [s for s, _ in args[:3]]
        if len(qkv) < 3 or any(len(s) != 4 for s in qkv) or "backward" in base:
            return None, None
        (b, h, lq, e), (_, _, s, _), (_, _, _, ev) = qkv
        return 2.0 * b * h * lq * s * (e + ev), in_bytes + b * h * lq * ev * elt
    out_numel = max(_numel(s) for s, _ in args)
    if base in _NORM_OPS:
        return 5.0 * out_numel, in_bytes + out_numel * elt
    if base == "embedding" or base == "index_select":
        rows = _numel(args[1][0]) if len(args) > 1 else 0
        width = args[0][0][-1] if args[0][0] else 1
        return None, 2.0 * rows * width * elt + (_numel(args[1][0]) * args[1][1] if len(args) > 1 else 0)
    if base in ("cat", "stack"):
        return None, 2.0 * in_bytes
    if base == "copy_":  # copy_(dst, src): src read, dst written, each counted once
        written = 0.0
    elif base.endswith("_"):  # in place: the first input is written back
        written = float(_numel(args[0][0]) * elt)
    else:
        written = float(out_numel * elt)
    return float(_FLOPS_PER_ELEMENT.get(base, 1) * out_numel), in_bytes + written


def _in_region(event: Any) -> bool:
    """Whether `event` runs inside a compiled graph (a "Torch-Compiled Region", "CompiledFunction")."""
    p = getattr(event, "cpu_parent", None)
    while p is not None:
        if p.name.startswith(_COMPILED_REGION):
            return True
        p = p.cpu_parent
    return False


def _base(name: str) -> str:
    return name.split("::")[-1].split(".")[0]


def _is_op(name: str) -> bool:
    return bool(re.match(r"^\w+::\w", name)) and not name.startswith(("autograd::", "profiler::"))


def _is_work(name: str) -> bool:
    return _is_op(name) and _base(name) not in _NOT_WORK


def _is_launcher(name: str) -> bool:
    return _is_op(name) or name.startswith("triton_")


def place(op_name: str, in_region: bool) -> str:
    """Where a kernel launched by `op_name` belongs: "generated", "extern", "fallback" or "eager"."""
    if op_name.startswith("triton_"):
        return "generated"
    if not in_region:
        return "eager"
    return "extern" if _EXTERN.match(_base(op_name)) else "fallback"


def _cost_source(op: Any) -> Any:
    """The event whose shapes tell a kernel's work: a convolution's backend op (mkldnn_convolution,
    cudnn_convolution) takes its work from the aten::convolution above it, whose arguments are known."""
    if "convolution" in op.name and _base(op.name) not in ("convolution", "_convolution"):
        p = op.cpu_parent
        while p is not None and "convolution" in p.name:
            if _base(p.name) in ("convolution", "_convolution"):
                return p
            p = p.cpu_parent
    return op


# str(torch dtype) -> the profiler's name for it
_PROFILER_DTYPE = {"torch.float32": "float", "torch.float64": "double", "torch.bfloat16": "c10::BFloat16",
                   "torch.float16": "c10::Half"}


def _input_dtypes(op: Any, fallback: str | None) -> tuple[str, ...]:
    """The dtypes the profiler recorded for `op`'s inputs. Releases before torch 2.13 record none on
    FunctionEvent: then every input is taken to be `fallback` (the model's dtype; index tensors are
    then counted at that size too), or nothing is known."""
    recorded = getattr(op, "input_dtypes", None)
    if recorded is not None:
        return tuple(str(d) for d in recorded)
    return (fallback,) * len(op.input_shapes or ()) if fallback else ()


class _Merge:
    """Identical calls (name, op, shapes, dtypes, placement) summed into `KernelStat`s."""

    def __init__(self, dtype: Any = None) -> None:
        self.rows: dict[tuple[Any, ...], list[Any]] = {}
        self.fallback = _PROFILER_DTYPE.get(str(dtype)) if dtype is not None else None

    def add(self, name: str, op: Any, us: float, where: str) -> None:
        raw = list(op.input_shapes or ()) if op is not None else []
        shapes = tuple(_shape(s) for s in raw)
        dtypes = _input_dtypes(op, self.fallback) if op is not None else ()
        key = (name, op.name if op is not None else "", shapes, dtypes, where)
        row = self.rows.get(key)
        if row is not None:
            row[0] += 1
            row[1] += us
            return
        flops = nbytes = None
        if op is not None:
            src = _cost_source(op)
            src_dtypes = list(_input_dtypes(src, self.fallback))
            flops, nbytes = op_cost(src.name, src.input_shapes or (), src_dtypes, src.concrete_inputs or ())
            num_gb = (getattr(op, "kwinputs", None) or {}).get("kernel_num_gb")
            if isinstance(num_gb, (int, float)) and num_gb > 0:
                nbytes = float(num_gb) * 1e9  # Inductor's own count for its kernels
            if op.name.startswith("triton_"):
                flops = None  # a generated kernel's args say what it moves, not what it computes
        self.rows[key] = [1, us, flops, nbytes]

    def stats(self, steps: int) -> tuple[KernelStat, ...]:
        out = [
            KernelStat(name, op, shapes, dtypes, where, calls / steps, us / 1e3 / steps, flops, nbytes)
            for (name, op, shapes, dtypes, where), (calls, us, flops, nbytes) in self.rows.items()
        ]
        return tuple(sorted(out, key=lambda k: -k.ms))


def _cpu(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).endswith("CPU")


def cpu_kernels(events: Iterable[Any], steps: int, dtype: Any = None) -> tuple[KernelStat, ...]:
    """The CPU ops doing the work (see the module docstring), merged, per step, slowest first. `dtype`:
    the model's, assumed for inputs where this torch's profiler records no dtypes."""
    merge = _Merge(dtype)
    roots = [e for e in events if _cpu(e) and getattr(e, "cpu_parent", None) is None]

    def visit(e: Any) -> float:
        """Adds the kernels at or below `e`; returns the CPU time (us) they account for."""
        below = sum(visit(c) for c in e.cpu_children)
        total = float(e.cpu_time_total)
        if e.name.startswith(_GENERATED_BLOCK):  # Inductor's C++ kernels: the graph's own time
            merge.add("Inductor-generated code", None, max(total - below, 0.0), "generated")
            return total
        if not _is_work(e.name):
            return below
        own = total - below
        if below == 0.0 or own >= 0.5 * total:
            merge.add(e.name, e, own, place(e.name, _in_region(e)))
            return total
        return below

    for root in roots:
        visit(root)
    return merge.stats(steps)


def cuda_kernels(events: Sequence[Any], steps: int, dtype: Any = None,
                 ) -> tuple[tuple[KernelStat, ...], GpuActivity | None]:
    """The device kernels of a CUDA profile per step, each attributed to the op that launched it (as
    torch.profiler attaches them), and how busy the GPU was. `dtype` as in `cpu_kernels`."""
    merge = _Merge(dtype)
    attached_us = 0.0
    attached = 0
    for e in events:
        if not _cpu(e) or not getattr(e, "kernels", None):
            continue
        op = e
        while op is not None and not _is_launcher(op.name):
            op = op.cpu_parent
        where = place(op.name, _in_region(op)) if op is not None else "eager"
        for k in e.kernels:
            merge.add(k.name, op, float(k.duration), where)
            attached_us += float(k.duration)
            attached += 1
    device = [e for e in events if not _cpu(e) and "CUDA" in str(e.device_type)]
    intervals = [(float(k.time_range.start), float(k.time_range.end)) for k in device]
    rest = sum(e - s for s, e in intervals) - attached_us
    if len(device) > attached and rest > 0:  # replayed from a CUDA graph: no op launched them
        for _ in range(len(device) - attached):
            merge.add("kernels replayed from a CUDA graph", None, rest / (len(device) - attached), "generated")
    return merge.stats(steps), gpu_activity(intervals, steps)


def gpu_activity(intervals: Sequence[tuple[float, float]], steps: int) -> GpuActivity | None:
    """Busy time (the union of the kernel intervals, in us) against the span they cover, per step."""
    if not intervals:
        return None
    ordered = sorted(intervals)
    busy, cur_start, cur_end = 0.0, ordered[0][0], ordered[0][1]
    for start, end in ordered[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    span = max(e for _, e in ordered) - ordered[0][0]
    median = statistics.median(e - s for s, e in ordered)
    idle = 1.0 - busy / span if span > 0 else 0.0
    return GpuActivity(busy / 1e3 / steps, span / 1e3 / steps, max(idle, 0.0), median)


__all__ = [
    "MATMUL_OPS",
    "GpuActivity",
    "KernelStat",
    "cpu_kernels",
    "cuda_kernels",
    "element_size",
    "gpu_activity",
    "op_cost",
    "place",
]
