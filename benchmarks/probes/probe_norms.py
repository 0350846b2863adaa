# ruff: noqa: B023  (lambdas are timed immediately, inside the loop that binds them)
"""Quick GPU probe of the norm kernels: correctness on CUDA, then median times vs eager/compile/Liger.

Usage: python benchmarks/probes/probe_norms.py           (prints a table; the full suite is benchmarks/bench_norm.py)
       python benchmarks/probes/probe_norms.py --sweep   (launch-parameter sweep, CUDA-graph replay times)
       python benchmarks/probes/probe_norms.py --host    (where the host time of a LayerNorm fwd+bwd goes)
"""

from __future__ import annotations

import time

import torch
from triton.testing import do_bench

from kernel_pytorch import functional as F
from kernel_pytorch.benchmark.ceilings import measure_copy_gbps
from kernel_pytorch.benchmark.suites.norm import hf_add_rms_norm, hf_rms_norm

try:
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
except ImportError:
    LigerRMSNorm = None


def hf_rms(x, w, eps=1e-6):
    return hf_rms_norm(x, w, eps)


def copy_bw() -> float:
    """The copy ceiling in GB/s (1 GiB device-to-device, bytes read + written), measured now."""
    return measure_copy_gbps("cuda")


def main() -> None:
    ceil = copy_bw()
    print(f"copy ceiling {ceil:.0f} GB/s")
    comp = torch.compile(hf_rms)
    for n, d in [(16384, 4096), (4096, 1024), (2048, 16384), (256, 262144)]:
        x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16).requires_grad_()
        w = (torch.randn(d, device="cuda") * 0.1 + 1).to(torch.bfloat16).requires_grad_()
        dy = torch.randn_like(x)
        provs = {"ours": lambda x, w: F.rms_norm(x, w, backend="triton"), "eager": hf_rms, "compile": comp}
        if LigerRMSNorm is not None:
            lm = LigerRMSNorm(d).to("cuda", torch.bfloat16)
            lm.weight.data.copy_(w.detach())
            provs["liger"] = lambda x, w, lm=lm: lm(x)
        for name, f in provs.items():
            try:
                y = f(x, w)
            except Exception as e:  # a provider that cannot run this shape says so
                print(f"{n}x{d} {name:8s} failed: {str(e)[:80]}")
                continue
            err = (y.float() - hf_rms(x, w).float()).abs().max().item()
            fwd = do_bench(lambda f=f: f(x, w), return_mode="median")
            params = (x, w) if name != "liger" else (x, lm.weight)

            def fb(f=f, params=params):
                torch.autograd.grad(f(x, w), params, dy)

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fb()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            fwdbwd = do_bench(fb, return_mode="median")
            nb = x.numel() * 2
            print(
                f"{n}x{d} {name:8s} fwd {fwd*1e3:8.1f}us {2*nb/fwd/1e6/ceil*100:5.1f}%  "
                f"fwd+bwd {fwdbwd*1e3:8.1f}us {5*nb/fwdbwd/1e6/ceil*100:5.1f}%  peak {peak:7.1f}MiB err {err:.3g}"
            )


def host_us(fn, warmup: int = 50, calls: int = 2000) -> float:
    """Wall time per call of `fn` in us with the GPU drained before and after: its host time, where the
    GPU work per call is negligible."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def graph_ms(fn) -> float:
    """Median GPU time of `fn` replayed from a CUDA graph: kernel time without host overhead."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median")


def sweep() -> None:
    """Launch-parameter sweep of the norm kernels, timed as CUDA-graph replays (no host overhead)."""
    from dataclasses import replace

    from kernel_pytorch.ops import tuning
    from kernel_pytorch.ops._common.rows import RowTiling
    from kernel_pytorch.ops.rms_norm import _rms_norm_fwd_kernel

    fwd_op = torch.ops.kernel_pytorch.rms_norm_fwd
    bwd_op = torch.ops.kernel_pytorch.rms_norm_bwd
    ln_fwd = torch.ops.kernel_pytorch.layer_norm_fwd
    ln_bwd = torch.ops.kernel_pytorch.layer_norm_bwd
    from kernel_pytorch.ops import layer_norm as ln_mod
    from kernel_pytorch.ops import rms_norm as rms_mod

    # each variant: a label and the norm config it runs under ("committed": the default)
    base = tuning.default("norm")
    one_row, two_rows = RowTiling(tile=1, programs_per_sm=2), RowTiling(tile=2, programs_per_sm=1)
    row_variants = [
        ("committed", base),
        # every program its own partial rows (before pairing)
        ("layer_norm.paired_partials=False", replace(base, layer_norm=replace(base.layer_norm, paired_partials=False))),
        ("rms_norm.bwd_tiling=(tile=1, programs_per_sm=2), layer_norm.bwd_tiling=(tile=2, programs_per_sm=1)",
         replace(base, rms_norm=replace(base.rms_norm, bwd_tiling=one_row),
                 layer_norm=replace(base.layer_norm, bwd_tiling=two_rows))),
    ]
    split_variants = [
        ("committed", base),
        ("rows.split_col_block=2048", replace(base, rows=replace(base.rows, split_col_block=2048))),
        ("rows.split_programs_per_sm=4", replace(base, rows=replace(base.rows, split_programs_per_sm=4))),
    ]
    ceil = copy_bw()
    print(f"copy ceiling {ceil:.0f} GB/s")
    for n, d, variants in [(16384, 4096, row_variants), (4096, 1024, row_variants),
                           (2048, 16384, split_variants), (256, 262144, split_variants)]:
        x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(d, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn_like(x)
        nb = x.numel() * 2
        for label, config in variants:
            with tuning.override(norm=config):
                _, rstd = fwd_op(x, w, 1e-6, 0.0)
                _, mean, lrstd = ln_fwd(x, w, b, 1e-5)
                f = graph_ms(lambda: fwd_op(x, w, 1e-6, 0.0))
                bw = graph_ms(lambda: bwd_op(dy, x, w, rstd, 0.0))
                lf = graph_ms(lambda: ln_fwd(x, w, b, 1e-5))
                lb = graph_ms(lambda: ln_bwd(dy, x, w, mean, lrstd, True))
                torch.cuda.reset_peak_memory_stats()
                base_bytes = torch.cuda.memory_allocated()
                bwd_op(dy, x, w, rstd, 0.0)
                rms_peak = (torch.cuda.max_memory_allocated() - base_bytes) / 2**20
                torch.cuda.reset_peak_memory_stats()
                ln_bwd(dy, x, w, mean, lrstd, True)
                ln_peak = (torch.cuda.max_memory_allocated() - base_bytes) / 2**20
                pct = lambda k, ms: k * nb / ms / 1e6 / ceil * 100  # noqa: E731
                # eager calls, not a graph replay, so host overhead shows where it exceeds the GPU work: like
                # the suite's plain fwd+bwd rows (timed with its own time_fn, CUDA events), not its "(cuda
                # graph)" rows
                if variants is row_variants:
                    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
                    ln_db = do_bench(lambda: torch.autograd.grad(
                        F.layer_norm(xg, wg, bg, backend="triton"), (xg, wg, bg), dy), return_mode="median")
                    print(f"{n}x{d} {label:44s} ln fwd+bwd do_bench {ln_db*1e3:6.1f}us {pct(5, ln_db):5.1f}%")
                print(f"{n}x{d} {label:44s} rms fwd {f*1e3:6.1f}us {pct(2, f):5.1f}% "
                      f"bwd {bw*1e3:6.1f}us {pct(3, bw):5.1f}% f+b {pct(5, f + bw):5.1f}% {rms_peak:6.1f}MiB | "
                      f"ln fwd {pct(2, lf):5.1f}% bwd {lb*1e3:6.1f}us {pct(3, lb):5.1f}% f+b {pct(5, lf + lb):5.1f}% "
                      f"{ln_peak:6.1f}MiB")
    # registers and spills of every backward binary compiled above (constexprs say which variant)
    for mod in (rms_mod, ln_mod):
        for name in dir(mod):
            fn = getattr(mod, name)
            if not (name.endswith("_kernel") and hasattr(fn, "device_caches")):
                continue
            for cache in fn.device_caches.values():
                for key, compiled in cache[0].items():
                    try:
                        print(f"regs {name} {compiled.metadata.num_warps}w n_regs={compiled.n_regs} "
                              f"n_spills={compiled.n_spills} {str(key)[-160:]}")
                    except AttributeError as exc:  # a Triton without these fields: say so, go on
                        print(f"regs {name}: {exc}")
    # host time per call at a tiny shape (the GPU work is negligible): how fast each path issues work
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    r = torch.empty(8, device="cuda")
    xr, wr, br, rr = (t.detach().clone().requires_grad_() for t in (x, w, b, x))
    dy = torch.randn_like(x)
    launcher = rms_mod._fwd_kernel
    raw_args = (x, x, y, w, y, r, 256, 256, 256, 256, 1e-6, 0.0)
    raw_meta = dict(BLOCK=256, SINGLE_PASS=True, HAS_RESIDUAL=False, ROUND_NORMED=True, num_warps=1)
    hf_ln = torch.nn.functional.layer_norm

    calls = {
        "rms fwd functional": lambda: F.rms_norm(x, w),
        "rms fwd torch.ops": lambda: fwd_op(x, w, 1e-6, 0.0),
        "rms fwd hf eager": lambda: hf_rms(x, w),
        "rms fwd+bwd functional": lambda: torch.autograd.grad(F.rms_norm(xr, wr), (xr, wr), dy),
        "rms fwd+bwd hf eager": lambda: torch.autograd.grad(hf_rms(xr, wr), (xr, wr), dy),
        "ln fwd+bwd functional": lambda: torch.autograd.grad(F.layer_norm(xr, wr, br), (xr, wr, br), dy),
        "ln fwd+bwd aten": lambda: torch.autograd.grad(hf_ln(xr, (256,), wr, br), (xr, wr, br), dy),
        "add fwd+bwd functional": lambda: torch.autograd.grad(F.add_rms_norm(xr, rr, wr), (xr, rr, wr), (dy, dy)),
        "add fwd+bwd hf eager": lambda: torch.autograd.grad(
            hf_add_rms_norm(xr, rr, wr, 1e-6), (xr, rr, wr), (dy, dy)),
        "JITFunction launch": lambda: _rms_norm_fwd_kernel[(8,)](*raw_args, **raw_meta),
        "Launcher eager launch": lambda: launcher((8,), *raw_args, eager=True, **raw_meta),
        "torch.empty": lambda: torch.empty(8, 256, device="cuda", dtype=torch.bfloat16),
        "aten add": lambda: torch.add(x, x),
    }
    for name, fn in calls.items():
        print(f"host {name:24s} {host_us(fn):6.1f} us/call")
    # where ATen's fused layer_norm (one C++ autograd node) stops beating our Python-level path in
    # do_bench's fwd+bwd: the host-bound range
    for n, d in [(2048, 1024), (4096, 1024), (8192, 1024), (4096, 2048), (8192, 2048), (16384, 2048)]:
        xg = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        wg = torch.randn(d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        bg = torch.randn(d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dyg = torch.randn_like(xg)
        times = {}
        for _ in range(3):  # alternating, so a drift in the host's speed hits every path alike
            for name, fn in {
                "triton": lambda: F.layer_norm(xg, wg, bg, backend="triton"),
                "auto": lambda: F.layer_norm(xg, wg, bg),
                "aten": lambda: hf_ln(xg, (d,), wg, bg),
            }.items():
                ms = do_bench(lambda fn=fn: torch.autograd.grad(fn(), (xg, wg, bg), dyg), return_mode="median")
                times.setdefault(name, []).append(f"{ms * 1e3:6.1f}")
        print(f"ln fwd+bwd {n}x{d} us: " + "; ".join(f"{k} {' '.join(v)}" for k, v in times.items()))


def host() -> None:
    """Where the host time of an eager LayerNorm fwd+bwd goes, ours against ATen's, at a tiny shape
    (the GPU work is negligible, so per-call wall time is host time)."""
    from kernel_pytorch import functional as kpf
    from kernel_pytorch.functional import _dispatch, norm
    from kernel_pytorch.ops import layer_norm as ln_mod
    from kernel_pytorch.ops._common.partials import sum_partials

    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    _, mean, rstd = ln_mod.layer_norm_fwd(x, w, b, 1e-5, eager=True)
    parts = torch.randn(2, 4, 256, device="cuda")

    class Null(torch.autograd.Function):
        """No kernels: what an autograd.Function itself costs (one allocation each way)."""

        @staticmethod
        def forward(ctx, x, w, b, eps):
            ctx.save_for_backward(x, w)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return torch.empty_like(g), None, None, None

    def grad(fn):
        return lambda: torch.autograd.grad(fn(), (xr, wr, br), dy, allow_unused=True)

    aten = lambda: torch.layer_norm(xr, (256,), wr, br, 1e-5)  # noqa: E731
    ours = lambda: kpf.layer_norm(xr, wr, br, backend="triton")  # noqa: E731
    func = lambda: ln_mod.layer_norm_eager(xr, wr, br, 1e-5)  # noqa: E731
    null = lambda: Null.apply(xr, wr, br, 1e-5)  # noqa: E731
    calls = {
        "aten fwd (records grad)": aten,
        "aten fwd+bwd": grad(aten),
        "ours fwd (records grad)": ours,
        "ours fwd+bwd": grad(ours),
        "Function fwd": func,
        "Function fwd+bwd": grad(func),
        "null Function fwd": null,
        "null Function fwd+bwd": grad(null),
        "layer_norm_fwd direct": lambda: ln_mod.layer_norm_fwd(x, w, b, 1e-5, eager=True),
        "layer_norm_bwd direct": lambda: ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, eager=True),
        "sum_partials direct": lambda: sum_partials(parts, (torch.bfloat16, torch.bfloat16), eager=True),
        "checks + resolve": lambda: (norm._check_layer_norm(x, w, b), _dispatch._resolve("triton", "ln", x, False)),
        "torch.zeros int32 [132]": lambda: torch.zeros(132, dtype=torch.int32, device="cuda"),
        "torch.empty [8, 256]": lambda: torch.empty(8, 256, device="cuda", dtype=torch.bfloat16),
    }
    for rep in range(2):
        for name, fn in calls.items():
            print(f"host[{rep}] {name:28s} {host_us(fn, warmup=100):6.1f} us/call")
    # the same host work timed on the main thread and inside a backward (the autograd engine's device
    # thread): does Python run slower there?
    inside: dict[str, list[float]] = {}

    def busy() -> int:  # a fixed pure-Python workload
        return sum(i * i for i in range(200))

    def bwd_direct():
        return ln_mod.layer_norm_bwd(dy, x, w, mean, rstd, True, eager=True)

    work = {"python loop": busy, "layer_norm_bwd": bwd_direct,
            "torch.empty": lambda: torch.empty(8, 256, device="cuda", dtype=torch.bfloat16)}

    class Timed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, name):
            ctx.name = name
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, g):
            fn = work[ctx.name]
            t = time.perf_counter()
            fn()
            inside.setdefault(ctx.name, []).append(time.perf_counter() - t)
            return torch.empty_like(g), None, None, None

    for name, fn in work.items():
        main_us = host_us(fn, warmup=100)
        inside.pop(name, None)
        for _ in range(2100):
            torch.autograd.grad(Timed.apply(xr, wr, br, name), (xr,), dy)
        torch.cuda.synchronize()
        samples = sorted(inside[name][100:])
        print(f"thread {name:16s} main {main_us:6.1f} us; in backward median "
              f"{samples[len(samples) // 2] * 1e6:6.1f} us, mean {sum(samples) / len(samples) * 1e6:6.1f} us")
    # the profiler's view of the same fwd+bwd: which recorded host events take the time
    for name in ("ours fwd+bwd", "aten fwd+bwd"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(200):
                calls[name]()
            torch.cuda.synchronize()
        print(f"profile {name} (200 calls)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    import sys

    # anything but exactly one of these flags runs the probe table
    {("--sweep",): sweep, ("--host",): host}.get(tuple(sys.argv[1:]), main)()
