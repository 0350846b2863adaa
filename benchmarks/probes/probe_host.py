# ruff: noqa: E731  (the timed calls are lambdas built next to their inputs)
"""Host time of our eager ops: launch-bound shapes on the GPU, or the per-call Python cost on the CPU.

    PYTHONPATH=src python benchmarks/probes/probe_host.py            # GPU, < 30 s: ours vs eager torch, do_bench
    PYTHONPATH=src python benchmarks/probes/probe_host.py --breakdown  # + where SwiGLU's host time goes, per layer
    PYTHONPATH=src python benchmarks/probes/probe_host.py --host     # CPU: per-call us of our eager path, no launch
    PYTHONPATH=src python benchmarks/probes/probe_host.py --host --profile rms_norm   # + cProfile of one op

GPU: median ms of kernel_pytorch.benchmark's timer (CUDA events, L2 flushed, as the suites time their
do_bench rows) of ours (backend=backend) against eager torch as transformers writes it, at shapes where
host time decides: SwiGLU 4096x1024 fwd and fwd+bwd, RoPE decode q (32, 32, 1, 128) + k (32, 8, 1, 128)
fwd, RMSNorm 8x4096 fwd+bwd; the ratio is eager / ours (>= 1: ours no slower). fwd under no_grad,
fwd+bwd through torch.autograd.grad with a fixed upstream gradient, as the suites do.

CPU (--host): the eager CUDA path of every op family run on CPU tensors with the Triton launch replaced
by a no-op (`Launcher.__call__`), so what is left is our Python: the functional entry (checks, backend
resolution), the eager entry (autograd.Function), the launchers (tile choice, allocations, strides).
Microseconds of this thread's CPU time per call, the least of 15 repeats (other users of a shared
machine only ever add time). Columns, for fwd (under no_grad) and f+b (fwd + torch.autograd.grad):
    fwd, fwd+bwd      the functional call (kernel_pytorch.functional, backend=backend)
    entry             the eager entry called directly (the functional call less checks and dispatch)
    launch            the launchers alone, eager=True, no autograd
    torch             eager torch's formula for the op on tiny CPU tensors: its own host path (dispatch,
                      autograd nodes), the compute negligible; the yardstick (on the GPU each of its ops
                      is a kernel launch too)
A second table times the direct launch's lookup key per fwd+bwd on the recorded arguments of every
launch: Triton's specialisation key (`_arg_key`, built on every launch before) against the per-call key
(`_call_key`). The rest of a direct launch (stream, Triton's launcher) needs CUDA and is not measured.
CPU-only work is in the columns where the functional layer reads values off CUDA only (embedding's
index range, one min/max) and in cross-entropy's target range check (a host sync on CUDA as well).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kernel_pytorch import functional as F

Call = Callable[[], Any]


def per_call_us(fn: Call, min_s: float = 0.2, repeats: int = 15, clock: Callable[[], float] = time.perf_counter
                ) -> float:
    """Least of `repeats` mean per-call microseconds (each repeat runs for about min_s / repeats): noise
    from other processes only ever adds time."""
    for _ in range(20):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.02:
        fn()
        n += 1
    n = max(10, int(n * min_s / repeats / 0.02))
    means = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        means.append((clock() - t0) / n)
    return min(means) * 1e6


# ---- the CPU probe: our eager path without the launch ------------------------------------------------


# the arguments of each launch, while a probe records them (launch_keys)
RECORDED: list[tuple] | None = None


@contextlib.contextmanager
def eager_path_without_launch() -> Iterator[None]:
    """Route CPU tensors down the eager CUDA path (functional sees an active Triton path) and make every
    kernel launch, direct or through wrap_triton, a no-op."""
    from kernel_pytorch.functional import _dispatch
    from kernel_pytorch.ops._common import launch as _launch

    saved = _dispatch.triton_status, _launch.Launcher.__call__
    _dispatch.triton_status = lambda device=None: (True, "probe: launch replaced by a no-op")

    def no_launch(self: Any, grid: Any, *args: Any, eager: bool, num_warps: int, **meta: Any) -> None:
        if RECORDED is not None:
            RECORDED.append(args)

    _launch.Launcher.__call__ = no_launch
    try:
        yield
    finally:
        _dispatch.triton_status, _launch.Launcher.__call__ = saved


def _grad(out: Callable[[], Any], inputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...]) -> Call:
    return lambda: torch.autograd.grad(out(), inputs, grads)


def _arn_launchers(arn: Any, x: torch.Tensor, res: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> Any:
    _, h, rstd = arn.add_rms_norm_fwd(x, res, w, 1e-6, 0.0, "llama", eager=True)
    return arn.add_rms_norm_bwd(dy, dy, h, w, rstd, 0.0, "llama", eager=True)


def _hf_rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _hf_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def _torch_tiny(fwd: Callable[..., Any], inputs: tuple[torch.Tensor, ...], extra: tuple = ()) -> dict[str, Call]:
    """Eager torch's formula on tiny tensors: what its own host path costs on this CPU (the compute is
    negligible), the yardstick for ours."""
    def outs() -> tuple[torch.Tensor, ...]:
        o = fwd(*inputs, *extra)
        return o if isinstance(o, tuple) else (o,)

    def step() -> Any:
        o = outs()
        return torch.autograd.grad(o, [t for t in inputs if t.requires_grad], [torch.ones_like(t) for t in o])

    return {"torch fwd": outs, "torch f+b": step}


def host_cases() -> dict[str, dict[str, Call]]:
    """op -> {column: call}: small shapes, bf16 (fp32 logits for cross-entropy), inputs that need grad."""
    from kernel_pytorch import ops
    from kernel_pytorch.ops import add_rms_norm as arn
    from kernel_pytorch.ops import bias_act as ba
    from kernel_pytorch.ops import embedding as emb
    from kernel_pytorch.ops import gated_act as ga
    from kernel_pytorch.ops import layer_norm as ln
    from kernel_pytorch.ops import rms_norm as rn
    from kernel_pytorch.ops import rope as rp
    from kernel_pytorch.ops.cross_entropy import register as ce

    torch.manual_seed(0)
    bf = torch.bfloat16
    r = lambda *s, dtype=bf: torch.randn(*s, dtype=dtype).requires_grad_()
    T = "triton"
    tx, tw, tb, tr = r(2, 8), r(8), r(8), r(2, 8)  # the tiny inputs of the torch yardstick
    nn = torch.nn.functional
    cases: dict[str, dict[str, Call]] = {}

    x, w, b = r(8, 512), r(512), r(512)
    dy = torch.randn(8, 512, dtype=bf)
    cases["rms_norm"] = {
        "fwd": lambda: F.rms_norm(x, w, backend=T),
        "entry fwd": lambda: ops.rms_norm_eager(x, w, 1e-6, 0.0, "llama"),
        "launch fwd": lambda: rn.rms_norm_fwd(x, w, 1e-6, 0.0, "llama", eager=True),
        "fwd+bwd": _grad(lambda: F.rms_norm(x, w, backend=T), (x, w), (dy,)),
        "entry f+b": _grad(lambda: ops.rms_norm_eager(x, w, 1e-6, 0.0, "llama"), (x, w), (dy,)),
        "launch f+b": lambda: rn.rms_norm_bwd(dy, x, w, rn.rms_norm_fwd(x, w, 1e-6, 0.0, "llama", eager=True)[1],
                                              0.0, "llama", eager=True),
        **_torch_tiny(_hf_rms, (tx, tw)),
    }
    cases["layer_norm"] = {
        "fwd": lambda: F.layer_norm(x, w, b, backend=T),
        "entry fwd": lambda: ops.layer_norm_eager(x, w, b, 1e-5),
        "launch fwd": lambda: ln.layer_norm_fwd(x, w, b, 1e-5, eager=True),
        "fwd+bwd": _grad(lambda: F.layer_norm(x, w, b, backend=T), (x, w, b), (dy,)),
        "entry f+b": _grad(lambda: ops.layer_norm_eager(x, w, b, 1e-5), (x, w, b), (dy,)),
        "launch f+b": lambda: ln.layer_norm_bwd(dy, x, w, *ln.layer_norm_fwd(x, w, b, 1e-5, eager=True)[1:], True,
                                                eager=True),
        **_torch_tiny(lambda t, w_, b_: nn.layer_norm(t, (8,), w_, b_), (tx, tw, tb)),
    }
    res = r(8, 512)
    cases["add_rms_norm"] = {
        "fwd": lambda: F.add_rms_norm(x, res, w, backend=T),
        "entry fwd": lambda: ops.add_rms_norm_eager(x, res, w, 1e-6, 0.0, "llama"),
        "launch fwd": lambda: arn.add_rms_norm_fwd(x, res, w, 1e-6, 0.0, "llama", eager=True),
        "fwd+bwd": _grad(lambda: F.add_rms_norm(x, res, w, backend=T), (x, res, w), (dy, dy)),
        "entry f+b": _grad(lambda: ops.add_rms_norm_eager(x, res, w, 1e-6, 0.0, "llama"), (x, res, w), (dy, dy)),
        "launch f+b": lambda: _arn_launchers(arn, x, res, w, dy),
        **_torch_tiny(lambda t, r_, w_: (lambda h: (_hf_rms(h, w_), h))(t + r_), (tx, tr, tw)),
    }
    g, u = r(8, 512), r(8, 512)
    cases["gated_act"] = {
        "fwd": lambda: F.swiglu(g, u, backend=T),
        "entry fwd": lambda: ops.gated_act_eager(g, u, "silu"),
        "launch fwd": lambda: ga.gated_act_fwd(g, u, "silu", eager=True),
        "fwd+bwd": _grad(lambda: F.swiglu(g, u, backend=T), (g, u), (dy,)),
        "entry f+b": _grad(lambda: ops.gated_act_eager(g, u, "silu"), (g, u), (dy,)),
        "launch f+b": lambda: (ga.gated_act_fwd(g, u, "silu", eager=True), ga.gated_act_bwd(dy, g, u, "silu",
                                                                                              eager=True)),
        **_torch_tiny(lambda a, c: nn.silu(a) * c, (tx, tr)),
    }
    cases["bias_act"] = {
        "fwd": lambda: F.bias_act(x, b, "gelu_tanh", backend=T),
        "entry fwd": lambda: ops.bias_act_eager(x, b, "gelu_tanh"),
        "launch fwd": lambda: ba.bias_act_fwd(x, b, "gelu_tanh", eager=True),
        "fwd+bwd": _grad(lambda: F.bias_act(x, b, "gelu_tanh", backend=T), (x, b), (dy,)),
        "entry f+b": _grad(lambda: ops.bias_act_eager(x, b, "gelu_tanh"), (x, b), (dy,)),
        "launch f+b": lambda: (ba.bias_act_fwd(x, b, "gelu_tanh", eager=True),
                               ba.bias_act_bwd(dy, x, b, "gelu_tanh", eager=True)),
        **_torch_tiny(lambda t, b_: nn.gelu(t + b_, approximate="tanh"), (tx, tb)),
    }
    # the decode shape, laid out as the rope suite draws it: (B, T, H, D) projections seen as (B, H, T, D)
    q = torch.randn(32, 1, 32, 128, dtype=bf).transpose(1, 2).requires_grad_()
    k = torch.randn(32, 1, 8, 128, dtype=bf).transpose(1, 2).requires_grad_()
    cos, sin = torch.randn(32, 1, 128, dtype=bf), torch.randn(32, 1, 128, dtype=bf)
    dq, dk = torch.randn(32, 32, 1, 128, dtype=bf), torch.randn(32, 8, 1, 128, dtype=bf)
    rope_args = (None, False, 1, False)
    cases["rope"] = {
        "fwd": lambda: F.apply_rotary(q, k, cos, sin, backend=T),
        "entry fwd": lambda: ops.rope_eager(q, k, cos, sin, *rope_args),
        "launch fwd": lambda: rp.rope_fwd(q, k, cos, sin, *rope_args, eager=True),
        "fwd+bwd": _grad(lambda: F.apply_rotary(q, k, cos, sin, backend=T), (q, k), (dq, dk)),
        "entry f+b": _grad(lambda: ops.rope_eager(q, k, cos, sin, *rope_args), (q, k), (dq, dk)),
        "launch f+b": lambda: (rp.rope_fwd(q, k, cos, sin, *rope_args, eager=True),
                               rp.rope_bwd(dq, dk, cos, sin, *rope_args, eager=True)),
        **_torch_tiny(_hf_rope, (r(2, 2, 1, 8), r(2, 1, 1, 8), torch.randn(2, 1, 8, dtype=bf),
                                 torch.randn(2, 1, 8, dtype=bf))),
    }
    logits, target = r(8, 1024, dtype=torch.float32), torch.randint(0, 1024, (8,))
    one = torch.ones((), dtype=torch.float32)
    ce_args = (None, -100, "mean", 0.0, 0.0, 0.0)
    cases["cross_entropy"] = {
        "fwd": lambda: F.cross_entropy(logits, target, backend=T),
        "entry fwd": lambda: ops.cross_entropy_eager(logits, target, *ce_args, False),
        "launch fwd": lambda: ce._fwd_launch(logits, target, *ce_args, False, eager=True),
        "fwd+bwd": _grad(lambda: F.cross_entropy(logits, target, backend=T), (logits,), (one,)),
        "entry f+b": _grad(lambda: ops.cross_entropy_eager(logits, target, *ce_args, True), (logits,), (one,)),
        "launch f+b": lambda: ce._bwd_launch(one, ce._fwd_launch(logits, target, *ce_args, True, eager=True)[2],
                                             eager=True),
        **_torch_tiny(lambda t, y: nn.cross_entropy(t, y), (r(2, 8, dtype=torch.float32),),
                      (torch.randint(0, 8, (2,)),)),
    }
    idx, table = torch.randint(0, 512, (8, 16)), r(512, 64)
    de = torch.randn(8, 16, 64, dtype=bf)
    cases["embedding"] = {
        "fwd": lambda: F.embedding(idx, table, backend=T),
        "entry fwd": lambda: ops.embedding_eager(idx, table, -1, False),
        "launch fwd": lambda: emb.embedding_fwd(idx, table, -1, False, eager=True),
        "fwd+bwd": _grad(lambda: F.embedding(idx, table, backend=T), (table,), (de,)),
        "entry f+b": _grad(lambda: ops.embedding_eager(idx, table, -1, False), (table,), (de,)),
        "launch f+b": lambda: (emb.embedding_fwd(idx, table, -1, False, eager=True),
                               emb.embedding_bwd(de, idx, table, -1, False, eager=True)),
        **_torch_tiny(lambda w_, i: nn.embedding(i, w_), (r(8, 8),), (torch.randint(0, 8, (2, 2)),)),
    }
    return cases


COLUMNS = ("fwd", "entry fwd", "launch fwd", "torch fwd", "fwd+bwd", "entry f+b", "launch f+b", "torch f+b")


def _no_grad(fn: Call) -> Call:
    def run() -> Any:
        with torch.no_grad():
            return fn()
    return run


def launch_keys(name: str, step: Call) -> None:
    """Time the two launch keys of ops/_common/launch.py on the arguments of the launches of one call."""
    from kernel_pytorch.ops._common import launch as _launch

    global RECORDED
    RECORDED = []
    step()
    launches, RECORDED = RECORDED, None
    if not launches:
        print(f"  {name:14s} no Triton launch")
        return
    spec = per_call_us(lambda: [_launch._arg_key(a) for a in launches], clock=time.thread_time)
    call_key = getattr(_launch, "_call_key", None)
    now = per_call_us(lambda: [call_key(a) for a in launches], clock=time.thread_time) if call_key else float("nan")
    n_args = sum(map(len, launches))
    print(f"  {name:14s} {len(launches)} launches, {n_args} arguments: {spec:5.1f} us -> {now:5.1f} us")


def host_probe(only: list[str] | None, profile: str | None) -> None:
    torch.set_num_threads(1)  # host cost, not CPU kernels: no thread pool to wake (and other users share the CPU)
    with eager_path_without_launch():
        cases = host_cases()
        print(f"per-call us of thread CPU time (torch {torch.__version__}), our launches no-ops; fwd columns "
              "under no_grad")
        print(f"{'op':14s}" + "".join(f"{c:>11s}" for c in COLUMNS))
        for name, calls in cases.items():
            if only and name not in only:
                continue
            # CPU time of this thread: time spent descheduled (other users of a shared machine) does not count
            row = [per_call_us(_no_grad(calls[c]) if "fwd" in c and "+" not in c else calls[c], clock=time.thread_time)
                   for c in COLUMNS]
            print(f"{name:14s}" + "".join(f"{v:11.1f}" for v in row), flush=True)
        print("\nlaunch keys (the direct launch's lookup, not in the columns above): us per fwd+bwd, "
              "Triton's specialisation key built on every launch (before) vs the per-call key (now)")
        for name, calls in cases.items():
            if not only or name in only:
                launch_keys(name, calls["fwd+bwd"])
        if profile:
            step = cases[profile]["fwd+bwd"]
            for _ in range(50):
                step()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                step()
            prof.disable()
            stats = pstats.Stats(prof)
            print(f"\n== {profile} fwd+bwd: {stats.total_tt / 2000 * 1e6:.1f} us per call under cProfile")
            stats.sort_stats("tottime").print_stats(30)


# ---- the GPU probe: ours vs eager torch at launch-bound shapes -----------------------------------


def gpu_probe(device: str = "cuda", backend: str = "triton") -> None:
    """The GPU table (device/backend other than cuda/triton: a dry run of this code elsewhere)."""
    from kernel_pytorch.benchmark.timer import time_fn

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else device
    print(f"{name}, torch {torch.__version__}; ours backend={backend!r}; fwd under no_grad, fwd+bwd autograd.grad")
    start = time.perf_counter()
    bf = torch.bfloat16
    torch.manual_seed(0)
    rows: list[tuple[str, float, float]] = []

    def bench(label: str, ours: Call, eager: Call, no_grad: bool) -> None:
        def wrap(fn: Call) -> Call:
            if not no_grad:
                return fn

            def run() -> None:
                with torch.no_grad():
                    fn()
            return run
        t_ours = time_fn(wrap(ours), device=dev, warmup_ms=10, rep_ms=60).median_ms
        t_eager = time_fn(wrap(eager), device=dev, warmup_ms=10, rep_ms=60).median_ms
        rows.append((label, t_ours, t_eager))
        print(f"{label:44s} ours {t_ours:8.4f} ms  eager {t_eager:8.4f} ms  eager/ours {t_eager / t_ours:5.2f}x",
              flush=True)

    gate = torch.randn(4096, 1024, device=dev, dtype=bf, requires_grad=True)
    up = torch.randn(4096, 1024, device=dev, dtype=bf, requires_grad=True)
    dh = torch.randn(4096, 1024, device=dev, dtype=bf)
    silu = torch.nn.functional.silu
    bench("swiglu 4096x1024 fwd", lambda: F.swiglu(gate, up, backend=backend), lambda: silu(gate) * up, True)
    bench("swiglu 4096x1024 fwd+bwd",
          lambda: torch.autograd.grad(F.swiglu(gate, up, backend=backend), (gate, up), dh),
          lambda: torch.autograd.grad(silu(gate) * up, (gate, up), dh), False)
    bench("swiglu 4096x1024 fwd+bwd (inplace_backward)",
          lambda: torch.autograd.grad(F.swiglu(gate * 1, up * 1, inplace_backward=True, backend=backend),
                                      (gate, up), dh),
          lambda: torch.autograd.grad(silu(gate * 1) * (up * 1), (gate, up), dh), False)

    q = torch.randn(32, 1, 32, 128, device=dev, dtype=bf).transpose(1, 2)
    k = torch.randn(32, 1, 8, 128, device=dev, dtype=bf).transpose(1, 2)
    cos = torch.randn(32, 1, 128, device=dev, dtype=bf)
    sin = torch.randn(32, 1, 128, device=dev, dtype=bf)

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((-t[..., 64:], t[..., :64]), dim=-1)

    def hf_rope() -> tuple[torch.Tensor, torch.Tensor]:
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    bench("rope decode (32,32|8,1,128) fwd", lambda: F.apply_rotary(q, k, cos, sin, backend=backend), hf_rope,
          True)

    x = torch.randn(8, 4096, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(4096, device=dev, dtype=bf, requires_grad=True)
    dy = torch.randn(8, 4096, device=dev, dtype=bf)

    def hf_rms(t: torch.Tensor) -> torch.Tensor:
        t32 = t.float()
        return w * (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(t.dtype)

    bench("rms_norm 8x4096 fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(x, w, backend=backend), (x, w), dy),
          lambda: torch.autograd.grad(hf_rms(x), (x, w), dy), False)
    print("\nsummary (eager/ours >= 1.00: ours not slower, median of do_bench-style CUDA-event timing):")
    for label, t_ours, t_eager in rows:
        print(f"  {label:44s} {t_eager / t_ours:5.2f}x  {'ok' if t_ours <= t_eager else 'SLOWER'}")
    print(f"probe wall time {time.perf_counter() - start:.1f} s")


def _wall_us(fn: Call, dev: torch.device, calls: int = 400, repeats: int = 5) -> float:
    """Least over `repeats` of the mean wall-clock microseconds per call of `calls` back-to-back calls,
    synchronised only at the end: the sustained rate, host-bound when the kernels are shorter than the
    host's work per call."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize(dev)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(dev)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def gpu_breakdown(device: str = "cuda") -> None:
    """Where the host time of SwiGLU 4096x1024 fwd+bwd goes on this host: the sustained per-call wall time
    of each layer of our eager path beside eager torch's, then torch.profiler's CPU-side table (the
    autograd engine's device thread included) of a few calls of each."""
    from torch.profiler import ProfilerActivity, profile

    from kernel_pytorch import ops
    from kernel_pytorch.ops import gated_act as ga

    dev = torch.device(device)
    bf = torch.bfloat16
    g = torch.randn(4096, 1024, device=dev, dtype=bf, requires_grad=True)
    u = torch.randn(4096, 1024, device=dev, dtype=bf, requires_grad=True)
    dh = torch.randn(4096, 1024, device=dev, dtype=bf)
    silu = torch.nn.functional.silu
    gd, ud = g.detach(), u.detach()
    cases: dict[str, Call] = {
        "ours fwd+bwd (functional, autograd.grad)": lambda: torch.autograd.grad(F.swiglu(g, u, backend="triton"),
                                                                               (g, u), dh),
        "ours fwd+bwd (eager entry, autograd.grad)": lambda: torch.autograd.grad(ops.gated_act_eager(g, u, "silu"),
                                                                                (g, u), dh),
        "ours fwd, recording (functional)": lambda: F.swiglu(g, u, backend="triton"),
        "ours fwd, recording (eager entry)": lambda: ops.gated_act_eager(g, u, "silu"),
        "ours launchers fwd + bwd, no autograd": lambda: (ga.gated_act_fwd(gd, ud, "silu", eager=True),
                                                          ga.gated_act_bwd(dh, gd, ud, "silu", eager=True)),
        "ours launcher fwd alone": lambda: ga.gated_act_fwd(gd, ud, "silu", eager=True),
        "eager fwd+bwd (autograd.grad)": lambda: torch.autograd.grad(silu(g) * u, (g, u), dh),
        "eager fwd, recording": lambda: silu(g) * u,
        "eager fwd, no autograd": lambda: silu(gd) * ud,
        "torch: one mul, autograd.grad": lambda: torch.autograd.grad(g * 2, (g,), dh),
        "torch: one empty_like": lambda: torch.empty_like(gd),
    }
    print(f"\n== host breakdown, swiglu 4096x1024 bf16 on {torch.cuda.get_device_name(dev)}: sustained us per call "
          "(back-to-back calls, one sync at the end; least of 5 runs of 400)")
    for label, fn in cases.items():
        print(f"  {label:46s} {_wall_us(fn, dev):8.1f} us", flush=True)
    for label in ("ours fwd+bwd (functional, autograd.grad)", "eager fwd+bwd (autograd.grad)"):
        fn = cases[label]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize(dev)
        print(f"\n== torch.profiler, CPU side, 20 calls of {label}")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", action="store_true", help="CPU: per-call Python cost of the eager path")
    ap.add_argument("--ops", default="", help="comma-separated ops for --host (default: all)")
    ap.add_argument("--profile", default=None, help="--host: cProfile this op's fwd+bwd")
    ap.add_argument("--breakdown", action="store_true", help="GPU: after the table, where SwiGLU's host time goes")
    args = ap.parse_args()
    if args.host:
        host_probe([o for o in args.ops.split(",") if o] or None, args.profile)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("the GPU probe needs CUDA; --host measures the Python cost on the CPU")
        gpu_probe()
        if args.breakdown:
            gpu_breakdown()


if __name__ == "__main__":
    main()
