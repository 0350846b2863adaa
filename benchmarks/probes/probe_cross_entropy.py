# ruff: noqa: B023  (lambdas are timed immediately, inside the loop that binds them)
"""GPU probe of the cross-entropy family: correctness at the benchmark's shapes, then timing.

Usage, from the repo root with PYTHONPATH=src (torch >= 2.6, triton >= 3.2; H100 bf16 targets):
  python3 benchmarks/probes/probe_cross_entropy.py                  all sections (about 5 minutes on an H100)
  python3 benchmarks/probes/probe_cross_entropy.py --only ce        cross-entropy: checks, kernel variants, providers
  python3 benchmarks/probes/probe_cross_entropy.py --only flce      fused linear + cross-entropy: checks, chunk sizes
  python3 benchmarks/probes/probe_cross_entropy.py --only onepass   the fused loss's one-read forward kernel at the e2e
        head (8192 x 2048 x 128256): checks, its launch variants (--onepass-variants BLOCKxWARPS[xnoprefetch])
        against the two-pass kernel, and the fused forward with each kernel
  python3 benchmarks/probes/probe_cross_entropy.py --quick          no torch.compile, no larger fused shapes
  python3 benchmarks/probes/probe_cross_entropy.py --variants 8192x16x0,16384x32x1
        forward variants as BLOCKxWARPSxPROGRAMS_PER_SM[xnoevict][xreverse][xnoprefetch] (0 programs:
        one program per row)
  python3 benchmarks/probes/probe_cross_entropy.py --chunks 256,512,1024   fused linear chunk sizes (rows)
  python3 benchmarks/probes/probe_cross_entropy.py --only flce --shapes 2 --no-check   timing of FLCE_SHAPES[2] only
  python3 benchmarks/probes/probe_cross_entropy.py --compile        no GPU needed: compile the kernels for sm_90a
                                                          and print registers / spills per variant
Every step fails soft: an error prints one FAILED line and the rest runs. Times: "graph" is the median
of CUDA-graph replays (GPU time, no host overhead), "bench" triton.testing.do_bench's median (eager
launches, L2 flushed between calls). "% copy" is the minimum bytes over the time, against a 1 GiB
device copy measured in the same run. The summary at the end repeats the cross-entropy targets.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import traceback

import torch
import torch.nn.functional as F

from kernel_pytorch import reference as R
from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.ops import cross_entropy as ce
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.gemm_into import fp32_accumulate_in_place
from kernel_pytorch.ops._common.row_view import contiguous_rows
from kernel_pytorch.ops._common.scale import scale_grad_
from kernel_pytorch.ops.cross_entropy import (
    FusedLinearArgs,
    chunk_rows,
    fused_linear_cross_entropy_fwd,
    one_read,
)
from kernel_pytorch.ops.cross_entropy.launch import RowInputs, RowOutputs
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.tolerances import fp64_budget

IGNORE = -100
DEVICE = "cuda"
CE_SHAPE = (8192, 128256)
FLCE_SHAPES = [(8192, 4096, 128256), (16384, 4096, 128256), (8192, 4096, 262144)]
DEFAULT_VARIANTS = ["4096x16x0", "4096x16x1", "4096x16x0xnoevict", "4096x16x0xreverse", "4096x16x1xreverse",
                    "4096x16x0xnoprefetch", "4096x8x0", "2048x8x0", "2048x8x2", "8192x16x0",
                    "8192x16x0xnoprefetch", "8192x16x1xnoprefetchxreverse", "16384x32x0xnoprefetch"]
DEFAULT_CHUNKS = [256, 384, 512, 1024, 2048]
SUMMARY: list[str] = []


@contextlib.contextmanager
def soft(label: str):
    """Run a step; on error print one FAILED line (and the last frames) and carry on."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the probe reports every failure and goes on
        tb = traceback.format_exc(limit=-3).strip().splitlines()
        print(f"FAILED {label}: {type(exc).__name__}: {str(exc)[:300]}")
        print("   " + " | ".join(line.strip() for line in tb[-4:-1]))
        SUMMARY.append(f"FAILED {label}")
        torch.cuda.empty_cache()


def bench(fn, rep: int = 200) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def graph_ms(fn) -> float:
    """Median GPU time of `fn` replayed from a CUDA graph."""
    from triton.testing import do_bench
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def peak_bytes(fn) -> int:
    """Peak allocated memory above what was allocated before `fn`, its outputs included."""
    return peak_memory(fn).peak_bytes


def copy_gbps() -> float:
    n = 2**30
    src = torch.empty(n, dtype=torch.uint8, device=DEVICE).random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * n / ms / 1e6


def parse_variant(text: str) -> ce.FwdLaunch:
    parts = text.split("x")
    block, warps, per_sm = (int(p) for p in parts[:3])
    return ce.FwdLaunch(block, warps, per_sm, "noevict" not in parts, "reverse" in parts, "noprefetch" not in parts)


def eager_loss(logits, target, weight=None, reduction="mean", label_smoothing=0.0, lse_square_scale=0.0,
               softcap=None, upcast=False):
    """PyTorch's own loss: soft-cap as Hugging Face's Gemma-2 (in the logits' dtype), then torch's
    cross-entropy in the logits' dtype, or on `.float()` logits as Hugging Face's loss does (upcast)."""
    z = logits if softcap is None else torch.tanh(logits / softcap) * softcap
    z = z.float() if upcast else z
    w = weight.to(z.dtype) if weight is not None else None
    loss = F.cross_entropy(z, target, w, ignore_index=IGNORE, reduction=reduction, label_smoothing=label_smoothing)
    if lse_square_scale:
        valid = target != IGNORE
        zl = torch.where(valid, lse_square_scale * torch.logsumexp(z, -1) ** 2, 0.0)
        loss = loss + (zl if reduction == "none" else zl.sum() / (valid.sum() if reduction == "mean" else 1))
    return loss


def budget_line(name: str, actual, eager, ref64) -> bool:
    r = fp64_budget(actual, eager, ref64)
    print(f"  {name:34s} {'ok  ' if r.passed else 'FAIL'} ours {r.max_abs_err:.3g} (rel {r.max_rel_err:.3g}); "
          f"{r.allowed}")
    return r.passed


# --- cross-entropy ---------------------------------------------------------------------------------


def check_ce() -> None:
    """Our loss and gradient at 8192 x 128256 bf16 against fp64 (loss over all rows, gradients on 64
    sampled rows), PyTorch's own bf16 op as the yardstick; one option set per line."""
    n, v = CE_SHAPE
    torch.manual_seed(0)
    logits = (torch.randn(n, v, device=DEVICE) * 2.0).to(torch.bfloat16)
    target = torch.randint(0, v, (n,), device=DEVICE)
    target[::20] = IGNORE
    sample = torch.randperm(n, device=DEVICE)[:64]
    sets = {"plain": {}, "smooth+cap+z": {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4},
            "weights+smooth": {"weight": True, "label_smoothing": 0.1}}
    print(f"\n== cross-entropy correctness, {n} x {v} bf16 (gradients on 64 sampled rows, mean) ==")
    for name, opts in sets.items():
        with soft(f"ce check {name}"):
            opts = dict(opts)
            w = (torch.rand(v, device=DEVICE) + 0.5) if opts.pop("weight", False) else None
            out = ce.cross_entropy_fwd(logits.clone(), target, w, O(IGNORE, **opts), grad_inplace=True, eager=True)
            sep = ce.cross_entropy_fwd(logits, target, w, O(IGNORE, **opts), eager=True)
            same = torch.equal(out.grad, sep.grad) and torch.equal(out.loss, sep.loss)
            valid = target != IGNORE
            den = (w[target[valid]].double().sum() if w is not None else valid.sum().double())
            # fp64 loss in row chunks (the whole fp64 logits would be 8 GB)
            loss64 = torch.zeros((), dtype=torch.float64, device=DEVICE)
            w64 = w.double() if w is not None else None
            for a in range(0, n, 1024):
                part = R.cross_entropy(logits[a:a + 1024].double(), target[a:a + 1024], w64,
                                       O(IGNORE, "none", **opts))
                loss64 += part.sum()
            loss64 = loss64 / den
            loss_e = eager_loss(logits, target, w, **opts)
            xs, ts = logits[sample], target[sample]
            up = torch.full((sample.numel(),), 1.0 / float(den), device=DEVICE)
            g64 = R.cross_entropy_backward(up.double(), xs.double(), ts, w64, O(IGNORE, "none", **opts))
            xe = xs.clone().requires_grad_()
            (ge,) = torch.autograd.grad(eager_loss(xe, ts, w, reduction="none", **opts), xe, up.to(xe.dtype))
            ok = budget_line(f"{name}: loss", out.loss, loss_e, loss64)
            ok &= budget_line(f"{name}: grad", out.grad[sample], ge, g64)
            none_out = ce.cross_entropy_fwd(logits, target, w, O(IGNORE, "none", **opts), with_grad=False, eager=True)
            rec = ce.cross_entropy_bwd(up.new_full((n,), 1.0 / float(den)), logits, target, none_out, w,
                                       O(IGNORE, "none", **opts), eager=True)
            ok &= budget_line(f"{name}: 'none' recomputed grad", rec[sample], ge, g64)
            print(f"  {name}: in-place and separate gradients bitwise equal: {same}")
            SUMMARY.append(f"ce check {name}: {'ok' if ok and same else 'FAIL'}")
            del out, sep, rec


def time_ce(variants: list[str], copy: float, compile_too: bool) -> None:
    n, v = CE_SHAPE
    min_bytes = 2 * n * v * 2  # read the logits once, write the gradient once (in place or not)
    print(f"\n== cross-entropy timing, {n} x {v} bf16; min bytes {min_bytes / 1e9:.2f} GB "
          f"(read logits + write gradient; the same count in place or into a new buffer, which adds "
          f"{n * v * 2 / 1e9:.2f} GB of memory, not bytes) ==")
    torch.manual_seed(0)
    logits = (torch.randn(n, v, device=DEVICE) * 2.0).to(torch.bfloat16)
    target = torch.randint(0, v, (n,), device=DEVICE)
    ones = torch.ones((), device=DEVICE)

    def pct(nbytes: float, ms: float) -> str:
        return f"{nbytes / ms / 1e6 / copy * 100:5.1f}%"

    best = (math.inf, "")
    for text in variants:
        # loss=None: each variant times both the gradient and the loss-only pass
        with soft(f"ce variant {text}"):
            launch = parse_variant(text)
            with tuning.changed("cross_entropy", fwd=launch, loss=None):
                buf = logits.clone()
                g_ms = graph_ms(lambda: ce.cross_entropy_fwd(buf, target, grad_inplace=True, eager=True))
                b_ms = bench(lambda: ce.cross_entropy_fwd(buf, target, grad_inplace=True, eager=True))
                sep_ms = graph_ms(lambda: ce.cross_entropy_fwd(logits, target, eager=True))
                lo_ms = graph_ms(lambda: ce.cross_entropy_fwd(logits, target, with_grad=False, eager=True))
                # pass 2 reads from L2 when fwd+grad costs about twice a loss-only pass (read + write)
                print(f"  fwd+grad {text:22s} in place: graph {g_ms:6.3f} ms {pct(min_bytes, g_ms)}, "
                      f"bench {b_ms:6.3f} ms {pct(min_bytes, b_ms)} | new buffer graph {sep_ms:6.3f} ms "
                      f"{pct(min_bytes, sep_ms)} | loss only {lo_ms:6.3f} ms {pct(min_bytes / 2, lo_ms)} | "
                      f"fwd+grad / loss only {g_ms / lo_ms:4.2f}")
                best = min(best, (b_ms, text))
                del buf
    with soft("ce options path"):
        buf = logits.clone()
        w = torch.rand(v, device=DEVICE) + 0.5
        for name, opts in {"softcap 30 + smoothing 0.1": {"softcap": 30.0, "label_smoothing": 0.1},
                           "weights + smoothing + z-loss": {"weight": w, "label_smoothing": 0.1,
                                                            "lse_square_scale": 1e-4}}.items():
            o = O(IGNORE, **{k: val for k, val in opts.items() if k != "weight"})
            ms = graph_ms(lambda: ce.cross_entropy_fwd(buf, target, opts.get("weight"), o, grad_inplace=True,
                                                       eager=True))
            print(f"  fwd+grad in place, committed variant, {name}: {ms:.3f} ms {pct(min_bytes, ms)}")
    SUMMARY.append(f"ce fwd+grad in place, best variant {best[1]}: {best[0]:.3f} ms = {pct(min_bytes, best[0])} "
                   f"of copy (target <= 1.65 ms, >= 85%)")
    with soft("ce backward kernels"):
        none = O(IGNORE, "none")
        out = ce.cross_entropy_fwd(logits, target, None, none, with_grad=False, eager=True)
        dl = torch.rand(n, device=DEVICE)
        buf = logits.clone()
        committed = tuning.current("cross_entropy")
        for block, warps in [(committed.bwd_block, committed.bwd_warps), (8192, 16), (2048, 4), (8192, 8)]:
            with tuning.changed("cross_entropy", bwd_block=block, bwd_warps=warps):
                rec = graph_ms(lambda: ce.cross_entropy_bwd(dl, logits, target, out, None, none, eager=True))
            print(f"  recomputing backward ('none'), {block} columns x {warps} warps per program: {rec:.3f} ms "
                  f"{pct(min_bytes, rec)}")
        one = graph_ms(lambda: scale_grad_(buf, ones, eager=True))
        half = graph_ms(lambda: scale_grad_(buf, torch.full((), 0.5, device=DEVICE), eager=True))
        print(f"  scale by 1: {one * 1e3:.1f} us; scale by 0.5: {half:.3f} ms {pct(min_bytes, half)}")
    print("  fwd+bwd through autograd (ours: fwd with gradient in place, then the backward's scale by 1):")
    providers = {
        "ours": None,
        "eager bf16": lambda x: F.cross_entropy(x, target),
        "eager upcast (HF)": lambda x: F.cross_entropy(x.float(), target),
    }
    if compile_too:
        providers["torch.compile (HF)"] = torch.compile(lambda x: F.cross_entropy(x.float(), target))
    with contextlib.suppress(ImportError):
        from liger_kernel.transformers.cross_entropy import LigerCrossEntropyLoss
        liger = LigerCrossEntropyLoss()
        providers["liger"] = lambda x: liger(x, target)
    for name, fn in providers.items():
        with soft(f"ce provider {name}"):
            if fn is None:
                buf = logits.clone()

                def step():
                    out = ce.cross_entropy_fwd(buf, target, grad_inplace=True, eager=True)
                    return scale_grad_(out.grad, ones, eager=True)
            else:
                x = logits.clone().requires_grad_()

                def step():
                    x.grad = None
                    fn(x).backward()
                    return x.grad
            ms = bench(step)
            peak = peak_bytes(step)
            print(f"    {name:20s} {ms:7.3f} ms {pct(min_bytes, ms)}  peak above inputs {peak / 2**30:6.2f} GiB")
            SUMMARY.append(f"ce fwd+bwd {name}: {ms:.3f} ms, peak {peak / 2**30:.2f} GiB")


# --- fused linear + cross-entropy --------------------------------------------------------------------


def flce_inputs(n: int, h: int, v: int):
    torch.manual_seed(0)
    x = torch.randn(n, h, device=DEVICE).to(torch.bfloat16)
    w = (torch.randn(v, h, device=DEVICE) * h ** -0.5).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device=DEVICE)
    t[::16] = IGNORE
    return x, w, t


def ours_flce(x, w, t, chunk, fp32, **opts):
    ones = torch.ones((), device=DEVICE)
    out = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t), O(IGNORE, **opts), chunk=chunk, grad_w_fp32=fp32,
                                         eager=True)
    return out.loss, scale_grad_(out.grad_x, ones, eager=True), scale_grad_(out.grad_w, ones, eager=True)


def check_flce(chunks: list[int], shape: tuple[int, int, int] = FLCE_SHAPES[0],
               opts: dict | None = None) -> None:
    """Loss and gradients at `shape` (default 8192 x 4096 x 128256) against fp64 (grad_W on 256 sampled
    vocabulary rows, grad_x on 64 sampled tokens), Hugging Face-style eager bf16 (linear, then the loss on
    .float() logits) as the yardstick, for several chunk sizes and both grad_W accumulations; `opts`
    default: smoothing 0.1."""
    n, h, v = shape
    opts = {"label_smoothing": 0.1} if opts is None else opts
    print(f"\n== fused linear cross-entropy correctness, {n} x {h} x {v} bf16, mean, {opts or 'no options'} ==")
    x, w, t = flce_inputs(n, h, v)
    sv = torch.randperm(v, device=DEVICE)[:256]
    sn = torch.randperm(n, device=DEVICE)[:64]
    with soft("flce fp64 reference"):
        x64, w64 = x.double(), w.double()
        count = float((t != IGNORE).sum())
        loss64 = torch.zeros((), dtype=torch.float64, device=DEVICE)
        gw64 = torch.zeros(sv.numel(), h, dtype=torch.float64, device=DEVICE)
        gx64 = torch.zeros(sn.numel(), h, dtype=torch.float64, device=DEVICE)
        for a in range(0, n, 512):
            logits = x64[a:a + 512] @ w64.t()
            loss64 += R.cross_entropy(logits, t[a:a + 512], None, O(IGNORE, "sum", **opts))
            g = R.cross_entropy_backward(torch.tensor(1.0 / count, dtype=torch.float64, device=DEVICE), logits,
                                         t[a:a + 512], None, O(IGNORE, "sum", **opts))
            gw64 += g[:, sv].t() @ x64[a:a + 512]
            hit = (sn >= a) & (sn < a + 512)
            gx64[hit] = g[sn[hit] - a] @ w64
            del logits, g
        loss64 /= count
        del x64, w64
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss_e = eager_loss(F.linear(xe, we), t, upcast=True, **opts)
        loss_e.backward()
        ge_x, ge_w = xe.grad[sn], we.grad[sv]
        del xe, we
        for chunk in [chunks[0], chunk_rows(n, v, 2), chunks[-1]]:
            for fp32 in (False, True):
                with soft(f"flce check chunk {chunk} fp32 {fp32}"):
                    loss, gx, gw = ours_flce(x, w, t, chunk, fp32, **opts)
                    label = f"{n}x{h}x{v} {opts or ''} chunk {chunk} {'fp32' if fp32 else 'bf16'} accumulate"
                    print(f" {label}")
                    ok = budget_line("loss", loss, loss_e, loss64)
                    ok &= budget_line("grad_x", gx[sn], ge_x, gx64)
                    ok &= budget_line("grad_W", gw[sv], ge_w, gw64)
                    SUMMARY.append(f"flce check {label}: {'ok' if ok else 'FAIL (fp64 budget)'}")
                    del loss, gx, gw


def time_flce(shapes, chunks: list[int], compile_too: bool) -> None:
    for n, h, v in shapes:
        print(f"\n== fused linear cross-entropy timing, {n} x {h} x {v} bf16 (fwd + bwd, mean) ==")
        x, w, t = flce_inputs(n, h, v)
        gemm = {}
        with soft("three-GEMM baseline"):
            gemm = three_gemms(x, w)
            flops = 2 * n * h * v
            print("  cuBLAS: " + ", ".join(f"{k} {ms:.2f} ms ({flops / ms / 1e9:.0f} TFLOP/s)"
                                           for k, ms in gemm.items()))
        base = sum(gemm.values()) if len(gemm) == 3 else math.nan
        print(f"  three GEMMs: {base:.2f} ms; the target is <= 1.1x = {1.1 * base:.2f} ms")
        best = None
        for chunk in sorted(set(chunks + [chunk_rows(n, v, 2)])):
            for fp32 in (False, True):
                with soft(f"flce chunk {chunk} fp32 {fp32}"):
                    ms = bench(lambda: ours_flce(x, w, t, chunk, fp32), rep=1000)
                    peak = peak_bytes(lambda: ours_flce(x, w, t, chunk, fp32))
                    buf = chunk * v * 2
                    print(f"  ours chunk {chunk:5d} ({buf / 2**20:5.0f} MiB) {'fp32' if fp32 else 'bf16'} grad_W: "
                          f"{ms:7.2f} ms = {ms / base:4.2f}x GEMMs, peak {peak / 2**30:5.2f} GiB "
                          f"({peak / 1e9:5.2f} GB)")
                    if not fp32 and (best is None or ms < best[0]):
                        best = (ms, chunk, peak)
        if best is not None:
            SUMMARY.append(f"flce {n}x{h}x{v}: fastest bf16-accumulate chunk {best[1]}: {best[0]:.2f} ms = "
                           f"{best[0] / base:.2f}x GEMMs ({base:.2f} ms), peak {best[2] / 1e9:.2f} GB "
                           f"(targets <= 1.1x, <= Liger's peak: 1.13 GB at 8192x4096x128256)")
        if (n, h, v) != FLCE_SHAPES[0]:
            continue
        providers = {"eager (HF)": lambda xe, we: eager_loss(F.linear(xe, we), t, upcast=True)}
        if compile_too:
            providers["torch.compile (HF)"] = torch.compile(lambda xe, we: eager_loss(F.linear(xe, we), t, upcast=True))
        with contextlib.suppress(ImportError):
            from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
            liger = LigerFusedLinearCrossEntropyLoss()
            providers["liger"] = lambda xe, we: liger(we, xe, t)
        for name, fn in providers.items():
            with soft(f"flce provider {name}"):
                ms, peak = time_autograd(fn, x, w)
                print(f"  {name:20s} {ms:7.2f} ms = {ms / base:4.2f}x GEMMs, peak {peak / 2**30:5.2f} GiB "
                      f"({peak / 1e9:5.2f} GB)")
                SUMMARY.append(f"flce {name}: {ms:.2f} ms, peak {peak / 1e9:.2f} GB")


# --- the fused loss's one-read forward ------------------------------------------------------------------

ONEPASS_SHAPE = (8192, 2048, 128256)  # the e2e Llama's head: 4 x 2048 tokens, hidden 2048
DEFAULT_ONEPASS = ["4096x8", "4096x16", "8192x16", "8192x8", "16384x32xnoprefetch", "16384x16", "2048x4",
                   "4096x8xnoprefetch"]


def parse_onepass(text: str) -> ce.OnePassLaunch:
    parts = text.split("x")
    return ce.OnePassLaunch(int(parts[0]), int(parts[1]), "noprefetch" not in parts)


def time_onepass(variants: list[str], copy: float, chunk: int = 1024) -> None:
    """One chunk's logits GEMM followed by each forward kernel (the GEMM refills the logits the kernel
    overwrote), less the GEMM alone; then the whole fused forward with either kernel."""
    n, h, v = ONEPASS_SHAPE
    print(f"\n== one-read forward, {n} x {h} x {v} bf16, mean; chunk {chunk} rows ==")
    x, w, t = flce_inputs(n, h, v)
    buf = torch.empty(chunk, v, dtype=x.dtype, device=DEVICE)
    x_c, t_c = x[:chunk], t[:chunk]
    stats = torch.tensor([float((t != IGNORE).sum())] * 3, device=DEVICE)
    loss_rows, lse, scale = (torch.empty(chunk, device=DEVICE) for _ in range(3))
    xs = torch.empty(chunk, h, dtype=x.dtype, device=DEVICE)
    rows = contiguous_rows(buf)
    opts = O(IGNORE, "mean")
    inputs, outs = RowInputs(t_c, None, stats, None), RowOutputs(loss_rows, lse)

    def gemm():
        torch.mm(x_c, w.t(), out=buf)

    def two_pass():
        gemm()
        ce.launch.launch_fwd(rows, inputs, outs, rows, opts, eager=True)

    def one_pass():
        gemm()
        one_read.launch_one_read(rows, inputs, outs, scale, x_c, xs, opts, eager=True)

    nbytes = chunk * v * x.element_size()
    g_graph, g_bench = graph_ms(gemm), bench(gemm)
    print(f"  logits GEMM alone: graph {g_graph * 1e3:.1f} us, bench {g_bench * 1e3:.1f} us")

    def row(label: str, fn, reads: int) -> float:
        gr, be = graph_ms(fn) - g_graph, bench(fn) - g_bench
        pct = (reads + 1) * nbytes / (gr * 1e-3) / 1e9 / copy * 100
        print(f"  {label:28s} graph {gr * 1e3:6.1f} us ({pct:5.1f}% of copy for {reads} read + 1 write), "
              f"bench {be * 1e3:6.1f} us")
        return gr

    with soft("two-pass kernel"):
        fwd = tuning.current("cross_entropy").fwd
        base = row(f"two-pass {fwd.block}x{fwd.num_warps}", two_pass, 2)
        SUMMARY.append(f"two-pass forward kernel, one {chunk}-row chunk: {base * 1e3:.1f} us (graph)")
    committed = tuning.current("fused_linear_cross_entropy").one_read_launch
    best = None
    for text in variants:
        with soft(f"one-read {text}"):
            with tuning.changed("fused_linear_cross_entropy", one_read_launch=parse_onepass(text)):
                ms = row(f"one-read {text}", one_pass, 1)
            if best is None or ms < best[0]:
                best = (ms, text)
    if best is not None:
        SUMMARY.append(f"one-read forward kernel: fastest {best[1]} {best[0] * 1e3:.1f} us (graph); "
                       f"committed {committed}")

    def flce(one: bool):
        with tuning.changed("fused_linear_cross_entropy", one_read=one):
            return ours_flce(x, w, t, chunk, False)

    for one in (False, True):
        with soft(f"flce forward one_pass={one}"):
            gr, be = graph_ms(lambda: flce(one)), bench(lambda: flce(one), rep=500)
            peak = peak_bytes(lambda: flce(one))
            label = "one-read" if one else "two-pass"
            print(f"  fused forward ({label}): graph {gr:.3f} ms, bench {be:.3f} ms, peak {peak / 2**20:.0f} MiB")
            SUMMARY.append(f"fused forward {n}x{h}x{v} chunk {chunk} ({label}): graph {gr:.3f} ms, bench {be:.3f} ms, "
                           f"peak {peak / 2**20:.0f} MiB")


def three_gemms(x, w) -> dict[str, float]:
    """cuBLAS times of the three products a linear + loss needs: logits, grad_x, grad_W."""
    g = torch.empty(x.shape[0], w.shape[0], device=DEVICE, dtype=torch.bfloat16)
    return {"x @ W.T": bench(lambda: torch.mm(x, w.t(), out=g), rep=500),
            "g @ W": bench(lambda: torch.mm(g, w), rep=500),
            "g.T @ x": bench(lambda: torch.mm(g.t(), x), rep=500)}


def time_autograd(fn, x, w) -> tuple[float, int]:
    """(median ms, peak bytes) of fn(x, w).backward() on leaf copies of x and w."""
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()

    def step():
        xe.grad = we.grad = None
        fn(xe, we).backward()
        return xe.grad, we.grad
    return bench(step, rep=1000), peak_bytes(step)


# --- offline compile (no GPU) -------------------------------------------------------------------------


def compile_report(variants: list[str]) -> None:
    """Compile every kernel for sm_90a without a GPU and print registers, stack (spills) and shared memory."""
    import os
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernel_pytorch.ops._common import scale as _scale
    from kernel_pytorch.ops.cross_entropy import kernels as ce_kernels
    from kernel_pytorch.ops.cross_entropy import stats as ce_stats

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    ptr, i32, f32 = "*bf16", "i32", "fp32"

    def one(fn, sig: dict, consts: dict, warps: int, label: str) -> None:
        with soft(f"compile {label}"):
            src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}}, constexprs=consts)
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True)
            line = next((ln.strip() for ln in usage.stdout.splitlines() if "REG" in ln), usage.stdout[-200:])
            print(f"  {label:58s} {' '.join(p for p in line.split() if p.split(':')[0] in ('REG', 'STACK', 'SHARED'))}")

    rows = {"n_rows": i32, "n_cols": i32, "x_inner": i32, "x_s0": i32, "x_s1": i32, "g_inner": i32, "g_s0": i32,
            "g_s1": i32}
    opts = {"ignore_index": i32, "smoothing": f32, "z_scale": f32, "cap": f32}
    fwd_sig = {"X": ptr, "T": "*i64", "W": "*fp32", "STATS": "*fp32", "LOSS": "*fp32", "LSE": "*fp32", "G": ptr,
               "TS": "*fp32", "PRED": "*i64", **rows, **opts}
    flag_sets = {"plain": (False, False, False), "weights+smooth+cap": (True, True, True)}
    print("\n== kernels compiled for sm_90a (registers per thread; STACK > 0 means spills) ==")
    for text in variants:
        launch = parse_variant(text)
        for fname, (hw, sm, cap) in flag_sets.items():
            for grad in (True, False):
                consts = dict(BLOCK=launch.block, HAS_WEIGHT=hw, SMOOTH=sm, HAS_CAP=cap, MEAN=True, GRAD=grad,
                              PREFETCH=launch.prefetch, REVERSE=launch.reverse,
                              KEEP="evict_last" if launch.evict else "", DROP="evict_first" if launch.evict else "",
                              PRECISE=False, HAS_SCALE=False, ARGMAX=False)
                one(ce_kernels._cross_entropy_fwd_kernel, fwd_sig, consts, launch.num_warps,
                    f"fwd {text} {fname} {'grad' if grad else 'loss only'}")
    bwd_sig = {"X": ptr, "T": "*i64", "W": "*fp32", "STATS": "*fp32", "LSE": "*fp32", "DLOSS": "*fp32", "G": ptr,
               "TS": "*fp32", **{k: v for k, v in rows.items() if k != "n_rows"}, "stride_dloss": i32, **opts}
    config = tuning.current("cross_entropy")
    for fname, (hw, sm, cap) in flag_sets.items():
        one(ce_kernels._cross_entropy_bwd_kernel, bwd_sig,
            dict(BLOCK=config.bwd_block, HAS_WEIGHT=hw, SMOOTH=sm, HAS_CAP=cap, MEAN=False, PRECISE=False,
                 HAS_SCALE=False), config.bwd_warps, f"bwd {fname}")
    scale_sig = {"G": ptr, "OUT": ptr, "S": "*fp32", "n_rows": i32, "n_cols": i32, "inner": i32, "s0": i32,
                 "s1": i32, "o_inner": i32, "o_s0": i32, "o_s1": i32, "stride_s": i32}
    for in_place in (True, False):
        one(_scale._scale_kernel, scale_sig, dict(BLOCK=_scale.SCALE_BLOCK, IN_PLACE=in_place), _scale.SCALE_WARPS,
            f"scale {'in place' if in_place else 'into a new buffer'}")
    one(ce_stats._ce_stats_kernel, {"T": "*i64", "W": "*fp32", "STATS": "*fp32", "n_rows": i32, "n_cols": i32,
                                    "ignore_index": i32},
        dict(HAS_WEIGHT=True, BLOCK=config.stats_block), 4, "stats")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["ce", "flce", "onepass"], help="one section only")
    p.add_argument("--onepass-variants", help="comma-separated one-read forward launches, BLOCKxWARPS[xnoprefetch]")
    p.add_argument("--quick", action="store_true", help="skip torch.compile and the larger fused shapes")
    p.add_argument("--variants", help="comma-separated forward variants (see above)")
    p.add_argument("--chunks", help="comma-separated fused linear chunk sizes (rows)")
    p.add_argument("--shapes", help="comma-separated indices into FLCE_SHAPES to time (default: all; 0 with --quick)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness sections (timing only)")
    p.add_argument("--compile", action="store_true", help="compile for sm_90a offline and print register use")
    args = p.parse_args()
    variants = args.variants.split(",") if args.variants else DEFAULT_VARIANTS
    chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else DEFAULT_CHUNKS
    if args.compile:
        compile_report(variants)
        return
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --compile for the offline register report")
    import triton

    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"committed {tuning.current('cross_entropy')}")
    print(f"fp32 grad_W accumulation in place (addmm out_dtype): {fp32_accumulate_in_place(torch.device('cuda'))}")
    copy = copy_gbps()
    print(f"copy ceiling {copy:.0f} GB/s (1 GiB device copy, bytes read + written)")
    if args.shapes:
        shapes = [FLCE_SHAPES[int(i)] for i in args.shapes.split(",")]
    else:
        shapes = FLCE_SHAPES[:1] if args.quick else FLCE_SHAPES
    if args.only in (None, "ce"):
        if not args.no_check:
            check_ce()
        time_ce(variants, copy, compile_too=not args.quick)
    if args.only in (None, "flce"):
        if not args.no_check:
            check_flce(chunks)
        time_flce(shapes, chunks, compile_too=not args.quick)
    if args.only in (None, "onepass"):
        if not args.no_check:
            check_flce([512, 2048], ONEPASS_SHAPE, {})
        time_onepass(args.onepass_variants.split(",") if args.onepass_variants else DEFAULT_ONEPASS, copy)
    print("\n== summary ==")
    for line in SUMMARY:
        print("  " + line)


if __name__ == "__main__":
    main()
