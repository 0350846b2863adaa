"""Where the host time of an eager fwd+bwd goes (cProfile over many iterations, tiny shape).

Usage: python scripts/profile_host.py [rms_norm|layer_norm]
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import torch

from kernel_pytorch import functional as F


def main(op: str) -> None:
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    if op == "rms_norm":
        def step():
            return torch.autograd.grad(F.rms_norm(x, w, backend="triton"), (x, w), dy)
    else:
        def step():
            return torch.autograd.grad(F.layer_norm(x, w, b, backend="triton"), (x, w, b), dy)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        step()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"== {op}: {stats.total_tt / 500 * 1e6:.1f} us host per fwd+bwd (profiled)")
    stats.sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "layer_norm")
