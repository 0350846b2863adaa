"""Time the norms' eager fwd+bwd of whichever kernel_pytorch is first on PYTHONPATH (CUDA only).

One process per tree, alternated by scripts/ab_norms.sh, so an old and a new tree are compared in one
run: do_bench (what an eager user sees, host time included) and CUDA-graph replay (kernel time).
Usage: python scripts/ab_norms.py LABEL  -> one JSON line per (op, shape) on stdout.
"""

from __future__ import annotations

import json
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

import kernel_pytorch
from kernel_pytorch import functional as F

SHAPES = ((8, 256), (4096, 1024), (16384, 4096))


def step_of(op: str, rows: int, cols: int):
    """A closure running one fwd+bwd of `op` through the Triton path, bf16."""
    kw = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(rows, cols, **kw, requires_grad=True)
    r = torch.randn(rows, cols, **kw, requires_grad=True)
    w = torch.randn(cols, **kw, requires_grad=True)
    b = torch.randn(cols, **kw, requires_grad=True)
    dy = torch.randn(rows, cols, **kw)
    if op == "rms_norm":
        return lambda: torch.autograd.grad(F.rms_norm(x, w, 1e-6, backend="triton"), (x, w), dy)
    if op == "layer_norm":
        return lambda: torch.autograd.grad(F.layer_norm(x, w, b, 1e-5, backend="triton"), (x, w, b), dy)
    return lambda: torch.autograd.grad(F.add_rms_norm(x, r, w, 1e-6, backend="triton"), (x, r, w), (dy, dy))


def main(label: str) -> None:
    for op in ("rms_norm", "layer_norm", "add_rms_norm"):
        for rows, cols in SHAPES:
            step = step_of(op, rows, cols)
            host = do_bench(step, warmup=50, rep=300)
            graph = do_bench_cudagraph(step, rep=300)
            print(json.dumps({"tree": label, "path": kernel_pytorch.__file__, "op": op, "shape": [rows, cols],
                              "do_bench_us": round(host * 1e3, 2), "graph_us": round(graph * 1e3, 2)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tree")
