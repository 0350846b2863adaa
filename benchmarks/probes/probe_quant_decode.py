"""GPU probe: where a weight-only quantized decode step spends its time.

Builds benchmarks/bench_decode.py's decoder (the 8-layer, hidden-2048 HF Llama, optimize()d, a filled
static cache) for each provider, compiles its forward the way the benchmark does, runs a few decode
steps and prints the kernels of one profiled step by device time: which kernel the int8 path runs (a
weight-only int8 matmul, or a dequantize-then-matmul) and what it costs against the bf16 GEMMs.

Usage, from the repo root with PYTHONPATH=src (torchao installed):
  python3 benchmarks/probes/probe_quant_decode.py                        ours, ours+int8, ours+fp8 at batch 8
  python3 benchmarks/probes/probe_quant_decode.py --providers ours+int8 --batch 1 --backend inductor
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import traceback
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_decode.py"


def _bench():  # noqa: ANN202 (the benchmark script as a module)
    spec = importlib.util.spec_from_file_location("bench_decode", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def profile_provider(bench, provider: str, batch: int, backend: str, rows: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    size = bench.Size(batch=batch)
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    dec = bench.hf_decoder(provider, size, batch, dev, torch.bfloat16, backend)
    ids = torch.randint(0, size.vocab, (batch, 1), device=dev)
    start = size.cache // 2
    pos = torch.full((batch, 1), start, dtype=torch.long, device=dev)
    cpos = torch.tensor([start], dtype=torch.long, device=dev)
    graphs = backend == "inductor"

    def step() -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        dec.rewind(start)
        return dec.forward(ids, pos, cpos)

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    t = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) * 1e3 / 20
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(f"\n== {provider}, batch {batch}, backend {backend}: {ms:.3f} ms per step (host included); "
          f"build + compile {build_s:.1f} s; rtol {dec.rtol}")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=90))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--providers", default="ours,ours+int8,ours+fp8")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--backend", default="inductor", help="as bench_decode's --backend (inductor: reduce-overhead)")
    p.add_argument("--rows", type=int, default=14)
    args = p.parse_args()
    bench = _bench()
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    for provider in args.providers.split(","):
        try:
            with torch.no_grad():  # inference, as the benchmark runs it
                profile_provider(bench, provider, args.batch, args.backend, args.rows)
        except Exception:  # noqa: BLE001 - one provider's failure is reported, the rest still run
            print(f"== {provider}: FAILED\n{traceback.format_exc(limit=-4)}")
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
