"""What is live at the end-to-end training step's memory peak, for variants of one provider.

    python benchmarks/probes/probe_e2e_memory.py --variants "ours+compile,ours+compile@noreuse,ours" [--out DIR]

Each variant builds the benchmark's model (benchmarks/bench_e2e.py: HF Llama, 4 x 2048 tokens, fused
AdamW), runs 3 warm-up steps and 6 timed ones (median step, allocator peak), then records one step's
allocator trace and prints what was live at its peak by allocating line; lines in Inductor's generated
code are printed with their source. A `+compile` provider (ours+compile, liger+compile) is the benchmark's
model compiled here whole. Options after `@`: `noreuse` compiles with Inductor's allow_buffer_reuse off (a
dead buffer is freed, not held for a later one of its size); `amb=F` sets
torch._functorch.config.activation_memory_budget to F before the first compile (the partitioner then
recomputes more to save less); `layers=N` changes the depth.

`--timeline FILE.json` also writes each variant's memory timeline over the recorded step (the bytes
allocated on top of the weights and optimizer state, `benchmark.memory_peak.allocated_over_time`), with
the device and versions; scripts/guide_figures.py draws it (the guide's memory figure):

    python benchmarks/probes/probe_e2e_memory.py --variants "eager,torch.compile,ours+compile@noreuse" \
        --timeline /tmp/memory_timeline.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

from e2e import models  # noqa: E402

from kernel_pytorch.benchmark.memory_peak import allocated_over_time, live_at_peak, record_trace  # noqa: E402


def source_of(frame: str) -> str:
    """The generated line a frame names ("dir/file.py:LINE in fn"), when it is Inductor's output."""
    if "torchinductor" not in frame:
        return ""
    rel, _, rest = frame.partition(":")
    line = int(rest.split()[0])
    for base in (Path("/tmp"), Path.home() / ".cache"):
        for path in base.glob(f"torchinductor*/{rel.split('/', 1)[1]}"):
            lines = path.read_text().splitlines()
            return lines[line - 1].strip()[:160] if line <= len(lines) else ""
    return ""


def run(variant: str, dev: torch.device) -> tuple[str, dict]:
    """One variant's report, and its timeline record (the model and optimizer are freed when it returns)."""
    provider, *opts = variant.split("@")
    size = models.Size()
    amb, reuse = None, True
    for opt in opts:
        key, _, value = opt.partition("=")
        if key == "noreuse":
            reuse = False
        elif key == "amb":
            amb = float(value)
        elif key == "layers":
            size = dataclasses.replace(size, layers=int(value))
        else:
            raise ValueError(f"unknown option {key!r} in {variant!r}")
    torch._dynamo.reset()
    old = torch._functorch.config.activation_memory_budget, torch._inductor.config.allow_buffer_reuse
    if amb is not None:
        torch._functorch.config.activation_memory_budget = amb
    torch._inductor.config.allow_buffer_reuse = reuse
    try:
        if provider.endswith("+compile"):  # compiled here, so that reuse on and off are both explicit
            model = torch.compile(models.build(provider.removesuffix("+compile"), size, dev, torch.bfloat16),
                                  options={"allow_buffer_reuse": reuse})
        else:
            model = models.build(provider, size, dev, torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0)).to(dev)

        def step() -> None:
            models.loss_of(model, ids).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        t0 = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        warm = time.perf_counter() - t0
        torch.cuda.empty_cache()  # the reserved peak of the steps, not of compiling
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(6):
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        peak = torch.cuda.max_memory_allocated() / 2**20
        reserved = torch.cuda.max_memory_reserved() / 2**20
        baseline, trace = record_trace(step, dev)
        breakdown, timeline = live_at_peak(trace, baseline), allocated_over_time(trace, baseline)
    finally:
        torch._functorch.config.activation_memory_budget, torch._inductor.config.allow_buffer_reuse = old
    lines = [f"== {variant}: step {statistics.median(times):.2f} ms (median of 6), peak {peak:.1f} MiB "
             f"(reserved {reserved:.1f}), "
             f"warm-up {warm:.1f} s", breakdown.table(60)]
    for g in breakdown.groups[:60]:
        src = source_of(g.frame)
        if src:
            lines.append(f"    {g.frame.rsplit('/', 1)[-1]}: {src}")
    record = {"step_ms": statistics.median(times), "peak_mib": peak, "reserved_mib": reserved,
              "timeline": timeline.to_dict()}
    return "\n".join(lines) + "\n", record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="ours+compile,ours")
    parser.add_argument("--out", default=None, help="also write the report here (a file)")
    parser.add_argument("--timeline", type=Path, default=None, help="write the variants' memory timelines here (JSON)")
    args = parser.parse_args()
    dev = torch.device("cuda")
    report = []
    timelines = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d", time.gmtime()), "model": dataclasses.asdict(models.Size()),
                 "variants": {}}
    try:
        import transformers

        timelines["transformers"] = transformers.__version__
    except ImportError:
        pass
    for variant in args.variants.split(","):
        try:
            text, record = run(variant, dev)
            timelines["variants"][variant] = record
        except Exception as exc:  # noqa: BLE001 - one variant failing is a line of the report
            text = f"== {variant}: failed: {type(exc).__name__}: {str(exc)[:300]}\n"
            timelines["variants"][variant] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        gc.collect()
        torch.cuda.empty_cache()
        print(text, flush=True)
        report.append(text)
        if args.timeline:  # after every variant, so a run stopped early keeps what it measured
            args.timeline.write_text(json.dumps(timelines, indent=1))
    if args.out:
        Path(args.out).write_text("".join(report))


if __name__ == "__main__":
    main()
