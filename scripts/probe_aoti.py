"""GPU probe of AOTInductor packages: which model makes `aoti_load_package` fault, and where.

Usage: PYTHONPATH=src python3 scripts/probe_aoti.py [--variants a,b,...] [--out DIR] [--jobs N]
       PYTHONPATH=src python3 scripts/probe_aoti.py --one VARIANT --out DIR   (one variant, this process)

Each variant builds a model on the device, exports it (kernel_pytorch.deploy.export), compiles an
AOTInductor package and loads it, first in the building process and then in a fresh one, and compares
the package's output with the model's on other sizes. Variants run in their own processes (a fault ends
only its own), several at once since the builds are CPU-bound; a variant that faults is rerun under gdb
when gdb is installed, for the native backtrace. Variants:
  tiny-plain   RMSNorm + Linear, no swaps (AOTI itself on this machine)
  tiny         the same through optimize(): kernel_pytorch::rms_norm_fwd, our Triton kernel inside
  embed        nn.Embedding through optimize(): kernel_pytorch::embedding_fwd
  mlp          a gated MLP through optimize(): kernel_pytorch::gated_act_fwd
  llama-plain  the built-in llama-tiny, no swaps
  llama        llama-tiny through optimize() (tests/deploy/test_export.py's CUDA test)
  llama-static llama-tiny through optimize(), exported with static shapes
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("tiny-plain", "tiny", "embed", "mlp", "llama-plain", "llama", "llama-static")


def build(variant: str, device: str):
    import torch
    from torch import nn

    import kernel_pytorch as kp
    from kernel_pytorch.models import build_model

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if variant.startswith("tiny"):
        model = nn.Sequential(nn.RMSNorm(64), nn.Linear(64, 32)).to(device, dtype)
        inputs = (torch.randn(2, 5, 64, device=device, dtype=dtype),)
    elif variant == "embed":
        model = nn.Sequential(nn.Embedding(512, 64), nn.Linear(64, 32)).to(device, dtype)
        inputs = (torch.randint(0, 512, (2, 5), device=device),)
    elif variant == "mlp":
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP

        model = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128)).to(device, dtype)
        inputs = (torch.randn(2, 5, 64, device=device, dtype=dtype),)
    else:
        model, inputs = build_model("llama-tiny", device=device, dtype=dtype)
    model = model.eval()
    if not variant.endswith("-plain"):
        model, report = kp.optimize(model, inputs, seeds=(0,))
        assert report.passed, report
    return model, inputs


def other_inputs(inputs):
    import torch

    (x,) = inputs
    if x.is_floating_point():
        return (torch.randn(3, 7, *x.shape[2:], device=x.device, dtype=x.dtype),)
    return (torch.randint(0, 512, (3, 7), device=x.device),)


def one(variant: str, out: Path) -> int:
    """Build, package and load `variant` here; the package is then loaded again by a fresh process."""
    faulthandler.enable()
    import torch

    from kernel_pytorch.deploy import aoti_package, export, load_package, our_ops
    from kernel_pytorch.tolerances import compare_reordered

    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model, inputs = build(variant, device)
    program = export(model, inputs, dynamic=None if variant.endswith("static") else "auto")
    print(f"[{variant}] ops {our_ops(program)}; built + exported in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    path = aoti_package(program, inputs, out / f"{variant}.pt2")
    print(f"[{variant}] package {path.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s", flush=True)
    fresh = inputs if variant.endswith("static") else other_inputs(inputs)
    with torch.no_grad():
        expected = model(*fresh)
    torch.save({"x": fresh, "y": expected}, out / f"{variant}.io.pt")
    print(f"[{variant}] loading in this process", flush=True)
    runner = load_package(path)
    print(f"[{variant}] loaded; running", flush=True)
    with torch.no_grad():
        got = runner(*fresh)
    torch.cuda.synchronize() if device == "cuda" else None
    print(f"[{variant}] same process: {compare_reordered(got, expected).message('package')}", flush=True)
    return 0


def fresh_load(variant: str, out: Path) -> int:
    faulthandler.enable()
    import torch

    from kernel_pytorch.deploy import load_package
    from kernel_pytorch.tolerances import compare_reordered

    io = torch.load(out / f"{variant}.io.pt")
    runner = load_package(out / f"{variant}.pt2")
    with torch.no_grad():
        got = runner(*io["x"])
    print(f"[{variant}] fresh process: {compare_reordered(got, io['y']).message('package')}", flush=True)
    return 0


def run(variant: str, out: Path, timeout: float) -> dict:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    me = [sys.executable, __file__, "--out", str(out)]
    record = {"variant": variant}
    for stage, args in (("build+load", ["--one", variant]), ("fresh load", ["--fresh", variant])):
        t0 = time.perf_counter()
        try:
            done = subprocess.run(me + args, capture_output=True, text=True, env=env, timeout=timeout)
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
        record[stage] = {"rc": rc, "s": round(time.perf_counter() - t0, 1), "tail": text[-3000:]}
        if rc != 0 and shutil.which("gdb") and rc != "timeout":
            bt = subprocess.run(["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args", *me, *args],
                                capture_output=True, text=True, env=env, timeout=timeout)
            record[stage]["gdb"] = (bt.stdout + bt.stderr)[-6000:]
        if rc != 0:
            break
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, default=Path("aoti_probe"))
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--one")
    p.add_argument("--fresh")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        raise SystemExit(one(args.one, args.out))
    if args.fresh:
        raise SystemExit(fresh_load(args.fresh, args.out))
    names = [v for v in args.variants.split(",") if v]
    print(f"gdb: {shutil.which('gdb') or 'not installed'}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda v: run(v, args.out, args.timeout), names))
    for r in records:
        for stage in ("build+load", "fresh load"):
            if stage in r:
                s = r[stage]
                print(f"== {r['variant']} {stage}: rc {s['rc']} in {s['s']} s\n{s['tail']}")
                if "gdb" in s:
                    print(f"-- gdb\n{s['gdb']}")
    print("\n== summary")
    for r in records:
        print(f"  {r['variant']:13s} " + "; ".join(f"{st} rc {r[st]['rc']}" for st in ("build+load", "fresh load")
                                                   if st in r))
    (args.out / "summary.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
