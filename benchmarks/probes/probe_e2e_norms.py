# ruff: noqa: B023  (lambdas are timed immediately, inside the loop that binds them)
"""RMSNorm at the end-to-end benchmark's shape (8192 tokens x hidden 2048, bf16): launch variants of our
forward and backward kernels beside torch.compile's kernels for HF's RMSNorm, in CUDA-graph replay.

    python benchmarks/probes/probe_e2e_norms.py [--shapes 8192x2048,16384x4096,4096x1024] [--passes fwd,bwd]

Forward variants: elements per thread; backward: row tiling (rows per tile, programs per SM) x elements
per thread. Each variant's output is compared with the committed launch's before it is timed (forward
and dx bitwise; dweight's largest difference, which the partials' count changes). A 2-D (rows, block)
forward tile of 2, 4 or 8 rows was measured at 8192 x 2048 (22.5-25.6 us against one row's 22.0) and
16384 x 4096 (73.2-107.7 us against 72.4) and removed. % copy counts the minimum bytes (fwd: x in, y
out; bwd: dy and x in, dx out).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch

from kernel_pytorch.benchmark.ceilings import measure_copy_gbps
from kernel_pytorch.benchmark.suites.norm import hf_rms_norm
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common import rows as _rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_norms import graph_ms  # noqa: E402  (CUDA-graph replay of one call, as the norm sweep times it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8192x2048,16384x4096,4096x1024")
    parser.add_argument("--passes", default="fwd,bwd")
    args = parser.parse_args()
    ceil = measure_copy_gbps("cuda")
    print(f"copy ceiling {ceil:.0f} GB/s")
    fwd_op, bwd_op = torch.ops.kernel_pytorch.rms_norm_fwd, torch.ops.kernel_pytorch.rms_norm_bwd
    passes = args.passes.split(",")
    base = tuning.current("norm")
    comp = torch.compile(lambda x, w: hf_rms_norm(x, w, 1e-6))
    for shape in args.shapes.split(","):
        n, d = (int(v) for v in shape.split("x"))
        x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(d, device="cuda") * 0.1 + 1).to(torch.bfloat16)
        dy = torch.randn_like(x)
        nb = x.numel() * x.element_size()
        pct = lambda k, ms: k * nb / ms / 1e6 / ceil * 100  # noqa: E731
        y0, rstd = fwd_op(x, w, 1e-6, 0.0)
        dx0, dw0 = bwd_op(dy, x, w, rstd, 0.0)  # the committed tiling for this width
        block = _rows.row_launch(d, 2, base.rms_norm.bwd_elements_per_thread, base.rows).block
        print(f"{shape} committed backward tiling {base.rms_norm.tiling(block)}")
        for ept in (16, 8, 4) if "fwd" in passes else ():
            with tuning.changed("norm", rms_norm=replace(base.rms_norm, fwd_elements_per_thread=ept)):
                y, _ = fwd_op(x, w, 1e-6, 0.0)
                same = torch.equal(y, y0)
                ms = graph_ms(lambda: fwd_op(x, w, 1e-6, 0.0))
            print(f"{shape} fwd ept={ept:2d}: {ms * 1e3:6.1f} us {pct(2, ms):5.1f}%"
                  f"{'' if same else '  DIFFERS from the committed launch'}")
        tilings = ((2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4))
        for (tile, per_sm), ept in itertools.product(tilings if "bwd" in passes else (), (8, 4, 16)):
            tiling = _rows.RowTiling(tile=tile, programs_per_sm=per_sm)
            # this tiling at every width, with `ept` elements per thread
            op = replace(base.rms_norm, bwd_tiling=tiling, bwd_tilings=(), bwd_elements_per_thread=ept)
            with tuning.changed("norm", rms_norm=op):
                dx, dw = bwd_op(dy, x, w, rstd, 0.0)
                same = torch.equal(dx, dx0)
                dw_err = (dw.float() - dw0.float()).abs().max().item()
                ms = graph_ms(lambda: bwd_op(dy, x, w, rstd, 0.0))
            print(f"{shape} bwd tile={tile} per_sm={per_sm} ept={ept:2d}: {ms * 1e3:6.1f} us {pct(3, ms):5.1f}%"
                  f"{'' if same else '  dx DIFFERS'} (dw vs committed {dw_err:.2e})")
        with torch.no_grad():
            cf = graph_ms(lambda: comp(x, w))
        xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        cfb = graph_ms(lambda: torch.autograd.grad(comp(xg, wg), (xg, wg), dy))
        print(f"{shape} compile fwd {cf * 1e3:6.1f} us {pct(2, cf):5.1f}%; fwd+bwd {cfb * 1e3:6.1f} us "
              f"{pct(5, cfb):5.1f}% (bwd by difference {(cfb - cf) * 1e3:6.1f} us {pct(3, cfb - cf):5.1f}%)")


if __name__ == "__main__":
    main()
