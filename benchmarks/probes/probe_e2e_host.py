"""Where the end-to-end training step's host time goes: what the host does before the device runs, and
every call in the step that waits for the device.

    python benchmarks/probes/probe_e2e_host.py --providers torch.compile,ours+compile+adamw --out DIR
    python benchmarks/probes/probe_e2e_host.py --quick --device cpu --out /tmp/x      # the pipeline, on the CPU

Per provider (benchmarks/bench_e2e.py's model, optimizer and step): the median synchronised step and the
step run back to back; one step under `torch.cuda.set_sync_debug_mode("warn")` with the Python stack of
each synchronising call; then two synchronised steps under the profiler: each step's lead-in (the host's
start of the step to the device's first kernel) and tail (the last kernel's end to the host's return from
the sync), the device's time by kernel family with the idle time by gap size, what the host ran during
the lead-in (CPU events by start), the CPU events by self time, every
runtime call that can wait for the device with the ops it ran under, and a gzipped chrome trace.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

from e2e import models, profiling  # noqa: E402

# runtime calls that block the host until the device (or a stream) is done, or may
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemGetInfo", "cudaMemcpy",
         "cudaMalloc", "cudaFree", "cudaHostAlloc", "cuMemGetInfo")


def make_step(provider: str, size: models.Size, dev: torch.device, dtype: torch.dtype) -> Any:
    model = models.build(provider, size, dev, dtype)
    opt = models.make_optimizer(provider, model, dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=g).to(dev)

    def step() -> torch.Tensor:
        loss = models.loss_of(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sync_calls(step: Any, dev: torch.device) -> str:
    """One step with CUDA's sync debug mode on: each synchronising call and the Python frames above it."""
    if dev.type != "cuda":
        return "sync debug mode: CUDA only\n"
    seen: list[str] = []

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings.py" not in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-8:]))
        seen.append(f"{str(message).splitlines()[0][:100]}\n    {where}")

    old = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = old
    torch.cuda.synchronize(dev)
    return f"synchronising calls in one step (sync debug mode): {len(seen)}\n" + "".join(f"  {s}\n" for s in seen)


def category(name: str) -> str:
    """A kernel's family for the step's breakdown, from its name."""
    low = name.lower()
    if low.startswith("nvjet") or "gemm" in low or "cutlass" in low or "splitkreduce" in low:
        return "GEMMs (cuBLAS)"
    if "sdpa" in low or "cudnn" in low or "flash" in low:
        return "attention (cuDNN)"
    if "adam" in low or "multi_tensor" in low:
        return "optimizer"
    if low.startswith("triton_"):
        return "Inductor's kernels"
    if low.startswith("memset") or low.startswith("memcpy"):
        return "memsets and copies"
    if low.startswith("_"):
        return "ours: " + name.split("_kernel")[0].lstrip("_")
    return "other: " + name[:40]


def breakdown(kernels: list[tuple[float, float, str]]) -> list[str]:
    """Per category: kernel time (ms) and launches, largest first; then the idle time between kernels
    by gap size."""
    total: dict[str, list[float]] = {}
    for start, end, name in kernels:
        t = total.setdefault(category(name), [0.0, 0])
        t[0] += end - start
        t[1] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])
    lines = [f"    {ms / 1e3:8.3f} ms {n:5d}  {cat}" for cat, (ms, n) in ranked]
    gaps = {"< 5 us": 0.0, "5-20 us": 0.0, ">= 20 us": 0.0}
    for gap, _, _ in profiling.kernel_gaps(kernels)[2]:
        gaps["< 5 us" if gap < 5 else "5-20 us" if gap < 20 else ">= 20 us"] += gap
    lines.append("    idle between kernels: " + ", ".join(f"{k} {v / 1e3:.3f} ms" for k, v in gaps.items()))
    return lines


def _chain(e: Any, depth: int = 5) -> str:
    names = []
    p = e.cpu_parent
    while p is not None and len(names) < depth:
        names.append(p.name[:60])
        p = p.cpu_parent
    return " <- ".join(names) or "(top level)"


def profiled(step: Any, dev: torch.device, out: Path, tag: str) -> str:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for i in range(2):
            models.sync(dev)
            with record_function(f"probe_step_{i}"):
                step()
                models.sync(dev)
    events = prof.events()
    lines = []
    kernels = sorted(profiling.kernel_intervals(prof))
    cpu = [e for e in events if getattr(e, "device_type", None) == DeviceType.CPU]
    for i in range(2):
        mark = next(e for e in cpu if e.name == f"probe_step_{i}")
        t0, t1 = mark.time_range.start, mark.time_range.end
        ks = [k for k in kernels if t0 <= k[0] <= t1]
        if not ks:
            lines.append(f"step {i}: {(t1 - t0) / 1e3:.2f} ms on the host, no device events")
            continue
        first, last = ks[0][0], max(k[1] for k in ks)
        lines.append(f"step {i}: {(t1 - t0) / 1e3:.2f} ms; lead-in {(first - t0) / 1e3:.3f} ms, device span "
                     f"{(last - first) / 1e3:.2f} ms, tail {(t1 - last) / 1e3:.3f} ms")
        if i == 1:
            lines.append("  step 1's device time by kernel family (ms, launches):")
            lines += breakdown(ks)
        if i == 1:  # what the host ran before the first kernel: events starting in the lead-in, by start
            lines.append("  host events starting in step 1's lead-in (start us after the step's start, duration us):")
            early = sorted((e for e in cpu if t0 < e.time_range.start < first and e.time_range.elapsed_us() >= 20),
                           key=lambda e: e.time_range.start)
            lines += [f"    {e.time_range.start - t0:9.1f} {e.time_range.elapsed_us():9.1f}  {e.name[:90]}"
                      for e in early[:60]]
    waits = [e for e in cpu if e.name.startswith(WAITS)]
    lines.append(f"runtime calls that can wait ({len(waits)} in two steps; us, name, the ops above it):")
    lines += [f"  {e.time_range.elapsed_us():9.1f}  {e.name}  <- {_chain(e)}" for e in waits[:80]]
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    trace = out / f"trace_{tag}.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", default="torch.compile,ours+compile+adamw")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args(argv)
    from kernel_pytorch.benchmark.timer import resolve_device

    dev = resolve_device(args.device)
    size = models.QUICK if args.quick else models.Size()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    args.out.mkdir(parents=True, exist_ok=True)
    for provider in args.providers.split(","):
        step = make_step(provider, size, dev, dtype)
        for _ in range(4):
            step()
        models.sync(dev)
        samples = []
        for _ in range(args.steps):
            t = time.perf_counter()
            step()
            models.sync(dev)
            samples.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        models.sync(dev)
        b2b = (time.perf_counter() - t) * 1e3 / args.steps
        report = (f"== {provider}: synchronised step median {statistics.median(samples):.2f} ms "
                  f"(q20-q80 {statistics.quantiles(samples, n=5)[0]:.2f}-{statistics.quantiles(samples, n=5)[3]:.2f}); "
                  f"back to back {b2b:.2f} ms a step\n")
        report += sync_calls(step, dev)
        report += profiled(step, dev, args.out, provider.replace("+", "_"))
        print(report, flush=True)
        (args.out / f"host_{provider.replace('+', '_')}.txt").write_text(report)
        del step
        models.free(dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
