"""Model-level prefill: one forward of a batch-1 prompt of 4096 tokens through an HF LlamaForCausalLM that fills
a StaticCache and returns the logits of the last position only (`logits_to_keep=1`, as generate() asks),
transformers eager and compiled against ours (`optimize()` then the same compile), beside the model's GEMMs
alone at the same shapes (the floor) timed in the same process.

    python benchmarks/bench_prefill.py --out benchmarks/results       # H100: the benchmark's config, ~3 min
    python benchmarks/bench_prefill.py --quick --device cpu           # tiny config: checks the pipeline

Model: bench_decode.py's random HF Llama (hidden 2048, intermediate 5632, 8 layers, 16/8 heads, vocab 128256,
bf16; no download); a StaticCache of exactly the prompt's length, allocated before timing; each call rewinds
the cache's write position to 0 (an eager fill, inside the timed call) and runs the forward with
cache_position 0..T-1.

Providers, each in its own try/except (a failure is a row with the reason):
  gemm-floor        the model's GEMMs alone, back to back with its own weights: per layer q, k, v, o, gate, up
                    and down at M = 4096 tokens, then the lm_head at M = 1 (the floor the target is read against)
  gemm+sdpa-floor   the same GEMMs with causal SDPA at 4096 in each layer (K/V expanded to every head first,
                    so the flash kernel runs): how far a provider is from its GEMMs plus its attention
  hf-eager          transformers' forward, eager (what generate() runs: it leaves the prefill uncompiled)
  hf-compile        the same forward under torch.compile in the default mode (Inductor's fusions, no CUDA
                    graphs). transformers compiles only the decode step, with mode="reduce-overhead", because
                    a one-token step is bound by its launches; a 4096-token prefill is bound by its GEMMs, so
                    CUDA graphs would buy little inside the compiled call, and the graph figure is taken apart
                    (below) for every provider alike
  ours              kernel_pytorch.optimize(model) (module swaps, validated on a short prompt), then the same compile
Before timing, each provider's last-position logits are checked against the same model (its bf16 weights)
upcast to fp32 (fp64 when the run is fp32): a provider passes within 2 x hf-eager's own error against it + a
floor (`tolerances.fp64_budget`, bench_decode's rule). Timing: `time_fn` (CUDA events, L2 flushed, the median
after warm-up), then `time_cuda_graph` (the same call replayed from a CUDA graph: no launch cost; a row's note
says when capture is not possible). Each row: ms per prefill, tokens/s, % of each floor (floor ms / ms), the
GEMMs' TFLOP/s (their FLOPs / ms) and the CUDA allocator's peak. `--paired A,B` times those rows again in turns
in one loop (`benchmark.paired`); run it with gpu_check.sh's KP_SMI_LOG=1 to log the clock and power beside.
New providers stop starting once `--budget-s` could not hold another; results are written after every row
and on SIGINT; the exit code is nonzero if any row failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # hf_llama, prefill_floor, prefill_report

from hf_llama import (  # noqa: E402
    Reference,
    allocated_cache,
    cache_kwarg,
    cast,
    check_logits,
    exact_fp32,
    failure_status,
    free,
    hf_model,
    hi_dtype,
    max_abs,
    optimized,
    rewind_hf,
    versions,
)
from prefill_floor import FLOORS, QUICK, Prefill, Size, attention_flops, floor_prefill, gemm_flops  # noqa: E402
from prefill_report import write  # noqa: E402

from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.benchmark.decode import compiled_frames  # noqa: E402
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import Timing, resolve_device, time_fn  # noqa: E402

PROVIDERS = (*FLOORS, "hf-eager", "hf-compile", "ours")


def prompt(size: Size, dev: torch.device) -> Tensor:
    """The seeded prompt ids (B, T) every provider reads."""
    g = torch.Generator(device="cpu").manual_seed(7)
    return torch.randint(0, size.vocab, (size.batch, size.tokens), generator=g).to(dev)


def compiled(fn: Callable, backend: str) -> Callable:
    """fn under torch.compile: Inductor's default mode for `inductor`, eager for `none`, else `backend`."""
    if backend == "none":
        return fn
    return torch.compile(fn) if backend == "inductor" else torch.compile(fn, backend=backend)


def hf_prefill(provider: str, size: Size, dev: torch.device, dtype: torch.dtype, backend: str, ids: Tensor) -> Prefill:
    """hf-eager, hf-compile, ours: transformers' forward over the prompt into a StaticCache of T slots."""
    model = hf_model(size, dev, dtype)
    if provider == "ours":
        model = optimized(model, size.vocab, min(size.tokens, 128), dev)
    cache = allocated_cache(size, model.config, size.tokens, size.batch, dev, dtype)
    cache_position = torch.arange(size.tokens, device=dev)
    position_ids = cache_position.unsqueeze(0).expand(size.batch, -1)
    if provider != "hf-eager":
        model.forward = compiled(model.forward, backend)  # the instance's forward; hooks stay outside
    kwargs = {cache_kwarg(model): cache}

    def run() -> Tensor:
        rewind_hf(cache, 0)
        return model(input_ids=ids, position_ids=position_ids, cache_position=cache_position, use_cache=True,
                     logits_to_keep=1, **kwargs).logits

    return Prefill(run, provider != "hf-eager" and backend != "none", [model, cache])


def build(provider: str, size: Size, dev: torch.device, dtype: torch.dtype, backend: str, ids: Tensor) -> Prefill:
    if provider in FLOORS:
        return floor_prefill(provider, size, dev, dtype)
    if provider in ("hf-eager", "hf-compile", "ours"):
        return hf_prefill(provider, size, dev, dtype, backend, ids)
    raise ValueError(f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)})")


def reference_logits(size: Size, dev: torch.device, dtype: torch.dtype, ids: Tensor) -> Reference:
    """hf-eager's prefill logits in `dtype`, then the same model upcast to `hi_dtype(dtype)` (the same weights:
    bf16 -> fp32 is exact) over the same prompt without a cache; one model resident at a time."""
    t0 = time.perf_counter()
    with torch.no_grad():
        eager = hf_prefill("hf-eager", size, dev, dtype, "none", ids)
        low = eager.run().detach().clone()
        model = eager.keep[0]
        del eager
        free(dev)
        cast(model, hi_dtype(dtype))
        with exact_fp32():
            hi = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits.detach().clone()
    del model
    free(dev)
    return Reference(hi, low, time.perf_counter() - t0)


def pass_name(provider: str, backend: str) -> str:
    if provider == "gemm-floor":
        return "GEMMs alone (floor)"
    if provider == "gemm+sdpa-floor":
        return "GEMMs + causal SDPA (floor)"
    if provider == "hf-eager" or backend == "none":
        return "prefill (eager)"
    return "prefill (compiled, default mode)" if backend == "inductor" else f"prefill (compiled, backend {backend})"


def make_row(provider: str, size: Size, dtype: torch.dtype, backend: str, **kw: Any) -> Row:
    return Row(op=f"prefill B={size.batch} T={size.tokens}", shape=[size.batch, size.tokens], config=size.label,
               dtype=str(dtype).removeprefix("torch."), provider=provider, pass_name=pass_name(provider, backend),
               **kw)


def graph_timing(run: Callable[[], Tensor], dev: torch.device, call_ms: float) -> tuple[Timing | None, str]:
    """The call replayed from a CUDA graph, or None and why not."""
    if dev.type != "cuda":
        return None, "CUDA-graph replay: CUDA only"
    from kernel_pytorch.benchmark.graph_timer import time_cuda_graph

    try:
        return time_cuda_graph(run, device=dev, call_ms=call_ms), ""
    except Exception as exc:  # noqa: BLE001 (a capture or replay that fails is the note, the row stands)
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"CUDA-graph replay not possible ({first})"


def measure(provider: str, pre: Prefill, size: Size, dev: torch.device, dtype: torch.dtype, backend: str,
            reference: Reference | None, floors: dict[str, float], entry: dict) -> list[Row]:
    """Check the provider's logits, warm up, time (events, then graph replay); its rows, `entry` filled in."""
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    out = pre.run()  # the first call compiles; its output is checked
    ok, check = True, "GEMMs only: no logits to check"
    if not pre.gemm_only:
        ok, check, entry["check"] = check_logits(out.detach(), reference)
    del out
    for _ in range(2 if pre.compiled else 0):
        pre.run()
    peak = None
    if cuda:  # one call's peak, before time_fn allocates its L2-flush buffer
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        pre.run()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
    warm_s = time.perf_counter() - t0
    frames = compiled_frames()
    timing = time_fn(pre.run, device=dev, rep_ms=size.rep_ms)
    recompiles = compiled_frames() - frames
    graph, why = graph_timing(pre.run, dev, timing.median_ms)
    flops = gemm_flops(size)
    rows = []
    for t, label in ((timing, ""), (graph, " (cuda graph replay)")):
        if t is None:
            continue
        row = make_row(provider, size, dtype, backend, flops=flops, tflops=flops / (t.median_ms * 1e9),
                       peak_mem_bytes=peak, peak_mem_method="cuda allocator peak of one call" if peak else "")
        row.pass_name += label
        row.set_timing(t)
        rows.append(row)
    tok_s = size.batch * size.tokens / (timing.median_ms / 1e3)
    vs = {f: floors[f] / timing.median_ms for f in FLOORS if f in floors}
    pct = ", ".join(f"{100 * v:.1f}% of {f}" for f, v in vs.items())
    graph_txt = f"CUDA-graph replay {graph.median_ms:.4g} ms" if graph else why
    rows[0].note = (f"{tok_s:,.0f} tok/s; {pct + '; ' if pct else ''}GEMMs {rows[0].tflops:.1f} TFLOP/s; {check}; "
                    f"{graph_txt}; {recompiles} frames compiled while timing; build + check + warm-up {warm_s:.1f} s")
    entry.update(ms=timing.median_ms, q20_ms=timing.q20_ms, q80_ms=timing.q80_ms, tokens_per_s=tok_s,
                 graph_ms=graph.median_ms if graph else None, graph_note=why, gemm_tflops=rows[0].tflops,
                 peak_mib=peak / 2**20 if peak else None, warmup_s=warm_s,
                 recompiles=recompiles, **{f"pct_of_{f.replace('+sdpa', '_sdpa').replace('-', '_')}": 100 * v
                                           for f, v in vs.items()})
    if not ok:
        for row in rows:
            row.status = "failed: correctness"
    return rows


def clock_mhz(dev: torch.device) -> str:
    """The SM clock now, for the paired rows' note ("not read" without NVML)."""
    try:
        return f"{torch.cuda.clock_rate(dev)} MHz"
    except Exception:  # noqa: BLE001 (pynvml missing or the query unsupported: the note says so)
        return "not read"


def paired_timings(kept: dict[str, Prefill], dev: torch.device) -> tuple[dict[str, Timing], str]:
    """The kept providers timed in turns (`benchmark.paired`); (timings, how, with the clock before and after)."""
    from kernel_pytorch.benchmark.paired import paired_cpu, paired_cuda

    fns = {name: pre.run for name, pre in kept.items()}
    if dev.type != "cuda":
        timings, stats = paired_cpu(fns)
        return timings, f"perf_counter in turns, {stats.describe()}"
    before = clock_mhz(dev)
    timings, stats = paired_cuda(fns, dev)
    return timings, (f"CUDA events, back-to-back calls in turns, {stats.describe()}; SM clock {before} before, "
                     f"{clock_mhz(dev)} after")


def run(size: Size, dev: torch.device, dtype: torch.dtype, backend: str, providers: tuple[str, ...],
        paired: tuple[str, ...], budget_s: float, out: Path, smoke: bool) -> tuple[BenchmarkResults, int]:
    """Every provider in its own try/except within the budget, then the paired rows; written after each row;
    (results, exit code)."""
    start = time.perf_counter()
    results = BenchmarkResults(name="prefill", device=device_name(dev), smoke=smoke)
    vers = versions()
    results.notes += [
        "versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
        f"batch {size.batch} x {size.tokens} prompt tokens into a StaticCache of {size.tokens} slots, logits of the "
        f"last position (logits_to_keep=1); tok/s = prompt tokens / median ms; GEMM TFLOP/s = the "
        f"{gemm_flops(size) / 1e12:.3g} TFLOP of the GEMMs (q, k, v, o, gate, up, down x {size.layers} layers at "
        f"M={size.batch * size.tokens}, lm_head at M={size.batch}) / ms; causal attention adds "
        f"{attention_flops(size) / 1e12:.3g} TFLOP",
        "compile: " + {"inductor": "torch.compile, default mode (no CUDA graphs inside the call)",
                       "none": "none (--backend none): every provider runs eager"}.get(
                           backend, f"torch.compile(backend={backend!r})")]
    if smoke:
        results.notes.append("quick run: tiny config; checks the pipeline, says nothing about speed")
    ids = prompt(size, dev)
    summary: list[dict] = []
    floors: dict[str, float] = {}
    kept: dict[str, Prefill] = {}
    reference: Reference | None = None
    tried_reference, slowest, failed = False, 0.0, False
    try:
        for p in providers:
            entry: dict[str, Any] = {"provider": p}
            elapsed = time.perf_counter() - start
            if elapsed + slowest > budget_s:
                rows = [make_row(p, size, dtype, backend, status="skipped",
                                 note=f"the {budget_s:.0f} s budget could not hold it ({elapsed:.0f} s spent, the "
                                      f"slowest provider took {slowest:.0f} s)")]
            else:
                if not tried_reference and p not in FLOORS:  # once, before the first checked provider
                    tried_reference = True
                    reference, ref_failed = _reference(size, dev, dtype, ids, results)
                    failed |= ref_failed
                t0 = time.perf_counter()
                pre = None
                try:
                    with torch.no_grad():
                        pre = build(p, size, dev, dtype, backend, ids)
                        rows = measure(p, pre, size, dev, dtype, backend, reference, floors, entry)
                    if p in FLOORS and rows[0].ok:
                        floors[p] = entry["ms"]
                    if p in paired:
                        kept[p] = pre
                except Exception as exc:  # noqa: BLE001 (one provider's failure must not lose the others)
                    status, note = failure_status(exc)
                    rows = [make_row(p, size, dtype, backend, status=status, note=note)]
                pre = None  # freed below unless kept for the paired rows
                slowest = max(slowest, time.perf_counter() - t0)
                if not paired:  # paired rows keep their compiled code
                    free(dev)
            failed |= any(not (r.ok or r.status == "skipped") for r in rows)
            entry.update(status=rows[0].status, note=rows[0].note)
            summary.append(entry)
            for r in rows:
                results.add(r)
                print(f"{r.provider:>16} {r.pass_name:>40}: {r.status} {r.median_ms or 0:.4g} ms  {r.note}", flush=True)
            write(results, summary, vers, out)
        if len(kept) >= 2:
            with torch.no_grad():
                timings, how = paired_timings(kept, dev)
            for name, t in timings.items():
                row = make_row(name, size, dtype, backend, flops=gemm_flops(size),
                               tflops=gemm_flops(size) / (t.median_ms * 1e9), note=how)
                row.pass_name += " (paired)"
                row.set_timing(t)
                results.add(row)
                next(s for s in summary if s["provider"] == name).update(
                    paired_ms=t.median_ms, paired_q20_ms=t.q20_ms, paired_q80_ms=t.q80_ms, paired_method=how)
        elif paired:
            results.notes.append(f"--paired {','.join(paired)}: fewer than two of them timed, nothing paired")
    except KeyboardInterrupt:  # Ctrl-C or a time limit (SIGINT): what finished is written, said so
        results.notes.append(f"{PARTIAL_NOTE} after {len(results.rows)} rows; the rows missing were not measured")
        failed = True
    kept.clear()
    results.notes.append(f"wall time {time.perf_counter() - start:.0f} s of a {budget_s:.0f} s budget")
    write(results, summary, vers, out)
    return results, 1 if failed else 0


def _reference(size: Size, dev: torch.device, dtype: torch.dtype, ids: Tensor,
               results: BenchmarkResults) -> tuple[Reference | None, bool]:
    """The reference logits and a note saying what they are; (None, True) when they could not be made."""
    try:
        ref = reference_logits(size, dev, dtype, ids)
    except Exception as exc:  # noqa: BLE001 (the providers still run, unchecked; the run fails)
        free(dev)
        results.notes.append(f"logits not checked: the reference failed ({failure_status(exc)[1]})")
        return None, True
    from kernel_pytorch.tolerances import BUDGET_FACTOR

    results.notes.append(
        f"logits check: the last position's logits against the same model and prompt in {ref.label} (no cache; "
        f"built in {ref.seconds:.1f} s; hf-eager's max abs err against it {max_abs(ref.eager, ref.hi):.3g}); a "
        f"provider passes within {BUDGET_FACTOR:g} x hf-eager's err + floor (tolerances.fp64_budget)")
    return ref, False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, no compile: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/prefill-<time>)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting providers after this (s)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated providers")
    parser.add_argument("--paired", default="", help="comma-separated providers timed again in turns, e.g. "
                        "hf-compile,ours,gemm-floor")
    parser.add_argument("--backend", default=None, help="inductor (default mode), eager, aot_eager or none (no "
                        "compile); default inductor, none with --quick")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--tokens", type=int, default=None, help="prompt length (default 4096; --quick 64)")
    args = parser.parse_args(argv)
    dev = resolve_device(args.device)
    size = QUICK if args.quick else Size()
    if args.tokens:
        if args.tokens < 1:
            parser.error(f"--tokens must be >= 1, got {args.tokens}")
        size = Size(**{**size.__dict__, "tokens": args.tokens})
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if dev.type == "cuda" else torch.float32
    backend = args.backend or ("none" if args.quick else "inductor")
    out = Path(args.out) if args.out else Path("bench-results") / f"prefill-{time.strftime('%Y%m%d-%H%M%S')}"
    providers = tuple(p for p in args.providers.split(",") if p)
    paired = tuple(p for p in args.paired.split(",") if p)
    unknown = [p for p in paired if p not in providers]
    if unknown:
        parser.error(f"--paired names providers not in --providers: {', '.join(unknown)}")
    results, code = run(size, dev, dtype, backend, providers, paired, args.budget_s, out, smoke=args.quick)
    print(f"wrote {out}/prefill_*.json and .md")
    return 130 if results.partial else code


if __name__ == "__main__":
    sys.exit(main())
