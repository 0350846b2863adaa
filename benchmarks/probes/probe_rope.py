# ruff: noqa: B023, E731  (lambdas are timed immediately, inside the loop that binds them)
"""GPU probe of the rotary-embedding kernel and the deterministic embedding backward.

Usage: PYTHONPATH=src python3 benchmarks/probes/probe_rope.py \
    [--sections check,rope,decode,variants,pairs,embedding] [--quick]

  check      correctness at the benchmark shapes (both layouts, both conventions, train and decode):
             ours vs the reference, vs transformers' eager formula (tolerance table and fp64 budget),
             hf_rounding bitwise vs eager, table vs rows, fused-QKV views in place
  rope       q (4, 32, 4096, 128) + k (4, 8, 4096, 128) bf16: ours vs eager vs torch.compile vs Liger,
             fwd and fwd+bwd, do_bench median and CUDA-graph replay, % of copy bandwidth, peak memory
  decode     B=32, one token, 32/8 heads: eager host time decides (target: ours <= eager median)
  variants   launch-parameter sweep of our kernel (heads per tile x warps), in place, table form,
             graph replay, plus registers/spills of the binaries
  pairs      how the tile kernel forms its pairs (TileConfig.pairs_rotate_half / pairs_interleaved), the
             per-token kernel (RopeConfig.schedule="token") and the flat kernel (schedule="flat", the
             default; ops/rope/config.py), fwd and bwd in graph replay: the data that picks the defaults
  flat       the flat kernel's launch sweep (ops/rope/config.py's FlatConfig: elements x warps x partner
             x evict_tables), fwd and bwd in graph replay, beside torch.compile's forward and backward
             kernels of the eager formula in the same run
  embedding  vocab 128256 x hidden 4096, 16384 tokens, bf16: ours (rows/segments, variants) vs torch's
             embedding backward, uniform and Zipf token streams, bitwise reruns
Every measurement fails soft: an error prints one line and the rest runs. A summary table ends the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from triton.testing import do_bench

from kernel_pytorch.benchmark.ceilings import measure_copy_gbps
from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.ops import embedding as emb_ops
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.embedding import embedding_grad
from kernel_pytorch.ops.rope import FlatConfig, rope_bwd, rope_fwd
from kernel_pytorch.ops.rope import tile as rope_tile
from kernel_pytorch.reference.rope import rope as rope_ref
from kernel_pytorch.reference.rope import rope_backward as rope_ref_bwd
from kernel_pytorch.reference.rope import rotate_half, rotate_pairs
from kernel_pytorch.reference.rope_tables import cos_sin, cos_sin_table, default_inv_freq
from kernel_pytorch.tolerances import tolerance_for

TRAIN = (4, 4096, 32, 8, 128)  # B, T, Hq, Hk, D
DECODE = (32, 1, 32, 8, 128)
VOCAB, HIDDEN, TOKENS = 128256, 4096, 16384
SUMMARY: list[str] = []


def soft(label: str, fn, *args, **kwargs):
    """Run fn; on failure print one line and return None."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # one failing variant must not stop the probe
        print(f"  FAILED {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        return None


def close(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float]:
    """The tolerance table's elementwise check, on the GPU (validation.compare copies to the host, slow
    at these sizes). Returns (passed, max abs difference)."""
    tol = tolerance_for(a.dtype)
    diff = (a.double() - b.double()).abs()
    ok = bool((diff <= tol.atol + tol.rtol * b.double().abs()).all()) and not bool(a.isnan().any())
    return ok, diff.max().item()


def budget(a: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, factor: float) -> tuple[bool, float, float]:
    """validation.fp64_budget on the GPU: err(a) <= factor * err(eager) + eps * max|exact|, errors
    against the fp64 `exact`. Returns (passed, our max error, eager's max error)."""
    err = (a.double() - exact).abs().max().item()
    eager_err = (eager.double() - exact).abs().max().item()
    floor = torch.finfo(a.dtype).eps * exact.abs().max().item()
    return err <= factor * eager_err + floor, err, eager_err


def graph_ms(fn) -> float:
    """Median ms of `fn` replayed from a CUDA graph (warm-up on a side stream, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median")


def bench_ms(fn) -> float:
    return do_bench(fn, return_mode="median")


def host_us(fn, calls: int = 500) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def peak_mib(fn) -> float:
    """Peak allocated memory above what was allocated before `fn`, its outputs included."""
    return peak_memory(fn).peak_bytes / 2**20


# --- providers ---------------------------------------------------------------------------------------


def eager_rope(q, k, cos, sin, interleaved=False, unsqueeze_dim=1):
    """transformers' eager formula (apply_rotary_pos_emb), products in the input dtype."""
    rot = rotate_pairs if interleaved else rotate_half
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


class OursRope(torch.autograd.Function):
    """A minimal differentiable wrapper for the probe (the library's is functional/rope.py's)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, interleaved, unsqueeze_dim, bwd_inplace):
        ctx.save_for_backward(cos, sin)
        ctx.args = (interleaved, unsqueeze_dim, bwd_inplace)
        return rope_fwd(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=unsqueeze_dim, eager=True)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        il, ud, inplace = ctx.args
        gq, gk = rope_bwd(dq, dk, cos, sin, interleaved=il, unsqueeze_dim=ud, inplace=inplace, eager=True)
        return gq, gk, None, None, None, None, None


def ours(q, k, cos, sin, interleaved=False, unsqueeze_dim=1, bwd_inplace=False):
    return OursRope.apply(q, k, cos, sin, interleaved, unsqueeze_dim, bwd_inplace)


def liger_provider():
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None
    return lambda q, k, cos, sin, interleaved=False, unsqueeze_dim=1: liger_rotary_pos_emb(q, k, cos, sin)


def make_inputs(shape, layout: str, interleaved: bool, dtype=torch.bfloat16, grad=False, shared=False):
    """q, k in `layout` memory order, cos/sin rows (B, T, D) at per-row offsets, or (1, T, D) when
    `shared` (one table for the batch, as the rope suite and a plain training batch have)."""
    b, t, hq, hk, d = shape
    mk = (lambda h: torch.randn(b, h, t, d, device="cuda")) if layout == "bhtd" else \
        (lambda h: torch.randn(b, t, h, d, device="cuda"))
    q, k = mk(hq).to(dtype), mk(hk).to(dtype)
    if shared:
        pos = torch.arange(t, device="cuda")[None]
    else:
        pos = torch.arange(t, device="cuda")[None] + torch.arange(b, device="cuda")[:, None] * 37
    cos, sin = cos_sin(default_inv_freq(10000.0, d, "cuda"), pos, 1.0, dtype, interleaved)
    if grad:
        q.requires_grad_()
        k.requires_grad_()
    return q, k, cos, sin, pos


# --- sections ----------------------------------------------------------------------------------------


def check(args) -> None:
    print("\n== check: correctness at the benchmark shapes")
    for shape_name, shape in (("train", TRAIN), ("decode", DECODE)):
        for layout in ("bhtd", "bthd"):
            for il in (False, True):
                ud = 1 if layout == "bhtd" else 2
                tag = f"{shape_name} {layout} {'interleaved' if il else 'half'}"
                soft(tag, _check_one, shape, layout, il, ud, tag)
    soft("fused qkv in place", _check_qkv)


def _check_one(shape, layout, il, ud, tag) -> None:
    q, k, cos, sin, pos = make_inputs(shape, layout, il)
    kw = dict(interleaved=il, unsqueeze_dim=ud)
    qo, ko = rope_fwd(q, k, cos, sin, **kw)
    rq, rk = rope_ref(q, k, cos, sin, **kw)
    eq, ek = eager_rope(q, k, cos, sin, il, ud)
    xq, xk = rope_ref(q.double(), k.double(), cos.double(), sin.double(), **kw)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    gq, gk = rope_bwd(dq, dk, cos, sin, **kw)
    bq, bk = rope_ref_bwd(dq, dk, cos, sin, **kw)
    hq, hk = rope_fwd(q, k, cos, sin, hf_rounding=True, **kw)
    tc, ts = cos_sin_table(default_inv_freq(10000.0, shape[4], "cuda"), int(pos.max()) + 1, 1.0, q.dtype, il)
    pq, pk = rope_fwd(q, k, tc, ts, pos, **kw)
    ok = all(close(a, b)[0] for a, b in ((qo, rq), (ko, rk), (gq, bq), (gk, bk)))
    vs_eager, vs_eager_max = close(qo, eq)
    within, err, eager_err = budget(qo, eq, xq, factor=1.0)
    bitwise_eager = torch.equal(hq, eq) and torch.equal(hk, ek)
    table = torch.equal(pq, qo) and torch.equal(pk, ko)
    same_ref = (qo == rq).float().mean().item()
    print(f"  {tag:28s} vs reference {'ok' if ok else 'MISMATCH'} (bitwise {same_ref:.4%}); "
          f"vs eager bf16: table {'ok' if vs_eager else 'exceeded'} (max {vs_eager_max:.3g}); "
          f"fp64 err ours {err:.3g} vs eager {eager_err:.3g}; "
          f"hf_rounding bitwise eager {bitwise_eager}; table==rows {table}")
    if not (ok and within and bitwise_eager and table):
        SUMMARY.append(f"check FAILED: {tag}")


def _check_qkv() -> None:
    b, t, hq, hk, d = TRAIN
    qkv = torch.randn(b, t, hq + 2 * hk, d, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    v0 = v.clone()
    _, _, cos, sin, _ = make_inputs((b, t, 1, 1, d), "bthd", False)
    rq, rk = rope_ref(q, k, cos, sin, unsqueeze_dim=2)
    rope_fwd(q, k, cos, sin, unsqueeze_dim=2, inplace=True)
    ok = close(q, rq)[0] and close(k, rk)[0] and torch.equal(v, v0)
    print(f"  fused qkv views, in place: {'ok' if ok else 'MISMATCH'}")


def rope_timing(args) -> None:
    print("\n== rope: train shape q (4, 32, 4096, 128) + k (4, 8, 4096, 128) bf16")
    ceil = args.ceiling
    liger = liger_provider()
    compiled = torch.compile(eager_rope)
    layouts = ("bhtd",) if args.quick else ("bhtd", "bthd")
    for layout in layouts:
        for il in (False, True):
            ud = 1 if layout == "bhtd" else 2
            q, k, cos, sin, _ = make_inputs(TRAIN, layout, il, grad=True)
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size()  # read + write q and k once
            dq, dk = torch.randn_like(q), torch.randn_like(k)
            provs = {"ours": ours, "ours (bwd in place)": lambda *a, **kw: ours(*a, **kw, bwd_inplace=True),
                     "eager": eager_rope, "compile": compiled}
            if liger is not None and layout == "bhtd" and not il:
                provs["liger"] = liger
            for name, f in provs.items():
                tag = f"{layout} {'interleaved' if il else 'half'} {name}"
                fwd = lambda: f(q.detach(), k.detach(), cos, sin, interleaved=il, unsqueeze_dim=ud)
                fb = lambda: torch.autograd.grad(f(q, k, cos, sin, interleaved=il, unsqueeze_dim=ud), (q, k),
                                                 (dq, dk))
                t = {key: soft(f"{tag} {key}", fn, g) for key, fn, g in (
                    ("fwd", bench_ms, fwd), ("fwd graph", graph_ms, fwd),
                    ("fwd+bwd", bench_ms, fb), ("fwd+bwd graph", graph_ms, fb))}
                mem = soft(f"{tag} peak", peak_mib, fb)
                cells = []
                for key, ms in t.items():
                    mult = 2 if "bwd" in key else 1
                    cells.append(f"{key} " + ("   --   " if ms is None else
                                              f"{ms * 1e3:7.1f}us {mult * nbytes / ms / 1e6 / ceil * 100:5.1f}%"))
                print(f"  {tag:34s} " + " | ".join(cells) + (f" | peak {mem:7.1f}MiB" if mem is not None else ""))
                g = t["fwd+bwd graph"]
                if g is not None:
                    SUMMARY.append(f"rope {tag}: fwd+bwd graph {g * 1e3:.1f}us = "
                                   f"{2 * nbytes / g / 1e6 / ceil * 100:.1f}% of copy")


def decode(args) -> None:
    print("\n== decode: B=32, T=1, 32/8 heads, D=128, bf16 (host-bound: eager medians and host us/call)")
    compiled = torch.compile(eager_rope)
    for layout in ("bhtd", "bthd"):
        ud = 1 if layout == "bhtd" else 2
        q, k, cos, sin, pos = make_inputs(DECODE, layout, False)
        provs = {
            "ours (Function)": lambda: ours(q, k, cos, sin, False, ud),
            "ours launcher": lambda: rope_fwd(q, k, cos, sin, unsqueeze_dim=ud, eager=True),
            "ours launcher in place": lambda: rope_fwd(q, k, cos, sin, unsqueeze_dim=ud, inplace=True, eager=True),
            "eager": lambda: eager_rope(q, k, cos, sin, False, ud),
            "compile": lambda: compiled(q, k, cos, sin, False, ud),
        }
        for name, fn in provs.items():
            ms = soft(name, bench_ms, fn)
            gms = soft(name, graph_ms, fn)
            us = soft(name, host_us, fn)
            line = (f"  {layout} {name:24s} do_bench {'--' if ms is None else f'{ms * 1e3:6.1f}us'}  "
                    f"graph {'--' if gms is None else f'{gms * 1e3:6.1f}us'}  "
                    f"host {'--' if us is None else f'{us:6.1f}us/call'}")
            print(line)
            if name in ("ours (Function)", "eager") and ms is not None:
                SUMMARY.append(f"decode {layout} {name}: do_bench median {ms * 1e3:.1f}us, host {us or 0:.1f}us/call")


def variants(args) -> None:
    print("\n== variants: our kernel, graph replay, train shape (tile elements x warps x tokens per tile)")
    ceil = args.ceiling
    tiles = args.tiles or ((4096,) if args.quick else (1024, 2048, 4096, 8192))
    warps = args.warps or ((4, 8) if args.quick else (2, 4, 8))
    base = tuning.current("rope")
    tokens = args.tokens or (base.tile.tokens,)
    for layout, il in args.layouts or [(lo, il) for lo in ("bhtd", "bthd") for il in (False, True)]:
        ud = 1 if layout == "bhtd" else 2
        q, k, cos, sin, pos = make_inputs(TRAIN, layout, il)
        tc, ts = cos_sin_table(default_inv_freq(10000.0, 128, "cuda"), int(pos.max()) + 1, 1.0, q.dtype, il)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        kw = dict(interleaved=il, unsqueeze_dim=ud)
        for tile, w, tpt in ((a, b, c) for a in tiles for b in warps for c in tokens):
            # the tile's size and tokens; the warps of every kernel (whichever the schedule runs)
            config = dataclasses.replace(
                base, tile=dataclasses.replace(base.tile, elements=tile, tokens=tpt, num_warps=w),
                token=dataclasses.replace(base.token, num_warps=w), flat=dataclasses.replace(base.flat, num_warps=w))
            cells = []
            for key, fn in (("fwd", lambda: rope_fwd(q, k, cos, sin, **kw)),
                            ("fwd inplace", lambda: rope_fwd(q, k, cos, sin, inplace=True, **kw)),
                            ("fwd table", lambda: rope_fwd(q, k, tc, ts, pos, **kw)),
                            ("bwd", lambda: rope_bwd(q, k, cos, sin, **kw))):
                with tuning.override(rope=config):
                    ms = soft(f"{layout} {tile} {w} {key}", graph_ms, fn)
                cells.append(f"{key} " + ("--" if ms is None else
                                          f"{ms * 1e3:6.1f}us {nbytes / ms / 1e6 / ceil * 100:5.1f}%"))
            print(f"  {layout} {'il' if il else 'half'} tile {tile:5d} warps {w:2d} tokens {tpt:3d}: "
                  + " | ".join(cells))
    fn = rope_tile._rope_kernel
    for cache in getattr(fn, "device_caches", {}).values():
        for key, compiled in cache[0].items():
            try:
                print(f"  regs {compiled.metadata.num_warps}w n_regs={compiled.n_regs} n_spills={compiled.n_spills} "
                      f"{str(key)[-120:]}")
            except AttributeError as exc:
                print(f"  regs: {exc}")


def pairs(args) -> None:
    """How a tile forms its pairs (TileConfig.pairs_*), and the per-token and flat kernels (RopeConfig's
    schedule), at the train shape in graph replay: the data that picks the defaults."""
    print("\n== pairs: how tiles form pairs and which kernel runs, graph replay, train shape")
    ceil = args.ceiling
    base = tuning.current("rope")
    for layout in ("bhtd", "bthd"):
        for il in (False, True):
            ud = 1 if layout == "bhtd" else 2
            q, k, cos, sin, _ = make_inputs(TRAIN, layout, il)
            nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
            kw = dict(interleaved=il, unsqueeze_dim=ud)
            methods = ("split", "partner") if il else ("halves", "split", "partner")
            for schedule, method in [("tile", m) for m in methods] + [("token", "-"), ("flat", "-")]:
                config = dataclasses.replace(base, schedule=schedule)
                if method != "-":
                    pairs_field = "pairs_interleaved" if il else "pairs_rotate_half"
                    config = dataclasses.replace(config, tile=dataclasses.replace(base.tile, **{pairs_field: method}))
                cells = []
                for key, fn in (("fwd", lambda: rope_fwd(q, k, cos, sin, **kw)),
                                ("bwd", lambda: rope_bwd(q, k, cos, sin, **kw))):
                    with tuning.override(rope=config):
                        ms = soft(f"{layout} {schedule} {method} {key}", graph_ms, fn)
                    cells.append(f"{key} " + ("--" if ms is None else
                                              f"{ms * 1e3:6.1f}us {nbytes / ms / 1e6 / ceil * 100:5.1f}%"))
                label = f"{layout} {'il' if il else 'half'} {schedule} {method}"
                print(f"  {label:28s}: " + " | ".join(cells))
                SUMMARY.append(f"pairs {label}: " + " | ".join(cells))


def embedding(args) -> None:
    print(f"\n== embedding backward: vocab {VOCAB} x hidden {HIDDEN}, {TOKENS} tokens, bf16")
    ceil = args.ceiling
    nbytes = (TOKENS + VOCAB) * HIDDEN * 2  # read dy once, write the gradient once
    dy = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    ranks = torch.arange(1, VOCAB + 1, device="cuda", dtype=torch.float32)
    streams = {"uniform": torch.randint(0, VOCAB, (TOKENS,), device="cuda"),
               "zipf": torch.multinomial(1.0 / ranks, TOKENS, replacement=True)}
    # fields of the "embedding" launch config (EmbeddingConfig) each variant changes; {} is the default
    configs = [dict(), dict(block_cols=256), dict(block_cols=4096), dict(tokens_per_step=16),
               dict(vocab_rows_per_program=1), dict(vocab_rows_per_program=16), dict(num_warps=8)]
    if args.quick:
        configs = configs[:2]
    for sname, idx in streams.items():
        top = torch.bincount(idx, minlength=VOCAB).max().item()
        print(f"  {sname}: {torch.unique(idx).numel()} distinct ids, hottest id {top} tokens")
        torch_fn = lambda: torch.ops.aten.embedding_dense_backward(dy, idx, VOCAB, -1, False)
        ref = torch.ops.aten.embedding_dense_backward(dy.float(), idx, VOCAB, -1, False)
        runs = [torch_fn() for _ in range(3)]
        torch_det = all(torch.equal(runs[0], r) for r in runs[1:])
        torch_ms = soft("torch", bench_ms, torch_fn)
        _print_emb(sname, "torch", torch_ms, soft("torch", graph_ms, torch_fn), nbytes, ceil,
                   f"bitwise reruns {torch_det}")
        if torch_ms is not None:
            SUMMARY.append(f"embedding {sname} torch: {torch_ms * 1e3:.0f}us, bitwise reruns {torch_det}")
        prep = lambda: torch.searchsorted(torch.sort(idx, stable=True)[0], torch.arange(VOCAB + 1, device="cuda"))
        _print_emb(sname, "(sort + searchsorted alone)", soft("prep", bench_ms, prep), soft("prep", graph_ms, prep),
                   nbytes, ceil, "")
        for mode in ("rows", "segments"):
            for cfg in configs:
                label = f"ours {mode} {cfg or 'default'}"
                config = emb_ops.EmbeddingConfig(**cfg)
                fn = lambda: embedding_grad(dy, idx, VOCAB, mode=mode, eager=True, config=config)
                out = soft(label, fn)
                if out is None:
                    continue
                det = all(torch.equal(out, fn()) for _ in range(2))
                err_ok, _ = close(out, ref.bfloat16())
                ms, gms = soft(label, bench_ms, fn), soft(label, graph_ms, fn)
                _print_emb(sname, label, ms, gms, nbytes, ceil,
                           f"bitwise reruns {det}, vs torch fp32 {'ok' if err_ok else 'MISMATCH'}")
                if not cfg and ms is not None:
                    SUMMARY.append(f"embedding {sname} ours {mode}: {ms * 1e3:.0f}us, bitwise reruns {det}")


def _print_emb(stream, label, ms, gms, nbytes, ceil, extra) -> None:
    fmt = lambda t: "--" if t is None else f"{t * 1e3:7.1f}us {nbytes / t / 1e6 / ceil * 100:5.1f}%"
    print(f"  {stream:7s} {label:44s} do_bench {fmt(ms)} graph {fmt(gms)} {extra}")


def flat(args) -> None:
    """The flat kernel's launch parameters, in graph replay at the train shape, against torch.compile."""
    print("\n== flat: elements x warps x partner x evict_tables, graph replay, train shape")
    ceil = args.ceiling
    blocks = args.tiles or (2048, 4096, 8192)
    warps = args.warps or (4, 8)
    base = dataclasses.replace(tuning.current("rope"), schedule="flat")
    compiled = torch.compile(eager_rope)
    for layout, il in args.layouts or [("bhtd", False), ("bthd", False)]:
        ud = 1 if layout == "bhtd" else 2
        q, k, cos, sin, _ = make_inputs(TRAIN, layout, il, grad=True, shared=args.shared_table)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        dq, dk = torch.randn_like(q), torch.randn_like(k)
        kw = dict(interleaved=il, unsqueeze_dim=ud)
        tag = f"{layout} {'il' if il else 'half'}{' shared' if args.shared_table else ''}"
        pct = lambda ms: "--" if ms is None else f"{ms * 1e3:6.1f}us {nbytes / ms / 1e6 / ceil * 100:5.1f}%"
        # compile's backward kernel alone: the fwd+bwd replay minus the forward replay
        c_fwd = soft(f"{tag} compile fwd", graph_ms, lambda: compiled(q.detach(), k.detach(), cos, sin, **kw))
        c_fb = soft(f"{tag} compile fwd+bwd", graph_ms,
                    lambda: torch.autograd.grad(compiled(q, k, cos, sin, **kw), (q, k), (dq, dk)))
        c_bwd = None if c_fwd is None or c_fb is None else c_fb - c_fwd
        line = f"  {tag} compile {'':27s}: fwd {pct(c_fwd)} | bwd {pct(c_bwd)}"
        print(line)
        SUMMARY.append("flat " + line.strip())
        forms = [("wrap", ""), ("halves", ""), ("wrap", "evict_last"), ("halves", "evict_last")]
        if args.forms:
            forms = [tuple((f.split(":") + [""])[:2]) for f in args.forms.split(",")]
        for partner, evict in [f for f in forms if f[0] == "wrap"] if il else forms:  # interleaved: no partner
            for block, w in ((a, b) for a in blocks for b in warps):
                config = dataclasses.replace(
                    base, flat=FlatConfig(elements=block, num_warps=w, partner=partner, evict_tables=evict))
                label = f"{tag} {partner:6s} {evict or '-':10s} {block:5d} x {w}w"
                with tuning.override(rope=config):
                    fwd = soft(f"{label} fwd", graph_ms, lambda: rope_fwd(q.detach(), k.detach(), cos, sin, **kw))
                    bwd = soft(f"{label} bwd", graph_ms, lambda: rope_bwd(dq, dk, cos, sin, **kw))
                line = f"  {label:36s}: fwd {pct(fwd)} | bwd {pct(bwd)}"
                print(line)
                SUMMARY.append("flat " + line.strip())


SECTIONS = {"check": check, "rope": rope_timing, "decode": decode, "variants": variants, "pairs": pairs,
            "flat": flat, "embedding": embedding}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    parser.add_argument("--quick", action="store_true", help="fewer layouts and variants")
    ints = lambda v: tuple(int(x) for x in v.split(","))
    parser.add_argument("--tiles", type=ints, help="variants: TileConfig.elements values, comma-separated "
                        "(flat: FlatConfig.elements)")
    parser.add_argument("--warps", type=ints, help="variants, flat: num_warps values")
    parser.add_argument("--tokens", type=ints, help="variants: TileConfig.tokens values")
    parser.add_argument("--layouts", type=lambda v: [(x.split(":")[0], x.endswith(":il")) for x in v.split(",")],
                        help="variants: bhtd, bthd, bhtd:il, bthd:il (comma-separated; default all four)")
    parser.add_argument("--shared-table", action="store_true", help="flat: cos/sin (1, T, D), one table for all rows")
    parser.add_argument("--forms", help="flat: partner:evict_tables pairs, e.g. wrap:,wrap:evict_last")
    args = parser.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    args.ceiling = measure_copy_gbps("cuda")
    print(f"copy ceiling {args.ceiling:.0f} GB/s (1 GiB device copy, read + write); percentages below are of it")
    for name in (n.strip() for n in args.sections.split(",")):
        if name not in SECTIONS:
            print(f"unknown section {name!r}; known: {', '.join(SECTIONS)}")
            continue
        soft(name, SECTIONS[name], args)
    print("\n== summary (targets: train fwd+bwd graph >= 90% of copy and faster than compile and Liger; "
          "decode ours <= eager median)")
    for line in SUMMARY:
        print("  " + line)


if __name__ == "__main__":
    main()
