"""Which optimize() component families run under torch.compile on this GPU: one fresh process per set
of families (a CUDA fault poisons its process), each building bench_e2e's HF Llama at the e2e widths
(fewer layers), `optimize(components=...)`, `torch.compile`, and running fused-AdamW training steps;
then the loss and every gradient against the eager optimized model's on the same batch.

    python benchmarks/probes/probe_compile_components.py                       # the default sets, 2 layers
    python benchmarks/probes/probe_compile_components.py --sets embedding cross_entropy,embedding --layers 2
    CUDA_LAUNCH_BLOCKING=1 python benchmarks/probes/probe_compile_components.py --one embedding   # one set, in-process
    python benchmarks/probes/probe_compile_components.py --sets auto --layers 8 --out DIR
        # a failing set is rerun with CUDA_LAUNCH_BLOCKING=1 TORCH_LOGS=output_code (log in DIR),
        # and the faulting kernel's source nodes printed
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

DEFAULT_SETS = ("auto", "norm,mlp,attention", "embedding", "cross_entropy", "cross_entropy,embedding")


def _flce_variant(variant: str) -> None:
    """Replace the fused linear cross-entropy's per-chunk gradient GEMMs: "current" (the library's),
    "gemm_into_w" (grad_W through the registered gemm_into_ op), "gemm_into_x" (grad_x's rows too) or
    "out" (both as out= GEMMs)."""
    import torch

    from kernel_pytorch.ops._common.gemm_into import gemm_into
    from kernel_pytorch.ops.cross_entropy import fused_linear as flce

    if variant == "current":
        return

    def add_chunk(self, g, x_c, start, first):  # noqa: ANN001, ANN202 (mirrors _Grads.add_chunk)
        if self.x is not None:
            out = self.x[start:start + g.shape[0]]
            if variant == "gemm_into_x":
                gemm_into(out, g, self.weight, False, eager=self.eager)
            else:
                torch.mm(g, self.weight, out=out)
        if self.w is not None:
            gemm_into(self.w, g.t(), x_c, not first, eager=self.eager or variant == "out")
        if self.b is not None:
            self.b += g.sum(0, dtype=torch.float32)

    flce._Grads.add_chunk = add_chunk


def one(families: str, layers: int, batch: int, seq: int) -> None:
    import torch
    from e2e.models import Size, hf_model

    from kernel_pytorch.optimize import optimize
    from kernel_pytorch.tolerances import compare_reordered

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
    eager_loss = model(input_ids=ids, labels=ids).loss
    eager_loss.backward()
    eager = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    t0 = time.perf_counter()
    for i in range(3):
        loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        if i == 0:  # the compiled step's gradients against the eager step's, parameter by parameter
            torch.cuda.synchronize()
            print(f"[{families}] step 0: loss {loss.item():.5f} (eager {eager_loss.item():.5f})", flush=True)
            bad = 0
            for n, p in model.named_parameters():
                if n not in eager or p.grad is None:
                    continue
                result = compare_reordered(p.grad, eager[n])
                finite = bool(torch.isfinite(p.grad).all())
                if not (result.passed and finite):
                    bad += 1
                    print(f"[{families}]   grad {n}: finite={finite} {result.message()[:200]}", flush=True)
            print(f"[{families}] step 0: {bad} of {len(eager)} gradients differ from eager", flush=True)
            del eager
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"[{families}] ok: 3 compiled steps in {time.perf_counter() - t0:.1f} s, "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", flush=True)


def fault_site(log: str) -> list[str]:
    """From a `CUDA_LAUNCH_BLOCKING=1 TORCH_LOGS=output_code` run's output: the kernel Inductor reports
    failing to launch, and the lines of the generated code that launch it with the comment naming the
    graph nodes it came from (which op's traced body, or which fused aten ops)."""
    import re

    found = re.search(r"Failed during launch (\S+?):?\s*$", log, re.MULTILINE)
    if found is None:
        return ["no 'Failed during launch' line (the fault may be in a library kernel: see the traceback)"]
    name = found.group(1)
    out = [f"faulting kernel: {name}"]
    lines = [ln.split("[__output_code]", 1)[-1] for ln in log.splitlines()]
    for i, ln in enumerate(lines):
        if f"{name}.run(" in ln:
            nodes = next((lines[j].strip() for j in range(i - 1, max(i - 4, -1), -1)
                          if "Source Nodes" in lines[j]), "(no source-node comment)")
            out += [f"  {nodes[:400]}", f"  {ln.strip()[:400]}"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=list(DEFAULT_SETS), help="comma-separated families per set")
    parser.add_argument("--one", default=None, help="run this one set in this process")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--timeout-s", type=float, default=150)
    parser.add_argument("--out", default=None, help="a directory for the failing sets' blocking-rerun logs")
    parser.add_argument("--flce", default="current", choices=("current", "gemm_into_w", "gemm_into_x", "out"),
                        help="the fused linear cross-entropy's chunk GEMMs (_flce_variant)")
    args = parser.parse_args()
    if args.one is not None:
        _flce_variant(args.flce)
        one(args.one, args.layers, args.batch, args.seq)
        return 0
    failed = 0
    for s in args.sets:
        cmd = [sys.executable, __file__, "--one", s, "--layers", str(args.layers), "--batch", str(args.batch),
               "--seq", str(args.seq), "--flce", args.flce]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
            tail = [ln for ln in lines if ln.startswith(f"[{s}]")] or []
            if done.returncode != 0:
                failed += 1
                errors = [ln for ln in lines if "Error" in ln or "error" in ln][-4:]
                tail += [f"[{s}] FAILED rc={done.returncode}"] + [f"    {ln[:300]}" for ln in errors]
                if args.out is not None:  # again, synchronous and with the generated code, to name the kernel
                    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", TORCH_LOGS="output_code")
                    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s, env=env)
                    log = rerun.stdout + rerun.stderr
                    path = Path(args.out) / f"fault_{s.replace(',', '_')}.log"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(log)
                    tail += [f"[{s}] blocking rerun rc={rerun.returncode} ({path}):"]
                    tail += [f"[{s}]   {ln}" for ln in fault_site(log)]
        except subprocess.TimeoutExpired:
            failed += 1
            tail = [f"[{s}] timed out after {args.timeout_s:.0f} s"]
        print("\n".join(tail), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
