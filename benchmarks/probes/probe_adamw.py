"""AdamW's step on the e2e Llama's parameters: torch's fused and foreach AdamW against
kernel_pytorch.optim.AdamW at each launch config (AdamConfig's block x num_warps), one run, with the copy
ceiling measured in it.

    python benchmarks/probes/probe_adamw.py                        # CUDA: the e2e benchmark's 0.9B bf16 parameters
    python benchmarks/probes/probe_adamw.py --variants 2048x4,4096x8 --rep-ms 300
    python benchmarks/probes/probe_adamw.py --quick --device cpu   # a tiny model through the interpreter: the pipeline

Each provider steps the same parameters and gradients (bf16, state in bf16 as torch creates it): 3 steps
of warm-up, then `benchmark.timer.time_fn` over `--rep-ms` of steps (CUDA events around each step, the
median printed; host time included, as a training loop sees it). Bytes per step: p, g, m, v read and p,
m, v written. Before timing, each of ours is checked against torch's fused AdamW: three steps from the
same state, parameters within one bf16 rounding (the same update, rounded once; reference/adam.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kernel_pytorch.benchmark.ceilings import measure_copy_gbps  # noqa: E402
from kernel_pytorch.benchmark.timer import time_fn  # noqa: E402
from kernel_pytorch.ops import tuning  # noqa: E402
from kernel_pytorch.ops.adam import AdamConfig  # noqa: E402
from kernel_pytorch.optim import AdamW  # noqa: E402


def llama_shapes(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, vocab: int) -> list[tuple[int, ...]]:
    """The parameter shapes of an HF LlamaForCausalLM (untied embeddings), in module order."""
    kv = hidden // heads * kv_heads
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (inter, hidden), (inter, hidden),
             (hidden, inter), (hidden,), (hidden,)]
    return [(vocab, hidden), *layer * layers, (hidden,), (vocab, hidden)]


def make(shapes, dev, dtype, seed=0) -> list[torch.nn.Parameter]:
    g = torch.Generator(device=dev).manual_seed(seed)  # drawn where they live: 0.9B values on the host take minutes
    params = [torch.nn.Parameter(torch.randn(s, generator=g, device=dev).to(dtype)) for s in shapes]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g, device=dev) * 1e-2).to(dtype)
    return params


def kernel_ms(opt: torch.optim.Optimizer, dev: torch.device, steps: int = 5) -> float:
    """The device's kernel time per step (the profiler's CUDA kernels; 0 on CPU)."""
    if dev.type != "cuda":
        return 0.0
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            opt.step()
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA" and "emcpy" not in e.name)
    return total / steps / 1e3


def check(shapes, dev, dtype) -> str:
    """Ours against torch's fused AdamW, three steps from the same parameters and gradients."""
    ours, theirs = make(shapes, dev, dtype), make(shapes, dev, dtype)
    a = AdamW(ours, lr=1e-3, backend="triton" if dev.type == "cuda" else "auto")
    b = torch.optim.AdamW(theirs, lr=1e-3, fused=True)
    for _ in range(3):
        a.step()
        b.step()
    beyond, differ, total = 0, 0, 0
    for p, q in zip((p.detach().float() for p in ours), (q.detach().float() for q in theirs), strict=True):
        d = (p - q).abs()
        # one rounding apart: at most the dtype's spacing at the larger of the two
        beyond += int((d > torch.finfo(dtype).eps * torch.maximum(p.abs(), q.abs())).sum())
        differ += int((d > 0).sum())
        total += p.numel()
    return (f"ours against torch's fused AdamW after 3 steps: {differ} of {total} parameters differ, "
            f"{beyond} by more than one rounding")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="1024x4p,512x4,1024x2,1024x4,1024x8,2048x8",
                    help="BLOCKxNUM_WARPS pairs for ours (AdamConfig's block and num_warps); a trailing p: "
                         "the IEEE sqrt and divisions (precise_math)")
    ap.add_argument("--rep-ms", type=float, default=200.0, help="time_fn's measured span per optimizer")
    ap.add_argument("--quick", action="store_true", help="a two-layer toy model")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev, dtype = torch.device(args.device), torch.bfloat16
    shapes = llama_shapes(64, 176, 2, 4, 2, 512) if args.quick else llama_shapes(2048, 5632, 8, 16, 8, 128256)
    n = sum(torch.Size(s).numel() for s in shapes)
    nbytes = 7 * 2 * n
    copy = measure_copy_gbps(dev) if dev.type == "cuda" else None
    print(f"{len(shapes)} tensors, {n / 1e6:.1f}M parameters, {nbytes / 1e9:.2f} GB a step (7 passes of bf16); "
          f"copy ceiling {copy or 0:.0f} GB/s", flush=True)
    print(check(shapes, dev, dtype), flush=True)
    rows = [("torch fused", lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True)),
            ("torch foreach", lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True))]
    for v in args.variants.split(","):
        block, warps = (int(x) for x in v.rstrip("p").split("x"))
        precise = v.endswith("p")
        rows.append((f"ours {v}", AdamConfig(block=block, num_warps=warps, precise_math=precise)))
    for name, factory in rows:
        params = make(shapes, dev, dtype)
        if isinstance(factory, AdamConfig):
            tuned = tuning.override(adam=factory)
            opt = AdamW(params, lr=1e-3, backend="triton" if dev.type == "cuda" else "auto")
        else:
            tuned, opt = contextlib.nullcontext(), factory(params)
        with tuned:
            for _ in range(3):  # the first steps allocate the state
                opt.step()
            ms = time_fn(opt.step, device=dev, rep_ms=args.rep_ms, flush_l2=False).median_ms  # 12 GB: L2 moot
            kernel = kernel_ms(opt, dev)
        cells = []
        for t in (ms, kernel):
            rate = nbytes / t / 1e6 if t else 0.0
            cells.append(f"{t:7.3f} ms {rate:5.0f} GB/s {100 * rate / copy:5.1f}%" if copy and t else f"{t:7.3f} ms")
        print(f"{name:>16}: step {cells[0]} | kernels {cells[1]}", flush=True)
        del opt, params
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
