"""Model-level prefill: one forward of a batch-1 prompt that fills a static KV cache and returns the last
position's logits (`logits_to_keep=1`, as generate() asks for), transformers eager and compiled against
ours (`optimize()` then the same compile), beside two floors timed in the same run.

    python benchmarks/bench_prefill.py --out benchmarks/results      # H100: 4096 tokens, ~3 min
    python benchmarks/bench_prefill.py --quick --device cpu          # tiny config: checks the pipeline

Model: the decode benchmark's random HF Llama (bench_decode.Size: hidden 2048, intermediate 5632, 8 layers,
16/8 heads, vocab 128256, bf16; no download), a StaticCache of `--tokens` slots (4096) at batch 1.
Providers, in this order, each in its own try/except (a failure is a row with the reason):
  hf-eager     transformers' forward with the StaticCache, cache_position 0..T-1 and logits_to_keep=1
  hf-compile   the same forward under torch.compile (default mode: a prefill runs a few hundred kernels of
               tens of microseconds or more, so CUDA graphs, reduce-overhead's addition, save little, and
               transformers compiles only the decode step with them)
  ours         kernel_pytorch.optimize(model) (module swaps, validated on a short prompt), then the same compile
  gemm-floor   the model's GEMMs alone at the prefill's shapes (q, k, v, o, gate, up, down of every layer
               at T rows, the LM head at one row), back to back, with the model's own weights
  gemm+attention-floor   the same GEMMs and causal SDPA (GQA) of every layer at T tokens
Each row is timed twice, both in the same process: CUDA events around single calls after warm-up (the
do_bench protocol, `benchmark.timer.time_fn`, L2 not flushed: a prefill reads far more than L2), and CUDA-graph
replay (`benchmark.graph_timer.time_cuda_graph`), which leaves the host's launch time out; a provider that
cannot be captured says so in its graph row. Each row gives ms, tokens/s, its floors' time over its own
(% of the floor), the GEMMs' TFLOP/s (their nominal FLOPs over the row's time; with causal attention's
too) and the allocator's peak.
Before timing, each provider's last-position logits are checked against the same model upcast to fp32
with the same prompt (bench_decode's rule: within 2 x hf-eager's own error + a floor, `tolerances.fp64_budget`).
New providers stop starting once `--budget-s` could not hold another; results are written after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import bench_decode as decode  # noqa: E402

from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph  # noqa: E402
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import Timing, resolve_device, time_fn  # noqa: E402

BASELINE = "hf-compile"
PROVIDERS = ("hf-eager", "hf-compile", "ours", "gemm-floor", "gemm+attention-floor")
FLOORS = ("gemm-floor", "gemm+attention-floor")
SIZE = dataclasses.replace(decode.Size(), batch=1, cache=4096)
QUICK = dataclasses.replace(decode.QUICK, batch=1, cache=64)


def gemm_flops(size: decode.Size, tokens: int) -> int:
    """Nominal FLOPs of the prefill's GEMMs: every layer's projections at `tokens` rows, the LM head at one."""
    kv = size.kv_heads * size.head_dim
    per_token = size.hidden * (2 * size.hidden + 2 * kv) + 3 * size.hidden * size.intermediate
    return 2 * (tokens * per_token * size.layers + size.hidden * size.vocab)


def attention_flops(size: decode.Size, tokens: int) -> int:
    """Nominal FLOPs of causal attention at `tokens` tokens: QK^T and PV over the lower triangle."""
    return 2 * 2 * size.heads * size.head_dim * tokens * (tokens + 1) // 2 * size.layers


@dataclasses.dataclass
class Prefill:
    """One provider's prefill: `call()` -> last position's logits (1, 1, V) (None for a floor); `keep`
    holds what keeps it alive."""

    call: Callable[[], Tensor | None]
    keep: list[Any]


def hf_prefill(provider: str, size: decode.Size, dev: torch.device, dtype: torch.dtype, compile_: bool,
               ids: Tensor) -> Prefill:
    """hf-eager, hf-compile, ours: transformers' forward over the prompt into a fresh StaticCache (its write
    position rewound before every call: a few tiny fills, the same for every provider)."""
    model = decode.hf_model(size, dev, dtype)
    if provider == "ours":
        model = decode.optimized(model, size, dev)
    cache = decode.static_cache(model.config, size.cache, 1, dev, dtype)
    if compile_:
        model.forward = torch.compile(model.forward)  # the instance's forward; hooks stay outside
    positions = torch.arange(ids.shape[1], device=dev)

    def call() -> Tensor:
        decode.rewind_hf(cache, 0)
        out = model(input_ids=ids, position_ids=positions[None], cache_position=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        return out.logits

    return Prefill(call, [model, cache])


def floor_prefill(provider: str, size: decode.Size, dev: torch.device, dtype: torch.dtype, tokens: int) -> Prefill:
    """The GEMMs (and with `+attention`, causal SDPA) of a prefill, on the model's weights and random rows."""
    model = decode.hf_model(size, dev, dtype)
    layers = [(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, m.gate_proj.weight,
               m.up_proj.weight, m.down_proj.weight)
              for a, m in ((layer.self_attn, layer.mlp) for layer in model.model.layers)]
    head = model.lm_head.weight
    g = torch.Generator(device="cpu").manual_seed(3)
    x = torch.randn(tokens, size.hidden, generator=g).to(dev, dtype)
    h = torch.randn(tokens, size.intermediate, generator=g).to(dev, dtype)
    with_attention = provider == "gemm+attention-floor"
    shape_q, shape_kv = (1, size.heads, tokens, size.head_dim), (1, size.kv_heads, tokens, size.head_dim)

    def call() -> None:
        for wq, wk, wv, wo, wg, wu, wd in layers:
            q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
            if with_attention:
                q = F.scaled_dot_product_attention(q.view(shape_q), k.view(shape_kv), v.view(shape_kv),
                                                   is_causal=True, enable_gqa=True).view(tokens, -1)
            F.linear(q, wo)
            F.linear(x, wg), F.linear(x, wu)
            F.linear(h, wd)
        F.linear(x[-1:], head)

    return Prefill(call, [model])


def reference_logits(size: decode.Size, dev: torch.device, dtype: torch.dtype, ids: Tensor) -> decode.Reference:
    """hf-eager's last-position logits in `dtype`, then those of the same model upcast to bench_decode's
    reference dtype (the same weights exactly) with the same prompt and an upcast cache."""
    t0 = time.perf_counter()
    out = {}
    for key, dt in (("eager", dtype), ("hi", decode.hi_dtype(dtype))):
        model = decode.cast(decode.hf_model(size, dev, dtype), dt)
        cache = decode.static_cache(model.config, size.cache, 1, dev, dt)
        positions = torch.arange(ids.shape[1], device=dev)
        with torch.no_grad(), decode.exact_fp32():
            out[key] = model(input_ids=ids, position_ids=positions[None], cache_position=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1).logits.detach().clone()
        del model, cache
        decode._free(dev)
    return decode.Reference(out["hi"], out["eager"], time.perf_counter() - t0)


def _row(provider: str, size: decode.Size, dtype: torch.dtype, dev: torch.device, graph: bool, **kw: Any) -> Row:
    """A row of one provider and timing (every provider's rows share a pass name: the ratio column compares
    them all with hf-compile's)."""
    how = "CUDA-graph replay" if graph else "cuda events per call" if dev.type == "cuda" else "wall clock per call"
    return Row(op=f"prefill B=1 T={size.cache}", shape=[1, size.cache], config=size.label,
               dtype=str(dtype).removeprefix("torch."), provider=provider, pass_name=f"prefill ({how})", **kw)


def _fill(row: Row, timing: Timing, size: decode.Size, tokens: int, floors: dict[str, float]) -> None:
    """Timing, tokens/s, the GEMMs' TFLOP/s and this row's floors over its time (% of each floor)."""
    row.set_timing(timing)
    ms = timing.median_ms
    row.flops = gemm_flops(size, tokens)
    row.tflops = row.flops / (ms * 1e-3) / 1e12
    with_attention = (row.flops + attention_flops(size, tokens)) / (ms * 1e-3) / 1e12
    parts = [f"{tokens / (ms * 1e-3):,.0f} tok/s", f"GEMMs {row.tflops:.3g} TFLOP/s",
             f"GEMMs + attention {with_attention:.3g} TFLOP/s"]
    parts += [f"{name} {100 * floors[name] / ms:.0f}%" for name in FLOORS if name in floors]
    row.note = "; ".join(parts) + (f"; {row.note}" if row.note else "")


def measure(provider: str, size: decode.Size, dev: torch.device, dtype: torch.dtype, compile_: bool, ids: Tensor,
            reference: decode.Reference | None, floors: dict[str, dict[bool, float]]) -> tuple[list[Row], dict]:
    """Build, check, then time one provider by events and by CUDA-graph replay: its rows and summary."""
    tokens = ids.shape[1]
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    floor = provider in FLOORS
    p = floor_prefill(provider, size, dev, dtype, tokens) if floor else hf_prefill(
        provider, size, dev, dtype, compile_ and provider != "hf-eager", ids)
    summary: dict[str, Any] = {"provider": provider, "tokens": tokens}
    check = ""
    ok = True
    if not floor:
        ok, check, summary["check"] = decode.check_logits(p.call().detach().clone(), reference)
    for _ in range(2):  # warm-up: compiles, autotuning, the allocator's growth
        p.call()
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    summary["warmup_s"] = time.perf_counter() - t0
    rows = []
    for graph in (False, True):
        row = _row(provider, size, dtype, dev, graph, note=check)
        try:
            if graph and not cuda:
                raise RuntimeError("CUDA-graph replay needs a CUDA device")
            timing = (time_cuda_graph(p.call, device=dev, call_ms=rows[0].median_ms) if graph
                      else time_fn(p.call, device=dev, flush_l2=False))
        except Exception as exc:  # noqa: BLE001 (a provider that cannot be captured keeps its event row)
            row.status = "not capturable" if cuda else "skipped"
            row.note = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            rows.append(row)
            continue
        own = {name: by[graph] for name, by in floors.items() if graph in by}
        _fill(row, timing, size, tokens, own)
        if cuda:
            row.peak_mem_bytes = torch.cuda.max_memory_allocated(dev)
            row.peak_mem_method = "cuda allocator peak over the timed calls (weights, cache, activations)"
        if not ok:
            row.status = "failed: correctness"
        summary["graph_ms" if graph else "ms"] = timing.median_ms
        if floor:
            floors.setdefault(provider, {})[graph] = timing.median_ms
        rows.append(row)
    return rows, summary


def run(size: decode.Size, dev: torch.device, dtype: torch.dtype, compile_: bool, providers: tuple[str, ...],
        budget_s: float, out: Path, smoke: bool) -> tuple[BenchmarkResults, int]:
    """The floors first (every provider's row compares with them), then the providers; each in its own try,
    written after each; (results, exit code)."""
    start = time.perf_counter()
    results = BenchmarkResults(name="prefill", device=device_name(dev), smoke=smoke)
    results.notes.append("versions: " + ", ".join(f"{k} {v}" for k, v in decode.versions().items()))
    results.notes.append(f"batch 1, a prompt of {size.cache} seeded random tokens into a StaticCache of {size.cache} "
                         "slots, the last position's logits (logits_to_keep=1); compile: "
                         + ("torch.compile, default mode" if compile_ else "none (every provider eager)"))
    if smoke:
        results.notes.append("quick run: tiny config; checks the pipeline, says nothing about speed")
    g = torch.Generator(device="cpu").manual_seed(11)
    ids = torch.randint(0, size.vocab, (1, size.cache), generator=g).to(dev)
    order = [p for p in providers if p in FLOORS] + [p for p in providers if p not in FLOORS]
    floors: dict[str, dict[bool, float]] = {}
    summary: list[dict] = []
    reference, failed, slowest = None, False, 0.0
    try:
        for provider in order:
            elapsed = time.perf_counter() - start
            if provider not in PROVIDERS:
                rows = [_row(provider, size, dtype, dev, False, status="error",
                             note=f"unknown provider {provider!r}; known: {', '.join(PROVIDERS)}")]
            elif elapsed + slowest > budget_s:
                rows = [_row(provider, size, dtype, dev, False, status="skipped",
                             note=f"the {budget_s:.0f} s budget could not hold it ({elapsed:.0f} s spent)")]
            else:
                if reference is None and provider not in FLOORS:
                    reference = reference_logits(size, dev, dtype, ids)
                    results.notes.append(f"logits check: the last position against the same model in "
                                         f"{reference.label} (built in {reference.seconds:.1f} s)")
                t0 = time.perf_counter()
                try:
                    with torch.no_grad():
                        rows, entry = measure(provider, size, dev, dtype, compile_, ids, reference, floors)
                    summary.append(entry)
                except Exception as exc:  # noqa: BLE001 (one provider's failure must not lose the others)
                    first = str(exc).splitlines()[0][:300] if str(exc) else ""
                    rows = [_row(provider, size, dtype, dev, False, status="error",
                                 note=f"{type(exc).__name__}: {first}")]
                slowest = max(slowest, time.perf_counter() - t0)
                decode._free(dev)
            for row in rows:
                failed |= not (row.ok or row.status in ("skipped", "not capturable"))
                results.add(row)
                print(f"{row.provider:>22} {row.pass_name:>40}: {row.status} {row.median_ms or 0:.4g} ms  {row.note}",
                      flush=True)
            write(results, summary, out)
    except KeyboardInterrupt:
        results.notes.append(f"{PARTIAL_NOTE} after {len(results.rows)} rows; the rows missing were not measured")
        failed = True
    results.notes.append(f"wall time {time.perf_counter() - start:.0f} s of a {budget_s:.0f} s budget")
    write(results, summary, out)
    return results, 1 if failed else 0


def summary_markdown(summary: list[dict]) -> str:
    """Per timing, each provider against hf-compile and the floors; the targets' line for ours."""
    by = {s["provider"]: s for s in summary}
    lines = ["## Prefill summary", "",
             "| timing | provider | ms | vs hf-compile | % of gemm-floor | % of gemm+attention-floor |",
             "| --- | --- | --- | --- | --- | --- |"]
    for key, timing in (("ms", "per call"), ("graph_ms", "CUDA-graph replay")):
        base = by.get(BASELINE, {}).get(key)
        for s in summary:
            ms = s.get(key)
            if ms is None:
                continue
            ratio = f"{base / ms:.2f}x" if base else "-"
            pct = [f"{100 * by[f][key] / ms:.0f}%" if by.get(f, {}).get(key) else "-" for f in FLOORS]
            lines.append(f"| {timing} | {s['provider']} | {ms:.4g} | {ratio} | {pct[0]} | {pct[1]} |")
    ours, base, floor = by.get("ours", {}), by.get(BASELINE, {}), by.get("gemm-floor", {})
    if ours.get("ms") and base.get("ms") and floor.get("ms"):
        lines += ["", f"ours: {base['ms'] / ours['ms']:.2f}x hf-compile and {100 * floor['ms'] / ours['ms']:.0f}% of "
                  "the GEMM floor (per call; targets: at least 1.00x, and within 10% of the floor, i.e. "
                  ">= 91%)"]
    return "\n".join(lines) + "\n"


def write(results: BenchmarkResults, summary: list[dict], out: Path) -> None:
    """prefill.json (the results schema plus a "prefill" summary) and prefill.md."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    data = results.to_dict()
    data["prefill"] = summary
    (out / "prefill.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "prefill.md").write_text(results.to_markdown(baseline=BASELINE) + "\n" + summary_markdown(summary))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, no compile: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/prefill-<time>)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting providers after this (s)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated providers")
    parser.add_argument("--tokens", type=int, default=None, help="prompt length (default 4096; --quick 64)")
    parser.add_argument("--no-compile", action="store_true", help="run hf-compile and ours eager (CPU checks)")
    args = parser.parse_args(argv)
    dev = resolve_device(args.device)
    size = QUICK if args.quick else SIZE
    if args.tokens is not None:
        if args.tokens < 1:
            parser.error(f"--tokens must be >= 1 (got {args.tokens})")
        size = dataclasses.replace(size, cache=args.tokens)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    out = Path(args.out) if args.out else Path("bench-results") / f"prefill-{time.strftime('%Y%m%d-%H%M%S')}"
    providers = tuple(p for p in args.providers.split(",") if p)
    results, code = run(size, dev, dtype, not args.no_compile, providers, args.budget_s, out, smoke=args.quick)
    print(f"wrote {out / 'prefill.json'} and {out / 'prefill.md'}")
    return 130 if results.partial else code


if __name__ == "__main__":
    sys.exit(main())
