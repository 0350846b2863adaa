# ruff: noqa: B023  (lambdas are timed immediately, inside the loop that binds them)
"""GPU probe of the activation kernels (gated SwiGLU/GEGLU, bias + activation) at the MLP benchmark's
shapes: correctness against the reference and transformers' eager activation, then times and peak
memory against eager torch, torch.compile and Liger-Kernel (when importable).

Usage (repo root, PYTHONPATH=src):
    python3 benchmarks/probes/probe_mlp.py            correctness + the provider table (bf16 SwiGLU, 3 shapes)
    python3 benchmarks/probes/probe_mlp.py --sweep    kernel-only tile/warp/precise-math variants (graph replay)
    python3 benchmarks/probes/probe_mlp.py --block    whole-MLP-block prototype (16384 x 4096 x 14336) vs eager/compile
    python3 benchmarks/probes/probe_mlp.py --bias     bias + GELU at GPT-2/ViT shapes vs eager/compile
    python3 benchmarks/probes/probe_mlp.py --all      everything above

Times: `do_bench` = triton.testing.do_bench median (host overhead included where the GPU waits on it);
`graph` = median of a CUDA-graph replay (kernel time only). % = of the copy ceiling measured in this run
(1 GiB device copy, bytes read + written), counting the minimum bytes: SwiGLU fwd reads gate and up and
writes h (3 tensors of N x I), fwd+bwd adds dh, gate, up in and d_gate, d_up out (8 in all).
Peak = max allocated during one fwd+bwd above what was allocated before it (inputs and dh included there).
Every variant runs inside try/except: one that fails prints its error and the others go on.
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from kernel_pytorch import reference as R
from kernel_pytorch.benchmark.ceilings import measure_copy_gbps
from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.ops import _activations, tuning
from kernel_pytorch.ops.bias_act import bias_act_bwd, bias_act_fwd
from kernel_pytorch.ops.gated_act import (
    gated_act_bwd,
    gated_act_fwd,
    gated_act_packed_bwd,
    gated_act_packed_fwd,
)
from kernel_pytorch.tolerances import compare, fp64_budget

try:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
except ImportError:
    LigerSiLUMulFunction = None

SHAPES = [(16384, 14336), (4096, 3072), (4096, 1024)]
BF16 = torch.bfloat16
HF = {"silu": lambda g: F.silu(g), "gelu": lambda g: F.gelu(g), "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
ROWS: list[str] = []  # the summary table, printed last


def say(line: str) -> None:
    print(line, flush=True)


def soft(label: str, fn, *args):
    """Run one variant; on failure print why and go on."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a probe reports every failure and continues
        say(f"[{label}] FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        traceback.print_exc(limit=3)
        return None


def graph_ms(fn) -> float:
    """Median GPU time of fn replayed from a CUDA graph (captured after two warm-up calls)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median")


def peak_mib(fn) -> float:
    """Peak allocated memory above what was allocated before `fn`, its outputs included."""
    return peak_memory(fn).peak_bytes / 2**20


class _OursSplit(torch.autograd.Function):
    """Stand-in for phase 2's autograd function: saves gate and up only; `inplace` writes the
    gradients over them (as Liger does; safe only when nothing reads gate/up afterwards)."""

    @staticmethod
    def forward(ctx, gate, up, act, inplace):
        ctx.save_for_backward(gate, up)
        ctx.act, ctx.inplace = act, inplace
        return gated_act_fwd(gate, up, act, eager=True)

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors
        out = dict(d_gate=gate, d_up=up) if ctx.inplace else {}
        dg, du, _ = gated_act_bwd(dh, gate, up, ctx.act, eager=True, **out)
        return dg, du, None, None


class _OursPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up, act, inplace):
        ctx.save_for_backward(gate_up)
        ctx.act, ctx.inplace = act, inplace
        return gated_act_packed_fwd(gate_up, act, eager=True)

    @staticmethod
    def backward(ctx, dh):
        (gate_up,) = ctx.saved_tensors
        d, _ = gated_act_packed_bwd(dh, gate_up, ctx.act, out=gate_up if ctx.inplace else None, eager=True)
        return d, None, None


def eager_split(g, u):
    return F.silu(g) * u


def eager_packed(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


COMPILED = {"split": torch.compile(eager_split), "packed": torch.compile(eager_packed)}


def providers():
    """name -> (layout, fn over the layout's inputs)."""
    p = {
        "ours": ("split", lambda g, u: _OursSplit.apply(g, u, "silu", False)),
        "ours inplace": ("split", lambda g, u: _OursSplit.apply(g, u, "silu", True)),
        "ours packed": ("packed", lambda gu: _OursPacked.apply(gu, "silu", False)),
        "ours packed inplace": ("packed", lambda gu: _OursPacked.apply(gu, "silu", True)),
        "eager": ("split", eager_split),
        "eager packed": ("packed", eager_packed),
        "compile": ("split", lambda g, u: COMPILED["split"](g, u)),
        "compile packed": ("packed", lambda gu: COMPILED["packed"](gu)),
    }
    if LigerSiLUMulFunction is not None:
        p["liger"] = ("split", lambda g, u: LigerSiLUMulFunction.apply(g, u))
        p["liger packed"] = ("packed", lambda gu: LigerSiLUMulFunction.apply(*gu.chunk(2, dim=-1)))
    return p


def check_correctness(n: int, i: int) -> None:
    """Launchers vs the reference (tolerance table) and vs transformers' eager act(gate) * up (bitwise
    fraction), split and packed, each activation, bf16."""
    gu = torch.randn(n, 2 * i, device="cuda", dtype=BF16)
    g, u = gu[:, :i], gu[:, i:]
    dh = torch.randn(n, i, device="cuda", dtype=BF16)
    for act in ("silu", "gelu", "gelu_tanh"):
        h = gated_act_fwd(g, u, act)
        dg, du, h2 = gated_act_bwd(dh, g, u, act, with_h=True)
        hp = gated_act_packed_fwd(gu, act)
        dp, _ = gated_act_packed_bwd(dh, gu, act)
        ref_dg, ref_du = R.gated_act_backward(dh, g, u, act)
        eager = HF[act](g) * u
        oks = [compare(h, R.gated_act(g, u, act)), compare(dg, ref_dg), compare(du, ref_du)]
        same = torch.equal(hp, h) and torch.equal(dp[:, :i], dg) and torch.equal(dp[:, i:], du) and torch.equal(h2, h)
        bit = (h == eager).float().mean().item()
        if LigerSiLUMulFunction is not None and act == "silu":
            liger_bit = (LigerSiLUMulFunction.apply(g.contiguous(), u.contiguous()) == eager).float().mean().item()
            extra = f" liger fwd bitwise==eager {liger_bit:.5f}"
        else:
            extra = ""
        verdict = "ok" if all(c.passed for c in oks) and same else "MISMATCH"
        say(f"check {n}x{i} {act:9s} {verdict}: h/d_gate/d_up max abs err "
            f"{', '.join(f'{c.max_abs_err:.3g}' for c in oks)}; packed==split {same}; "
            f"fwd bitwise==eager {bit:.5f}{extra}")
        del h, dg, du, h2, hp, dp, ref_dg, ref_du, eager
    torch.cuda.empty_cache()


def time_providers(n: int, i: int, ceil: float) -> None:
    nb = n * i * 2  # bytes of one (N, I) bf16 tensor
    pct = lambda units, ms: units * nb / ms / 1e6 / ceil * 100  # noqa: E731
    for name, (layout, fn) in providers().items():
        def run(name=name, layout=layout, fn=fn):
            torch.manual_seed(0)
            gu = torch.randn(n, 2 * i, device="cuda", dtype=BF16)
            if layout == "packed":
                inputs = (gu.requires_grad_(),)
            else:
                inputs = tuple(t.contiguous().requires_grad_() for t in gu.chunk(2, dim=-1))
                del gu
            dh = torch.randn(n, i, device="cuda", dtype=BF16)
            with torch.no_grad():
                fwd = do_bench(lambda: fn(*inputs), return_mode="median")

            def fb():
                torch.autograd.grad(fn(*inputs), inputs, dh)

            fb()
            peak = peak_mib(fb)
            fwdbwd = do_bench(fb, return_mode="median")
            graph = graph_ms(fb)
            row = (f"{n}x{i} {name:20s} fwd {fwd * 1e3:8.1f}us {pct(3, fwd):5.1f}% | fwd+bwd do_bench "
                   f"{fwdbwd * 1e3:8.1f}us {pct(8, fwdbwd):5.1f}% | graph {graph * 1e3:8.1f}us {pct(8, graph):5.1f}% "
                   f"| peak {peak:7.1f} MiB")
            say(row)
            ROWS.append(row)

        soft(f"{n}x{i} {name}", run)
        torch.cuda.empty_cache()
    # the kernels alone (graph replay): forward and backward, split and packed
    def kernels():
        gu = torch.randn(n, 2 * i, device="cuda", dtype=BF16)
        g, u = (t.contiguous() for t in gu.chunk(2, dim=-1))
        dh = torch.randn(n, i, device="cuda", dtype=BF16)
        f = graph_ms(lambda: gated_act_fwd(g, u, "silu"))
        b = graph_ms(lambda: gated_act_bwd(dh, g, u, "silu"))
        fp = graph_ms(lambda: gated_act_packed_fwd(gu, "silu"))
        bp = graph_ms(lambda: gated_act_packed_bwd(dh, gu, "silu"))
        bh = graph_ms(lambda: gated_act_packed_bwd(dh, gu, "silu", with_h=True))
        copy = graph_ms(lambda: dh.copy_(g))
        row = (f"{n}x{i} kernels (graph): fwd {f * 1e3:.1f}us {pct(3, f):.1f}% bwd {b * 1e3:.1f}us {pct(5, b):.1f}% | "
               f"packed fwd {pct(3, fp):.1f}% bwd {pct(5, bp):.1f}% bwd+h {pct(6, bh):.1f}% | "
               f"torch copy of one tensor {pct(2, copy):.1f}%")
        say(row)
        ROWS.append(row)

    soft(f"{n}x{i} kernels", kernels)
    torch.cuda.empty_cache()


def sweep(ceil: float) -> None:
    """Kernel-only graph replays of fwd and bwd for tile, warp and precise-math variants."""
    A = _activations
    # each variant: fields of the "mlp" config, and precise_bf16 of the "math" one; {} is the committed one
    variants = [{}, {"tile_elements": 2048}, {"tile_elements": 8192},
                {"tile_elements": 8192, "elements_per_thread": 32}, {"elements_per_thread": 8},
                {"tile_elements": 16384}, {"tile_elements": 2048, "elements_per_thread": 8},
                {"max_block_c": 1024}, {"precise_bf16": True}, {"gated_bwd_tile_elements": 4096},
                {"gated_bwd_tile_elements": 1024}]
    for n, i in SHAPES:
        gu = torch.randn(n, 2 * i, device="cuda", dtype=BF16)
        g, u = (t.contiguous() for t in gu.chunk(2, dim=-1))
        dh = torch.randn(n, i, device="cuda", dtype=BF16)
        for v in variants:
            mlp = {k: val for k, val in v.items() if k != "precise_bf16"}
            math = {k: val for k, val in v.items() if k == "precise_bf16"}

            def one(v=v, g=g, u=u, gu=gu, dh=dh, n=n, i=i):
                pct = lambda units, ms: units * n * i * 2 / ms / 1e6 / ceil * 100  # noqa: E731
                res = []
                for act in ("silu", "gelu_tanh"):
                    f = graph_ms(lambda: gated_act_fwd(g, u, act))
                    b = graph_ms(lambda: gated_act_bwd(dh, g, u, act))
                    bp = graph_ms(lambda: gated_act_packed_bwd(dh, gu, act))
                    res.append(f"{act} fwd {pct(3, f):5.1f}% bwd {pct(5, b):5.1f}% packed bwd {pct(5, bp):5.1f}%")
                # contiguous operands stream as one flat row: these are the tiles that run
                cfg = tuning.current("mlp")
                t, tb = A.tiles(1, n * i), A.tiles(1, n * i, cfg, cfg.gated_bwd_tile_elements)
                row = (f"sweep {n}x{i} {str(v or 'committed'):50s} fwd tile {t.block_c} {t.num_warps}w, bwd tile "
                       f"{tb.block_c} {tb.num_warps}w | "
                       + " | ".join(res))
                say(row)
                ROWS.append(row)

            with tuning.changed("mlp", **mlp), tuning.changed("math", **math):
                soft(f"sweep {v}", one)
        del gu, g, u, dh
        torch.cuda.empty_cache()


def bias(ceil: float) -> None:
    """Bias + GELU (tanh: GPT-2; exact: ViT/BERT) at 16384 tokens x 3072, and 4096 x 3072."""
    for n, d, act in [(16384, 3072, "gelu_tanh"), (16384, 3072, "gelu"), (4096, 3072, "gelu_tanh")]:
        def run(n=n, d=d, act=act):
            x = torch.randn(n, d, device="cuda", dtype=BF16)
            b = (torch.randn(d, device="cuda") * 0.1).to(BF16)
            dy = torch.randn_like(x)
            y = bias_act_fwd(x, b, act)
            dx, db = bias_act_bwd(dy, x, b, act)
            ok_y, ok_dx = compare(y, R.bias_act(x, b, act)), compare(dx, R.bias_act_backward(dy, x, b, act)[0])
            db_ref = R.bias_act_backward(dy, x, b, act)[1]
            ok_db = fp64_budget(db, db_ref, R.bias_act_backward(dy.double(), x.double(), b.double(), act)[1])
            again = bias_act_bwd(dy, x, b, act)
            det = torch.equal(again[0], dx) and torch.equal(again[1], db)
            hf = (lambda z: F.gelu(z, approximate="tanh")) if act == "gelu_tanh" else F.gelu
            bit = (y == hf(x + b)).float().mean().item()
            nb = n * d * 2
            f = graph_ms(lambda: bias_act_fwd(x, b, act))
            bw = graph_ms(lambda: bias_act_bwd(dy, x, b, act))
            xr, br = x.clone().requires_grad_(), b.clone().requires_grad_()
            eager = lambda: torch.autograd.grad(hf(xr + br), (xr, br), dy)  # noqa: E731
            comp_fn = torch.compile(lambda x, b: hf(x + b))
            comp = lambda: torch.autograd.grad(comp_fn(xr, br), (xr, br), dy)  # noqa: E731
            e_ms, c_ms = graph_ms(eager), graph_ms(comp)
            pct = lambda units, ms: units * nb / ms / 1e6 / ceil * 100  # noqa: E731
            row = (f"bias {n}x{d} {act:9s} y/dx/db {ok_y.passed}/{ok_dx.passed}/{ok_db.passed} det {det} "
                   f"bitwise==eager {bit:.5f} | ours fwd {pct(2, f):5.1f}% bwd {pct(3, bw):5.1f}% "
                   f"f+b {(f + bw) * 1e3:7.1f}us | eager f+b {e_ms * 1e3:7.1f}us | compile f+b {c_ms * 1e3:7.1f}us")
            say(row)
            ROWS.append(row)
            # backward variants: programs per SM and tile size of the row-group loop
            for per_sm, tile in ((8, 2048), (4, 4096), (8, 4096), (2, 2048)):
                with tuning.changed("mlp", bias_bwd_programs_per_sm=per_sm, bias_bwd_tile_elements=tile):
                    v = graph_ms(lambda: bias_act_bwd(dy, x, b, act))
                row = f"bias {n}x{d} {act:9s} bwd variant {per_sm}/SM tile {tile}: {pct(3, v):5.1f}% of copy"
                say(row)
                ROWS.append(row)

        soft(f"bias {n}x{d} {act}", run)
        torch.cuda.empty_cache()


class _Block(torch.autograd.Function):
    """Prototype of phase 2's whole-MLP function: saves x and the packed gate/up only; the backward
    writes [d_gate | d_up] over gate_up (ours, private) and recomputes h into dh's buffer (ours too)."""

    @staticmethod
    def forward(ctx, x, w_gu, w_down):
        gu = x @ w_gu.t()
        y = gated_act_packed_fwd(gu, "silu", eager=True) @ w_down.t()
        ctx.save_for_backward(x, gu, w_gu, w_down)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gu, w_gu, w_down = ctx.saved_tensors
        dh = dy @ w_down
        d_gu, h = gated_act_packed_bwd(dh, gu, "silu", out=gu, h=dh, with_h=True, eager=True)
        dw_down = dy.t() @ h
        return d_gu @ w_gu, d_gu.t() @ x, dw_down


def block() -> None:
    n, hid, inter = 16384, 4096, 14336

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(hid, inter, bias=False)
            self.up_proj = torch.nn.Linear(hid, inter, bias=False)
            self.down_proj = torch.nn.Linear(inter, hid, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    mlp = MLP().to("cuda", BF16)
    w_gu = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach().requires_grad_()
    w_down = mlp.down_proj.weight.detach().clone().requires_grad_()
    x = (torch.randn(n, hid, device="cuda") * 0.5).to(BF16).requires_grad_()
    dy = torch.randn(n, hid, device="cuda", dtype=BF16)
    comp = torch.compile(mlp)
    params = (x, *mlp.parameters())
    ref = torch.autograd.grad(mlp(x), params, dy)
    got = torch.autograd.grad(_Block.apply(x, w_gu, w_down), (x, w_gu, w_down), dy)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    say(f"block check rel err vs eager: dx {rel(got[0], ref[0]):.2e} dW_gu "
        f"{rel(got[1], torch.cat(ref[1:3])):.2e} dW_down {rel(got[2], ref[3]):.2e}")
    del ref, got
    runs = {
        "eager": lambda: torch.autograd.grad(mlp(x), params, dy),
        "compile": lambda: torch.autograd.grad(comp(x), params, dy),
        "ours block": lambda: torch.autograd.grad(_Block.apply(x, w_gu, w_down), (x, w_gu, w_down), dy),
    }
    for name, fn in runs.items():
        def run(name=name, fn=fn):
            fn()
            peak = peak_mib(fn)
            ms = do_bench(fn, return_mode="median")
            row = f"block {n}x{hid}x{inter} {name:12s} fwd+bwd do_bench {ms:7.3f} ms | peak {peak:8.1f} MiB"
            say(row)
            ROWS.append(row)

        soft(f"block {name}", run)
        torch.cuda.empty_cache()


def main(argv: list[str]) -> None:
    flags = set(argv) or {"--main"}
    if "--all" in flags:
        flags = {"--main", "--sweep", "--block", "--bias"}
    say(f"device {torch.cuda.get_device_name()} torch {torch.__version__} liger "
        f"{'yes' if LigerSiLUMulFunction is not None else 'not installed'}")
    ceil = measure_copy_gbps("cuda")
    say(f"copy ceiling {ceil:.0f} GB/s")
    if flags & {"--main"}:
        for n, i in SHAPES:
            soft(f"check {n}x{i}", check_correctness, n, i)
        for n, i in SHAPES:
            time_providers(n, i, ceil)
    if "--sweep" in flags:
        sweep(ceil)
    if "--bias" in flags:
        bias(ceil)
    if "--block" in flags:
        soft("block", block)
    say(f"\n==== summary (copy ceiling {ceil:.0f} GB/s) ====")
    for row in ROWS:
        say(row)


if __name__ == "__main__":
    main(sys.argv[1:])
