"""Which optimize() component families run under torch.compile on this GPU: one fresh process per set
of families (a CUDA fault poisons its process), each building bench_e2e's HF Llama at the e2e widths
(fewer layers), `optimize(components=...)`, `torch.compile`, and running fused-AdamW training steps;
then the loss against the eager optimized model's on the same step.

    python scripts/probe_compile_components.py                       # the default sets, 2 layers
    python scripts/probe_compile_components.py --sets embedding loss,embedding --layers 2
    CUDA_LAUNCH_BLOCKING=1 python scripts/probe_compile_components.py --one embedding   # one set, in-process
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

DEFAULT_SETS = ("auto", "norms,mlp,attention", "embedding", "loss", "loss,embedding")


def one(families: str, layers: int, batch: int, seq: int) -> None:
    import torch
    from bench_e2e import Size, hf_model

    from kernel_pytorch.optimize import optimize

    size = Size(layers=layers, batch=batch, seq=seq)
    dev = torch.device("cuda")
    model = hf_model(size, dev, torch.bfloat16)
    components = "auto" if families == "auto" else families.split(",")
    ids = torch.randint(0, size.vocab, (1, 128), device=dev)
    model, report = optimize(model, {"input_ids": ids, "labels": ids}, components=components, compile=False,
                             seeds=(0,))
    print(f"[{families}] {len(report.applied())} modules replaced; validated={report.passed}", flush=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, size.vocab, (batch, seq), generator=g).to(dev)
    with torch.no_grad():
        eager_loss = model(input_ids=ids, labels=ids).loss.float().item()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    t0 = time.perf_counter()
    for i in range(3):
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        if i == 0:
            torch.cuda.synchronize()
            grads = sum(p.grad.float().norm().item() ** 2 for p in model.parameters() if p.grad is not None)
            print(f"[{families}] step 0: loss {loss.item():.5f} (eager {eager_loss:.5f}), |grad| {grads ** 0.5:.4g}",
                  flush=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"[{families}] ok: 3 compiled steps in {time.perf_counter() - t0:.1f} s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=list(DEFAULT_SETS), help="comma-separated families per set")
    parser.add_argument("--one", default=None, help="run this one set in this process")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--timeout-s", type=float, default=150)
    args = parser.parse_args()
    if args.one is not None:
        one(args.one, args.layers, args.batch, args.seq)
        return 0
    failed = 0
    for s in args.sets:
        cmd = [sys.executable, __file__, "--one", s, "--layers", str(args.layers), "--batch", str(args.batch),
               "--seq", str(args.seq)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
            tail = [ln for ln in lines if ln.startswith(f"[{s}]")] or []
            if done.returncode != 0:
                failed += 1
                errors = [ln for ln in lines if "Error" in ln or "error" in ln][-4:]
                tail += [f"[{s}] FAILED rc={done.returncode}"] + [f"    {ln[:300]}" for ln in errors]
        except subprocess.TimeoutExpired:
            failed += 1
            tail = [f"[{s}] timed out after {args.timeout_s:.0f} s"]
        print("\n".join(tail), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
