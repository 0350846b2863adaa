"""Weight-only quantized matmuls at decode shapes: our int8/int4/fp8 kernels against bf16 F.linear and
torchao's weight-only configs, in one run, in roofline terms.

    python benchmarks/bench_quant_matmul.py --out benchmarks/results            # GPU, ~2 min
    python benchmarks/bench_quant_matmul.py --sweep --out DIR                   # + our config alternatives
    python benchmarks/bench_quant_matmul.py --sweep --batches 1 --providers bf16,ours-int8,ours-int4,ours-fp8
                                                                                # the gemv sweep alone
    python benchmarks/bench_quant_matmul.py --quick --device cpu                # tiny shapes: the pipeline

Shapes: M tokens (1, 8, 32: batch-1..32 decode) x the (N, K) projections of Llama-3-8B: q/o (4096, 4096),
gate/up (14336, 4096), down (4096, 14336); bf16 activations, the weights drawn at random (N(0, 1/K)).
Providers, each a row per shape (a failure or a missing package is a row with the reason):
  bf16                        F.linear on the bf16 weight (cuBLAS): the baseline
  ours-int8, ours-fp8         functional.quant_linear, backend="triton": one scale per output row
  ours-int4                   the same, groups of --group (128) inputs with zero points
  torchao-int8, torchao-fp8, torchao-int4    deploy.quantize(backend="torchao") on an nn.Linear
Each row's output is checked before it is timed: ours against the reference (tolerances.compare_matmul);
bf16 and torchao against the float layer within 2 x the rounding their weights' grid allows
(sum_k |x_k| x step / 2, deploy.quantize.rounding_variance's step) plus the bf16 table's entry.
Timing: do_bench-style CUDA events with L2 flushed (`benchmark.timer.time_fn`) and CUDA-graph replay
rotating over copies of the weight (`benchmark.graph_timer.time_cuda_graph`); bytes = the weight's
parts + x + y, so GB/s and % of the copy ceiling measured in the same run (`measure_ceilings(force=True)`)
say how close each call comes to reading its weight at the memory's speed. `--sweep` adds rows of our
kernels under other launch configs (tuning.override), the measurements that choose
ops/quant_matmul/config.py's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_pytorch.benchmark.ceilings import device_name, measure_ceilings, roofline  # noqa: E402
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph  # noqa: E402
from kernel_pytorch.benchmark.results import BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import free_device_memory, resolve_device, rotation_copies, time_fn  # noqa: E402
from kernel_pytorch.tolerances import BUDGET_FACTOR, compare_matmul, tolerance_for  # noqa: E402

SHAPES = {"q/o": (4096, 4096), "gate/up": (14336, 4096), "down": (4096, 14336)}  # name -> (N, K), Llama-3-8B
QUICK_SHAPES = {"tiny": (96, 128)}
BATCHES = (1, 8, 32)
PROVIDERS = ("bf16", "ours-int8", "ours-int4", "ours-fp8", "torchao-int8", "torchao-int4", "torchao-fp8")
CONFIG = "Llama-3-8B"


@dataclasses.dataclass
class Layer:
    """One provider's call on one weight, and how to check it."""

    call: Callable[[Tensor], Tensor]
    nbytes: int  # the weight's bytes as the call reads them
    check: Callable[[Tensor, Tensor], tuple[bool, str]]


def _nbytes(*ts: Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _bound_check(x: Tensor, w: Tensor, step: Tensor | None) -> Callable[[Tensor, Tensor], tuple[bool, str]]:
    """|y - x @ w.T| <= 2 x sum_k |x_k| step_nk / 2 + the output dtype's table entry (step None: none)."""
    ref = x.float() @ w.float().t()
    half = torch.zeros_like(ref) if step is None else x.float().abs() @ (step.float() / 2).t()
    tol = tolerance_for(x.dtype)

    def check(y: Tensor, _x: Tensor) -> tuple[bool, str]:
        err = (y.float() - ref).abs()
        allowed = BUDGET_FACTOR * half + tol.atol + tol.rtol * ref.abs()
        ok = bool((err <= allowed).all())
        return ok, f"max err {float(err.max()):.3g} within {BUDGET_FACTOR:g} x rounding bound" if ok else \
            f"max err {float(err.max()):.3g} exceeds {BUDGET_FACTOR:g} x rounding bound (worst excess " \
            f"{float((err - allowed).max()):.3g})"

    return check


def build(provider: str, w: Tensor, group: int, backend: str) -> Layer:
    """The provider's layer for the bf16 weight w (N, K)."""
    import torch.nn.functional as F

    from kernel_pytorch.functional import quant_linear
    from kernel_pytorch.reference import quant_matmul as R

    if provider == "bf16":
        return Layer(lambda x: F.linear(x, w), _nbytes(w), lambda y, x: _bound_check(x, w, None)(y, x))
    kind, scheme = provider.split("-")
    if kind == "ours":
        parts = R.quantize(w, scheme, group)
        kw = {"zero": parts["zero"], "group_size": group} if scheme == "int4" else {}

        def call(x: Tensor) -> Tensor:
            return quant_linear(x, parts["qweight"], parts["scale"], scheme=scheme, backend=backend, **kw)

        deq = R.dequantize(parts, scheme, group, torch.float64)

        def check(y: Tensor, x: Tensor) -> tuple[bool, str]:
            ref = getattr(R, f"{scheme}_matmul")(x, *(
                (parts["qweight"], parts["scale"], parts["zero"], group) if scheme == "int4"
                else (parts["qweight"], parts["scale"])), None)
            c = compare_matmul(y, ref, x.double().abs() @ deq.abs().t(), w.shape[1])
            return c.passed, c.message("y vs reference")

        return Layer(call, _nbytes(*parts.values()), check)
    if kind == "torchao":
        from kernel_pytorch.deploy.quantize import quantize, rounding_variance, tensors_of

        layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_(w)
        step = (12 * rounding_variance(w, scheme)).sqrt()
        quantize(layer, scheme)
        return Layer(layer, _nbytes(*tensors_of(layer.state_dict()).values()),
                     lambda y, x: _bound_check(x, w, step)(y, x))
    raise ValueError(f"unknown provider {provider!r}; providers: {', '.join(PROVIDERS)}")


# gemv tiles to time against the default, (block_n, block_k, num_warps): bytes a step (int4: half) from
# 4 to 32 KiB, 32 to 256 bytes a thread; none that ptxas spills for sm_90 (int4 at 16 x 2048 does)
GEMV_TILES = {
    "int8": ((8, 1024, 4), (16, 512, 4), (16, 2048, 4), (32, 1024, 8)),
    "fp8": ((8, 1024, 4), (32, 1024, 8)),
    "int4": ((16, 1024, 4), (16, 512, 4), (8, 2048, 4), (32, 1024, 8)),
}


def _with(cfg: object, scheme: str, path: str, **changes: object) -> object:
    """cfg with `changes` to scheme's launch of `path` ("gemv" or "split_k")."""
    launches = cfg.scheme(scheme)
    launch = dataclasses.replace(getattr(launches, path), **changes)
    return dataclasses.replace(cfg, **{scheme: dataclasses.replace(launches, **{path: launch})})


def variants(cfg: object, m: int) -> Iterator[tuple[str, object]]:
    """(label, QuantMatmulConfig) alternatives to the default for --sweep, those of the path M takes:
    gemv (M <= gemv_max_m): tl.dot instead, K sliced for 1, 4 or 8 programs per SM, 1, 2 or 4 stages
    (1: no pipelining), other tiles;
    split_k: programs per SM and block_n."""
    if m <= cfg.gemv_max_m:
        yield "gemv off (M = 1 on tl.dot)", dataclasses.replace(cfg, gemv_max_m=0)
        for scheme in ("int8", "int4", "fp8"):
            g = cfg.scheme(scheme).gemv
            for per_sm in (1, 4, 8):
                yield f"{scheme} gemv {per_sm}/SM", _with(cfg, scheme, "gemv", programs_per_sm=per_sm)
            for stages in (1, 2, 4):
                if stages != g.num_stages:
                    yield f"{scheme} gemv {stages} stages", _with(cfg, scheme, "gemv", num_stages=stages)
            for bn, bk, warps in GEMV_TILES[scheme]:
                if (bn, bk, warps) != (g.block_n, g.block_k, g.num_warps):
                    yield (f"{scheme} gemv {bn} x {bk} {warps} warps",
                           _with(cfg, scheme, "gemv", block_n=bn, block_k=bk, num_warps=warps))
        return
    if m > cfg.decode_max_m:
        return
    for scheme in ("int8", "int4", "fp8"):
        for per_sm in (1, 4, 8):
            yield f"{scheme} split_k {per_sm}/SM", _with(cfg, scheme, "split_k", programs_per_sm=per_sm)
        for bn in (64, 256):
            yield f"{scheme} split_k block_n {bn}", _with(cfg, scheme, "split_k", block_n=bn)


def measure(results: BenchmarkResults, provider: str, label: str, name: str, m: int, n: int, k: int,
            layers: list[Layer], x: Tensor, dev: torch.device, quick: bool) -> Row:
    """One row: the layer's output checked, then timed; a failure (a kernel that does not compile, a
    config that does not launch) is the row's status, so one config's failure costs its row only."""
    row = results.add(Row(op=f"quant matmul {name} N={n} K={k}", shape=[m, n, k], config=CONFIG,
                          dtype=str(x.dtype).removeprefix("torch."), provider=provider, pass_name=label))
    try:
        ok, text = layers[0].check(layers[0].call(x), x)
        row.note = text
        if not ok:
            row.status = "wrong"
            return row
        nbytes = layers[0].nbytes + _nbytes(x) + m * n * x.element_size()
        fns = [lambda layer=layer: layer.call(x) for layer in layers]
        if label.endswith("graph"):
            eager = time_fn(fns, device=dev, rep_ms=20.0)
            row.set_timing(time_cuda_graph(fns, device=dev, call_ms=eager.median_ms))
        else:
            row.set_timing(time_fn(fns, device=dev, rep_ms=10.0 if quick else 100.0, cpu_min_run_time=0.05))
        row.bytes = nbytes
        row.set_roofline(roofline(row.median_ms, nbytes=nbytes, flops=2 * m * n * k, ceilings=results.ceilings))
    except Exception as exc:  # noqa: BLE001
        row.status, row.note = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
    return row


def run(args: argparse.Namespace) -> BenchmarkResults:
    from kernel_pytorch.ops import tuning

    dev = resolve_device(args.device)
    results = BenchmarkResults("quant_matmul", device_name(dev), smoke=args.quick)
    results.ceilings = measure_ceilings(dev, force=True)
    results.notes.append(f"weight-only int4 in groups of {args.group}; rows checked before timing (module "
                         "docstring); bytes = the weight's parts + x + y")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    batches = tuple(int(b) for b in args.batches.split(","))
    providers = [p for p in args.providers.split(",") if p]
    backend = "triton" if dev.type == "cuda" else "auto"
    passes = ("events, L2 flushed", "cuda graph") if dev.type == "cuda" else ("cpu",)
    g = torch.Generator(device="cpu").manual_seed(0)
    for name, (n, k) in shapes.items():
        w = (torch.randn(n, k, generator=g) * k ** -0.5).to(torch.bfloat16).to(dev)
        for provider in providers:
            try:
                layers = [build(provider, w, args.group, backend)]
                # copies of the weight (as the provider stores it) spanning twice the L2: graph replays
                # read every weight from memory, as a model's layers do
                copies = rotation_copies(layers[0].nbytes, dev, max_copies=32)
                layers += [build(provider, w.clone(), args.group, backend) for _ in range(copies - 1)]
            except Exception as exc:  # noqa: BLE001 (a provider that cannot be built is a row saying why)
                for m in batches:
                    results.add(Row(op=f"quant matmul {name} N={n} K={k}", shape=[m, n, k], config=CONFIG,
                                    dtype="bfloat16", provider=provider, pass_name="-", status="error",
                                    note=f"{type(exc).__name__}: {str(exc)[:200]}"))
                continue
            for m in batches:
                x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(dev)
                for label in passes:
                    measure(results, provider, label, name, m, n, k, layers, x, dev, args.quick)
                if args.sweep and provider.startswith("ours"):
                    for what, cfg in variants(tuning.current("quant_matmul"), m):
                        if provider.split("-")[1] in what or what.startswith("gemv off"):
                            label = f"{provider} [{what}]"
                            with tuning.override(quant_matmul=cfg):
                                measure(results, label, passes[-1], name, m, n, k, layers, x, dev, args.quick)
            del layers
            free_device_memory(dev)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one tiny shape, short timing: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/quant_matmul-<time>)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated providers")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated M (tokens)")
    parser.add_argument("--group", type=int, default=128, help="int4 group size of ours (32, 64, 128)")
    parser.add_argument("--sweep", action="store_true", help="also time our kernels under other launch configs")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path("bench-results") / f"quant_matmul-{time.strftime('%Y%m%d-%H%M%S')}"
    results = run(args)
    js, md = results.write(out)
    print(f"wrote {js} and {md}")
    # torchao's rows may say that this install lacks a scheme's kernels; every other row must pass
    failed = [r for r in results.rows if not r.ok and not (r.status == "error" and r.provider.startswith("torchao"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
