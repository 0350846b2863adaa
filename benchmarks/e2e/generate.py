"""The end-to-end benchmark's generate() rows: prefill + greedy decode at batch 1 (bench_e2e.py runs them
after the training rows)."""

from __future__ import annotations

import time
from typing import Any

import torch

from e2e.families import Size
from e2e.models import hf_model, ours, sync
from e2e.providers import Provider
from kernel_pytorch.benchmark.decode import compiled_frames, cudagraph_skips
from kernel_pytorch.benchmark.results import Row
from kernel_pytorch.benchmark.timer import summarize


def inference_row(provider: Provider, size: Size, dev: torch.device, dtype: torch.dtype) -> Row:
    """Prefill `size.prompt` tokens and decode `size.decode` greedily: ours with the DynamicCache (eager), and
    ours or HF's model with the static cache (which generate() compiles). An "ours" provider with
    `+reference_norms` has its RMSNorms on the reference math, one with `+reference` every module with a
    backend (norms, MLP, embedding, RoPE): what Inductor makes of our ops' math at batch 1, beside our kernels."""
    row = Row(op=f"generate {size.prompt}+{size.decode}", shape=[1, size.prompt + size.decode], config=size.label,
              dtype=str(dtype).split(".")[-1], provider=provider.label, pass_name="prefill+decode")
    model = hf_model(size, dev, dtype).eval()
    if provider.base.startswith("ours"):
        model = provider.variant.apply(ours(model, size, dev))
    extra = {"cache_implementation": "static"} if "static cache" in provider.base else {}
    ids = torch.randint(0, size.vocab, (1, size.prompt), device=dev)
    kw = dict(max_new_tokens=size.decode, min_new_tokens=size.decode, do_sample=False, **extra)

    def generate(**over: Any) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, **{**kw, **over})
        sync(dev)
        return (time.perf_counter() - t) * 1e3

    frames, skips = compiled_frames(), cudagraph_skips()
    warm_s = generate() / 1e3  # warm-up (compiles the static-cache forward)
    frames, skips = compiled_frames() - frames, cudagraph_skips() - skips
    # frames Dynamo converts (compiles, or finds no graph in and leaves to Python) from here on are recompiles
    timed_from = compiled_frames()
    samples = [generate() for _ in range(1 if size.quick else 2)]
    timing = summarize(samples, "wall clock per generate() call, synchronised")
    row.set_timing(timing)
    # the prefill alone (one new token: generate()'s first forward, which it never compiles), so the note
    # can say what a decode step costs
    prefill = min(generate(max_new_tokens=1, min_new_tokens=1) for _ in range(2))
    per_token = (timing.median_ms - prefill) / max(1, size.decode - 1)
    row.note = (f"{size.decode / (timing.median_ms / 1e3):.0f} decode tok/s (prefill included); prefill "
                f"{prefill:.1f} ms, then {per_token:.2f} ms a token; warm-up {warm_s:.1f} s: {frames} Dynamo "
                f"frames converted, {skips} CUDA-graph skips; {compiled_frames() - timed_from} more while timed")
    return row
