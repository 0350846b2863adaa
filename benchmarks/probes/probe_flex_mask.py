# ruff: noqa: E731  (lambdas are timed immediately)
"""GPU probe of the document block mask: Flex against dense-mask SDPA at the attention suite's shape.

Usage: PYTHONPATH=src python benchmarks/probes/probe_flex_mask.py [--passes build,fwd,bwd] [--seq 4096]
       (--device cpu --seq 512: a smoke run of the code here; no graph, no backward, unfused flex)

Shape: attention_documents' (B 4, 32 query heads, 8 KV heads, head_dim 128, bf16), documents of 512
tokens, causal within each, a fresh seq_ids tensor every call (as the suite and a packed training loop
pass it). Times are time_fn's (kernel_pytorch.benchmark.timer: CUDA events around each call, so host
work that leaves the GPU idle counts, as an eager user sees it), medians in ms:
  build  _flex.block_mask (the key-interval construction) vs create_block_mask over the Q x K grid (the
         old path); both checked equal, and the build captured in a CUDA graph, replayed on other ids.
  fwd    functional.attention(seq_ids=..., backend="flex") vs SDPA with the equivalent dense mask, no_grad.
  bwd    the same, fwd+bwd (torch.autograd.grad with a fixed upstream gradient).
  profile  the device kernels of ours (documents and plain causal, fwd and fwd+bwd) under torch.profiler:
         where the documents' forward spends its time (the suite had it level with the causal one).
Target: SDPA / ours >= 3. The first flex call of each pass compiles flex_attention (seconds).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask

from kernel_pytorch import functional as kpf
from kernel_pytorch.benchmark.suites.attention import DOC_LEN, doc_ids
from kernel_pytorch.benchmark.timer import time_fn
from kernel_pytorch.functional import _flex

B, HQ, HK, D = 4, 32, 8, 128
FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def ms(fn, dev: torch.device) -> float:
    return time_fn(fn, device=dev, warmup_ms=10.0, rep_ms=50.0, cpu_min_run_time=0.1).median_ms


def dense_mask(ids: torch.Tensor) -> torch.Tensor:
    """(1, 1, S, S) boolean: same document and causal (the suite's eager provider's mask)."""
    s = ids.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril()
    return ((ids[0, :, None] == ids[0, None, :]) & causal)[None, None]


def old_build(ids: torch.Tensor, s: int):
    mod = _flex._mask_mod(s, s, is_causal=True, window=None, seq_ids=ids, keep=None)
    return create_block_mask(mod, ids.shape[0], None, s, s, device=ids.device)


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def build(s: int, dev: torch.device) -> None:
    new = lambda: _flex.block_mask(s, s, is_causal=True, seq_ids=doc_ids(s, dev).expand(B, s), device=dev)
    old = lambda: old_build(doc_ids(s, dev).expand(B, s), s)
    print(f"build: equal to create_block_mask: {same(new(), old())}")
    t_new, t_old = ms(new, dev), ms(old, dev)
    print(f"build: ours {t_new:.3f} ms, create_block_mask {t_old:.3f} ms ({t_old / t_new:.0f}x)")
    if dev.type != "cuda":
        return
    try:  # capturable: no host sync; replayed on ragged documents not aligned to the 128 blocks
        ids = doc_ids(s, dev).expand(B, s).contiguous()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _flex.block_mask(s, s, is_causal=True, seq_ids=ids, device=dev)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _flex.block_mask(s, s, is_causal=True, seq_ids=ids, device=dev)
        ids.copy_((torch.arange(s, device=dev) // 300)[None].expand(B, s))
        graph.replay()
        print(f"build: CUDA graph replay equal to create_block_mask on other ids: {same(captured, old_build(ids, s))}")
    except Exception as exc:  # report and go on to the attention timings
        print(f"build: CUDA graph capture FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")


def attention(s: int, dev: torch.device, backward: bool) -> tuple[float, float]:
    gen = torch.Generator(dev).manual_seed(0)
    q, k, v = (torch.randn(B, h, s, D, device=dev, generator=gen, dtype=torch.bfloat16) for h in (HQ, HK, HK))
    ours = lambda: kpf.attention(q, k, v, is_causal=True, seq_ids=doc_ids(s, dev), backend="flex")
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(doc_ids(s, dev)), enable_gqa=True)
    if not backward:
        with torch.no_grad():
            err = (ours().float() - sdpa().float()).abs().max().item()
            t_ours, t_sdpa = ms(ours, dev), ms(sdpa, dev)
        name = "fwd"
    else:
        for t in (q, k, v):
            t.requires_grad_()
        dy = torch.randn(B, HQ, s, D, device=dev, generator=gen, dtype=torch.bfloat16)
        step = lambda fn: torch.autograd.grad(fn(), (q, k, v), dy)
        err = max((a.float() - b.float()).abs().max().item() for a, b in zip(step(ours), step(sdpa)))
        t_ours, t_sdpa = ms(lambda: step(ours), dev), ms(lambda: step(sdpa), dev)
        name = "fwd+bwd"
    print(f"{name}: ours {t_ours:.3f} ms, SDPA dense mask {t_sdpa:.3f} ms, {t_sdpa / t_ours:.2f}x "
          f"(target >= 3x); max |ours - SDPA| {err:.3g}")
    return t_ours, t_sdpa


def profile(s: int, dev: torch.device) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    gen = torch.Generator(dev).manual_seed(0)
    q, k, v = (torch.randn(B, h, s, D, device=dev, generator=gen, dtype=torch.bfloat16, requires_grad=True)
               for h in (HQ, HK, HK))
    dy = torch.randn(B, HQ, s, D, device=dev, generator=gen, dtype=torch.bfloat16)
    docs = lambda: kpf.attention(q, k, v, is_causal=True, seq_ids=doc_ids(s, dev), backend="flex")
    causal = lambda: kpf.attention(q, k, v, is_causal=True, backend="flex")
    for label, fn, backward in (("documents fwd", docs, False), ("causal fwd", causal, False),
                                ("documents fwd+bwd", docs, True), ("causal fwd+bwd", causal, True)):
        def call(fn=fn, backward=backward):
            if backward:
                torch.autograd.grad(fn(), (q, k, v), dy)
            else:
                with torch.no_grad():
                    fn()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                call()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_time_total > 0]
        events.sort(key=lambda e: -e.device_time_total)
        total = sum(e.device_time_total for e in events) / 5 / 1e3
        print(f"profile {label}: {total:.3f} ms of kernels per call")
        for e in events[:10]:
            print(f"  {e.device_time_total / 5 / 1e3:8.3f} ms  x{e.count // 5:<3d} {e.key[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", default="build,fwd,bwd")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    dev = torch.device(args.device)
    passes = args.passes.split(",")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    if dev.type != "cuda" and "bwd" in passes:
        passes.remove("bwd")  # FlexAttention has no CPU backward
    print(f"torch {torch.__version__}, {name}, B {B}, S {args.seq}, "
          f"{args.seq // DOC_LEN} documents of {DOC_LEN}")
    if "build" in passes:
        build(args.seq, dev)
    for name, backward in (("fwd", False), ("bwd", True)):
        if name in passes:
            attention(args.seq, dev, backward)
    if "profile" in passes and dev.type == "cuda":
        profile(args.seq, dev)


if __name__ == "__main__":
    main()
