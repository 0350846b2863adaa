"""End-to-end training step of an HF LlamaForCausalLM: eager, torch.compile, Liger, Liger + compile, ours
(`kernel_pytorch.optimize`), ours + compile and the built-in Llama; plus a 16k-context row and
generate rows (prefill + 256 greedy decode tokens).

    python benchmarks/bench_e2e.py                                  # H100: the benchmark's config, ~4 min
    python benchmarks/bench_e2e.py --out benchmarks/results         # replace the committed results
    python benchmarks/bench_e2e.py --quick --device cpu             # tiny config: checks the pipeline
    python benchmarks/bench_e2e.py --profile eager,ours+compile     # + where the step's time goes
    python benchmarks/bench_e2e.py --providers torch.compile-cg,ours+compile-cg   # mode="reduce-overhead"
    python benchmarks/bench_e2e.py --providers ours+compile+adamw,torch.compile+adamw  # our AdamW's kernel
    python benchmarks/bench_e2e.py --providers torch.compile+nocache     # called with use_cache=False
    python benchmarks/bench_e2e.py --providers= --no-long --generate-providers "ours + static cache + compile + ref"

The step is forward + backward + fused AdamW on (batch x seq) tokens, labels = input_ids (torch's
`AdamW(fused=True)`; a provider named with "+adamw" is stepped by `kernel_pytorch.optim.AdamW`). Each provider
gets a fresh model from the same seed, `--warmup` untimed steps (the first one's time is the warm-up /
compile time), then `--steps` timed steps (CUDA: synchronised wall time per step; the median is
reported). Tokens/s = batch * seq / median step time; MFU = model FLOPs per step (6 x matmul parameters x
tokens + causal attention) / step time / the bf16 matmul ceiling measured in the same run. Peak memory is
the CUDA allocator's peak over the timed steps (weights, gradients and optimizer state included); on CPU,
the profiler's allocation trace of one step.

Each provider runs in its own try/except, so one failure (or an out-of-memory) becomes a row with the
reason and the others still run. The whole run stops starting new providers once `--budget-s` of wall time
is spent (default 240 s on CUDA) and says which rows it skipped; the rows run in the order the target
reads them (the training providers, then the 16k row, then generation). Liger patches
transformers' classes for the whole process, so each Liger row runs in a child process of its own.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_pytorch.benchmark.ceilings import device_name, measure_ceilings, percent_of, tflops  # noqa: E402
from kernel_pytorch.benchmark.decode import compiled_frames, cudagraph_skips  # noqa: E402
from kernel_pytorch.benchmark.memory import peak_memory  # noqa: E402
from kernel_pytorch.benchmark.memory_peak import record_peak  # noqa: E402
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import resolve_device, summarize  # noqa: E402

DEFAULT_PROVIDERS = ("eager", "torch.compile", "ours", "ours+compile", "liger", "liger+compile", "builtin")
# opt-in: "-cg", the same model compiled with mode="reduce-overhead" (CUDA graphs, one per compiled graph);
# "ours+compile-reuse", ours compiled with Inductor's default options (ours+compile takes INDUCTOR_OPTIONS)
TRAIN_PROVIDERS = (*DEFAULT_PROVIDERS, "torch.compile-cg", "ours+compile-cg", "ours+compile-reuse")
# the generate rows: ours with the DynamicCache (eager), ours and HF's model with the static cache
GENERATE_PROVIDERS = ("ours", "ours + static cache + compile", "hf static cache + compile")
# any training provider + "+adamw": the same model stepped by kernel_pytorch.optim.AdamW instead of torch's
# fused AdamW (the update is the same; the kernel is one launch)
OUR_ADAMW = "+adamw"
# any training provider + "+nocache": the model is called with use_cache=False, which optimize()'s forward
# passes in training (compiled, transformers' default cache makes every layer's K and V graph outputs)
NO_CACHE = "+nocache"
# an "ours" provider + "+inorm": its RMSNorms run the reference math (backend "reference"), which a compiled
# graph hands to Inductor to fuse with its neighbours (the residual add, the gradient add), still recomputed
INDUCTOR_NORMS = "+inorm"
# an "ours" provider + "+opnorm": its RMSNorms keep our registered op in a compiled training graph too
# (nn.RMSNorm.compiled_norm = "op"; the default hands their math to Inductor)
OP_NORMS = "+opnorm"
# an "ours" provider + "+twopass": the fused loss's forward runs the two-pass cross-entropy kernel where it
# would run the one-read kernel (the tuning family fused_linear_cross_entropy's one_read off for the row)
TWO_PASS = "+twopass"


def optimizer_of(provider: str) -> tuple[str, bool]:
    """(the provider's model, whether kernel_pytorch.optim.AdamW steps it); NO_CACHE, INDUCTOR_NORMS,
    OP_NORMS and TWO_PASS suffixes are dropped."""
    for suffix in (NO_CACHE, INDUCTOR_NORMS, OP_NORMS, TWO_PASS):
        provider = provider.replace(suffix, "")
    if provider.endswith(OUR_ADAMW):
        return provider.removesuffix(OUR_ADAMW), True
    return provider, False


@dataclass(frozen=True)
class Size:
    """The decoder's sizes and the batch (the benchmark's config, or the --quick one)."""

    hidden: int = 2048
    intermediate: int = 5632
    layers: int = 8
    heads: int = 16
    kv_heads: int = 8
    vocab: int = 128256
    batch: int = 4
    seq: int = 2048
    long_seq: int = 16384
    prompt: int = 512
    decode: int = 256

    @property
    def label(self) -> str:
        return (f"HF Llama h{self.hidden} i{self.intermediate} L{self.layers} H{self.heads}/{self.kv_heads} "
                f"V{self.vocab}")

    def hf_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=max(self.long_seq, 4096),
                           attn_implementation="sdpa")

    def matmul_params(self) -> int:
        d, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * self.intermediate
        return self.layers * per_layer + self.vocab * d  # the lm_head; the embedding is a lookup

    def step_flops(self, batch: int, seq: int) -> int:
        """Forward + backward FLOPs of one step: 6 N per token, plus causal attention (QK^T and PV, half)."""
        tokens = batch * seq
        attention = 6 * self.layers * batch * seq * seq * self.hidden  # 3 x (4 B T^2 d) / 2
        return 6 * self.matmul_params() * tokens + attention


QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, batch=2, seq=32, long_seq=64,
             prompt=8, decode=4)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def hf_model(size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(size.hf_config())
    return model.to(dtype).train()


def builtin_model(size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=size.vocab, dim=size.hidden, n_layers=size.layers, n_heads=size.heads,
                         n_kv_heads=size.kv_heads, intermediate_size=size.intermediate,
                         max_seq_len=max(size.long_seq, size.seq), rope_theta=10000.0, norm_eps=1e-6)
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(config)
        model.init_weights()
    return model.to(dtype).train()


def ours(model: torch.nn.Module, size: Size, dev: torch.device) -> torch.nn.Module:
    """optimize() validated on a short batch (the full one would double the activations)."""
    from kernel_pytorch.optimize import optimize

    ids = torch.randint(0, size.vocab, (1, min(size.seq, 128)), device=dev)
    model, report = optimize(model, {"input_ids": ids, "labels": ids}, compile=False, seeds=(0,))
    if not report.passed:
        raise RuntimeError(f"optimize() did not validate: {report.summary(validation=False)}")
    return model


def build(provider: str, size: Size, dev: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    full, provider = provider, optimizer_of(provider)[0]
    if provider not in TRAIN_PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; known: {', '.join(TRAIN_PROVIDERS)}")
    if provider.startswith("liger"):
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama()  # patches transformers' Llama classes for every model built after
    if provider.startswith("builtin"):
        model = ours(builtin_model(size, dev, dtype), size, dev)
    else:
        model = hf_model(size, dev, dtype)
    if provider.startswith("ours"):
        model = ours(model, size, dev)
        from kernel_pytorch.nn import RMSNorm

        if INDUCTOR_NORMS in full:
            reference_backends(model, (RMSNorm,))
        elif OP_NORMS in full:
            for m in model.modules():
                if isinstance(m, RMSNorm):
                    m.compiled_norm = "op"
    if provider.endswith("-cg"):
        model = torch.compile(model, mode="reduce-overhead")
    elif provider == "ours+compile":  # compiled whole with the Inductor options optimize() recommends
        from kernel_pytorch.optimize import INDUCTOR_OPTIONS

        model = torch.compile(model, options=INDUCTOR_OPTIONS)
    elif provider.endswith("compile") or provider in ("builtin", "ours+compile-reuse"):
        model = torch.compile(model)
    return model


def _loss(model: torch.nn.Module, ids: torch.Tensor, **options: Any) -> torch.Tensor:
    out = model(input_ids=ids, labels=ids, **options)
    return out if isinstance(out, torch.Tensor) else out.loss


def kernel_gaps(kernels: list[tuple[float, float, str]]) -> tuple[float, float, list[tuple[float, str, str]]]:
    """From (start us, end us, name) of each kernel of a profiled span (at least one): the span, the time
    some kernel ran (overlaps merged) and each gap between kernels as (us, the kernel before, the one after)."""
    kernels = sorted(kernels)
    busy, gaps = 0.0, []
    run_start, run_end, last = kernels[0][0], kernels[0][1], kernels[0][2]
    for start, end, name in kernels[1:]:
        if start > run_end:
            busy += run_end - run_start
            gaps.append((start - run_end, last, name))
            run_start = start
        if end >= run_end:
            run_end, last = end, name
    busy += run_end - run_start
    return run_end - kernels[0][0], busy, gaps


def idle_summary(kernels: list[tuple[float, float, str]], top: int = 12) -> str:
    """Where the device waits (`kernel_gaps`): the span, the time some kernel ran and the idle rest, then
    the longest gaps between kernels with the kernels on either side (what the host was launching when the
    device ran dry)."""
    if not kernels:
        return "device idle: no kernels recorded\n"
    span, busy, gaps = kernel_gaps(kernels)
    gaps.sort(key=lambda g: -g[0])
    long_gaps = sum(g[0] for g in gaps if g[0] >= 20)
    lines = [f"device idle: span {span / 1e3:.2f} ms, kernels running {busy / 1e3:.2f} ms, "
             f"idle {(span - busy) / 1e3:.2f} ms ({len(gaps)} gaps; {long_gaps / 1e3:.2f} ms in gaps of 20 us or more)",
             "longest gaps (us, the kernel before -> the kernel after):"]
    lines += [f"  {gap:9.1f}  {before[:70]} -> {after[:70]}" for gap, before, after in gaps[:top]]
    return "\n".join(lines) + "\n"


def _kernel_intervals(prof: Any) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device-side event (kernels, copies, sets) the profiler recorded."""
    from torch.autograd import DeviceType

    return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if getattr(e, "device_type", None) == DeviceType.CUDA]


def profile_steps(step: Callable[[], Any], dev: torch.device, path: Path, rows: int = 40) -> None:
    """torch.profiler over two steps: the kernels by total device (or CPU) time, as a text table, and on
    CUDA where the device sat idle between kernels (`idle_summary`)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            step()
        _sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    idle = idle_summary(_kernel_intervals(prof)) if dev.type == "cuda" else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("two training steps; times are totals over both\n"
                    + prof.key_averages().table(sort_by=key, row_limit=rows) + "\n" + idle)


def host_phases(forward: Callable[[], torch.Tensor], update: Callable[[], None], step: Callable[[], Any],
                dev: torch.device, reps: int = 6) -> str:
    """The host's side of a synchronised step: the wall time the host spends issuing the forward, the
    backward and the optimizer (no sync between them), then waiting for the device; and the same steps
    run back to back with one sync at the end. When issuing takes about as long as the step, or the
    back-to-back step is much shorter than the synchronised one, the device waits on the host."""
    rows = []
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        update()
        t3 = time.perf_counter()
        _sync(dev)
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0))
    med = [statistics.median(col) * 1e3 for col in zip(*rows)]
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    _sync(dev)
    back_to_back = (time.perf_counter() - t0) * 1e3 / reps
    return (f"host per synchronised step (median of {reps}, ms): issuing forward {med[0]:.2f}, backward {med[1]:.2f}, "
            f"optimizer {med[2]:.2f}; then waiting for the device {med[3]:.2f}; step {med[4]:.2f}\n"
            f"{reps} steps back to back, one sync at the end: {back_to_back:.2f} ms per step\n")


def optimizer(provider: str, model: torch.nn.Module, dev: torch.device) -> torch.optim.Optimizer:
    """The provider's AdamW: kernel_pytorch.optim.AdamW for a "+adamw" one, else torch's fused on CUDA."""
    if optimizer_of(provider)[1]:
        from kernel_pytorch.optim import AdamW

        return AdamW(model.parameters(), lr=1e-5, backend="triton" if dev.type == "cuda" else "auto")
    return torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")


def train_row(provider: str, size: Size, dev: torch.device, dtype: torch.dtype, batch: int, seq: int,
              steps: int, warmup: int, matmul_tflops: float | None, profile_to: Path | None = None) -> Row:
    """`_train_row` with the fused loss's one-read kernel off for a TWO_PASS provider."""
    from kernel_pytorch.ops import tuning

    with tuning.changed("fused_linear_cross_entropy", one_read=TWO_PASS not in provider):
        return _train_row(provider, size, dev, dtype, batch, seq, steps, warmup, matmul_tflops, profile_to)


def _rates(row: Row, size: Size, batch: int, seq: int, matmul_tflops: float | None) -> str:
    """Fill the timed row's FLOPs, TFLOP/s and % of the matmul ceiling; return its tokens/s for the note."""
    row.flops = size.step_flops(batch, seq)
    row.tflops = tflops(row.flops, row.median_ms)
    if matmul_tflops:
        row.pct_of_matmul = percent_of(row.tflops, matmul_tflops)
    return f"{batch * seq / row.median_ms:.1f}k tok/s"


def mfu_note(row: Row) -> str:
    """"MFU x%" from the row's % of the matmul ceiling ("MFU -" where the ceiling was not measured)."""
    return f"MFU {row.pct_of_matmul:.1f}%" if row.pct_of_matmul is not None else "MFU -"


def training_step(provider: str, size: Size, dev: torch.device, dtype: torch.dtype, batch: int,
                  seq: int) -> tuple[Callable[[], torch.Tensor], Callable[[], None], Callable[[], torch.Tensor]]:
    """The provider's model and optimizer, built, as (forward, update, step) closures over one fixed batch of
    token ids: forward returns the loss, update steps the optimizer and drops the gradients, step does all three."""
    model = build(provider, size, dev, dtype)
    opt = optimizer(provider, model, dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, size.vocab, (batch, seq), generator=g).to(dev)

    graphs = optimizer_of(provider)[0].endswith("-cg")
    options = {"use_cache": False} if NO_CACHE in provider else {}

    def forward() -> torch.Tensor:
        if graphs:  # a new training step: the graphs' previous outputs (the gradients) are consumed
            torch.compiler.cudagraph_mark_step_begin()
        return _loss(model, ids, **options)

    def update() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step() -> torch.Tensor:
        loss = forward()
        loss.backward()
        update()
        return loss.detach()

    return forward, update, step


def _train_row(provider: str, size: Size, dev: torch.device, dtype: torch.dtype, batch: int, seq: int,
               steps: int, warmup: int, matmul_tflops: float | None, profile_to: Path | None = None) -> Row:
    """One provider's training step: timings, memory, tokens/s, warm-up and MFU (in the row's note); with
    `profile_to`, a profiler table of two more steps written there."""
    row = Row(op=f"train step {batch}x{seq}", shape=[batch, seq], config=size.label, dtype=str(dtype).split(".")[-1],
              provider=provider, pass_name="fwd+bwd+adamw")
    forward, update, step = training_step(provider, size, dev, dtype, batch, seq)
    graphs = optimizer_of(provider)[0].endswith("-cg")

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    _sync(dev)
    warm_s = time.perf_counter() - t0
    if dev.type == "cuda":
        # what warm-up cached (compile-time buffers) is released and one more step fills the cache as a
        # step does, so the reserved peak below is the steady state's
        torch.cuda.empty_cache()
        step()
        _sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    samples = []
    began = time.strftime("%H:%M:%S")
    for _ in range(steps):
        t = time.perf_counter()
        step()
        _sync(dev)
        samples.append((time.perf_counter() - t) * 1e3)
    # the timed window in wall-clock time, to line up with a clock/power log of the device (gpu_check's smi.csv)
    print(f"timed {provider} {batch}x{seq}: {began} - {time.strftime('%H:%M:%S')}, steps (ms): "
          + " ".join(f"{x:.2f}" for x in samples), flush=True)
    timing = summarize(samples, "wall clock per step, synchronised")
    reserved = ""  # the CUDA allocator's reserved peak beside the allocated one, where it is measured
    row.set_timing(timing)
    if dev.type == "cuda":
        if graphs:  # the graphs' private memory pools do not count as allocated: report what is reserved
            row.peak_mem_bytes = torch.cuda.max_memory_reserved(dev)
            row.peak_mem_method = "cuda allocator reserved peak (CUDA-graph pools included; an upper bound)"
        else:
            row.peak_mem_bytes, row.peak_mem_method = torch.cuda.max_memory_allocated(dev), "cuda allocator peak"
            reserved = f"; reserved {torch.cuda.max_memory_reserved(dev) / 2**20:.0f} MiB"
    else:
        m = peak_memory(step, dev)
        row.peak_mem_bytes, row.peak_mem_method = m.peak_bytes, m.method
    tok_s = _rates(row, size, batch, seq, matmul_tflops)
    row.note = f"{tok_s}; warm-up {warm_s:.1f} s ({warmup} steps); {mfu_note(row)}{reserved}"
    if profile_to is not None:
        profile_steps(step, dev, profile_to)
        if dev.type == "cuda":  # the host's side of the step (is the device waiting on Python?), and what is
            # live at the step's peak, by the line that allocated it
            with profile_to.open("a") as f:
                f.write(host_phases(forward, update, step, dev))
            peak = record_peak(step, dev)
            profile_to.with_name(profile_to.name.replace("_profile_", "_memory_")).write_text(
                f"one training step of {provider} ({batch}x{seq}), CUDA allocator trace\n" + peak.table(40) + "\n")
    return row


def paired_rows(pair: tuple[str, str], size: Size, dev: torch.device, dtype: torch.dtype, rounds: int,
                per_round: int, warmup: int, matmul_tflops: float | None) -> tuple[list[Row], str]:
    """Two providers built in one process and stepped in turns (`benchmark.paired.time_interleaved`: rounds of
    `per_round` steps each, the order reversed every other round), so a drift of the device's clock falls on
    both: a row each (no peak: both models are alive) and a note with the second's tokens/s over the first's,
    pooled and per round."""
    from kernel_pytorch.benchmark.paired import round_ratios, time_interleaved
    from kernel_pytorch.ops import tuning

    for p in pair:
        if p.startswith("liger") or optimizer_of(p)[0].endswith("-cg"):
            raise ValueError(f"{p} cannot be paired (Liger patches transformers for the whole process; CUDA-graph "
                             "providers own their outputs between steps)")
    batch, seq = size.batch, size.seq
    steps = {}
    for p in pair:
        step = training_step(p, size, dev, dtype, batch, seq)[2]

        def with_kernel(step: Callable[[], torch.Tensor] = step, one_read: bool = TWO_PASS not in p) -> None:
            # "+twopass": the fused loss's two-pass kernel for this provider's steps
            with tuning.changed("fused_linear_cross_entropy", one_read=one_read):
                step()

        for _ in range(warmup):
            with_kernel()
        steps[p] = with_kernel
    timings, medians = time_interleaved(steps, rounds=rounds, per_round=per_round, sync=lambda: _sync(dev))
    rows = []
    for p, timing in timings.items():
        row = Row(op=f"paired train step {batch}x{seq}", shape=[batch, seq], config=size.label,
                  dtype=str(dtype).split(".")[-1], provider=p, pass_name="fwd+bwd+adamw")
        row.set_timing(timing)
        other = pair[1] if p == pair[0] else pair[0]
        tok_s = _rates(row, size, batch, seq, matmul_tflops)
        row.note = (f"{tok_s}; {mfu_note(row)}; in turns with {other}, {rounds} rounds of {per_round} steps; "
                    "peak: see the train step rows")
        rows.append(row)
    ratios = round_ratios(medians, *pair)
    pooled = timings[pair[0]].median_ms / timings[pair[1]].median_ms
    note = (f"paired ({pair[0]} and {pair[1]} in one process, in turns): {pair[1]} {pooled:.3f}x {pair[0]}'s "
            f"tokens/s over all steps; per round {min(ratios):.3f}-{max(ratios):.3f}x (median "
            f"{statistics.median(ratios):.3f}x, {rounds} rounds)")
    return rows, note


def reference_backends(model: torch.nn.Module, kinds: tuple[type, ...] | None = None) -> int:
    """Set `backend = "reference"` on the optimized model's modules that have one (of `kinds`, or all):
    their math as plain torch ops, which a compiled graph hands to Inductor. Returns how many."""
    count = 0
    for m in model.modules():
        if isinstance(getattr(type(m), "backend", None), str) and (kinds is None or isinstance(m, kinds)):
            m.backend = "reference"
            count += 1
    return count


def inference_row(provider: str, size: Size, dev: torch.device, dtype: torch.dtype) -> Row:
    """Prefill `size.prompt` tokens and decode `size.decode` greedily: ours with the DynamicCache (eager), and
    ours or HF's model with the static cache (which generate() compiles). An "ours" provider ending in
    " + inorm" has its RMSNorms on the reference math, one ending in " + ref" every module with a backend
    (norms, MLP, embedding, RoPE): what Inductor makes of our ops' math at batch 1, beside our kernels."""
    row = Row(op=f"generate {size.prompt}+{size.decode}", shape=[1, size.prompt + size.decode], config=size.label,
              dtype=str(dtype).split(".")[-1], provider=provider, pass_name="prefill+decode")
    model = hf_model(size, dev, dtype).eval()
    if provider.startswith("ours"):
        model = ours(model, size, dev)
        if provider.endswith(" + inorm"):
            from kernel_pytorch.nn import RMSNorm

            reference_backends(model, (RMSNorm,))
        elif provider.endswith(" + ref"):
            reference_backends(model)
    extra = {"cache_implementation": "static"} if "static" in provider else {}
    ids = torch.randint(0, size.vocab, (1, size.prompt), device=dev)
    kw = dict(max_new_tokens=size.decode, min_new_tokens=size.decode, do_sample=False, **extra)

    def generate(**over: Any) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, **{**kw, **over})
        _sync(dev)
        return (time.perf_counter() - t) * 1e3

    frames, skips = compiled_frames(), cudagraph_skips()
    warm_s = generate() / 1e3  # warm-up (compiles the static-cache forward)
    frames, skips = compiled_frames() - frames, cudagraph_skips() - skips
    # frames Dynamo converts (compiles, or finds no graph in and leaves to Python) from here on are recompiles
    timed_from = compiled_frames()
    samples = [generate() for _ in range(1 if size == QUICK else 2)]
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


def in_child(fn: Callable[..., Row], args: tuple) -> Row:
    """fn(*args) in a fresh (spawned) process, so what it patches in transformers dies with it, and a device
    fault in it (an illegal address poisons its process's CUDA context) costs its row only."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def _failed(row_args: dict, exc: BaseException) -> Row:
    oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
    status = "out of memory" if oom else "error"
    return Row(**row_args, status=status, note=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
               if str(exc) else type(exc).__name__)


def run(size: Size, dev: torch.device, dtype: torch.dtype, providers: tuple[str, ...], steps: int, warmup: int,
        budget_s: float, long_row: bool, inference: bool, smoke: bool, profile: tuple[str, ...] = (),
        out: Path | None = None, generate: tuple[str, ...] = GENERATE_PROVIDERS, paired: tuple[str, ...] = (),
        paired_rounds: tuple[int, int] = (10, 4)) -> BenchmarkResults:
    """Every row in one run, each in its own try/except, within the time budget; `paired`: two training
    providers stepped in turns in one process (`paired_rows`: `paired_rounds` = rounds, steps per round)."""
    start = time.perf_counter()
    results = BenchmarkResults(name="e2e", device=device_name(dev), smoke=smoke)
    ceilings = measure_ceilings(dev)
    results.ceilings = ceilings
    matmul = ceilings.matmul_tflops
    try:
        import liger_kernel  # noqa: F401
        has_liger = True
    except ImportError:
        has_liger = False
    jobs: list[tuple[dict, Callable[[], Row]]] = []
    label, dt = size.label, str(dtype).split(".")[-1]
    for p in providers:
        args = dict(op=f"train step {size.batch}x{size.seq}", shape=[size.batch, size.seq], config=label, dtype=dt,
                    provider=p, pass_name="fwd+bwd+adamw")
        if p.startswith("liger") and not has_liger:
            results.add(Row(**args, status="not installed", note="liger_kernel is not importable"))
            continue
        where = out / f"e2e_profile_{p.replace('+', '_').replace('.', '_')}.txt" if p in profile and out else None
        row_args = (p, size, dev, dtype, size.batch, size.seq, steps, warmup, matmul, where)
        if p.startswith("liger") or (p.startswith("ours+compile") and dev.type == "cuda"):
            jobs.append((args, lambda row_args=row_args: in_child(train_row, row_args)))
        else:
            jobs.append((args, lambda row_args=row_args: train_row(*row_args)))
    if paired:
        args = dict(op=f"paired train step {size.batch}x{size.seq}", shape=[size.batch, size.seq], config=label,
                    dtype=dt, provider=" + ".join(paired), pass_name="fwd+bwd+adamw")
        pair_args = (paired, size, dev, dtype, paired_rounds[0], paired_rounds[1], warmup, matmul)
        jobs.append((args, lambda: in_child(paired_rows, pair_args) if dev.type == "cuda" else paired_rows(*pair_args)))
    if long_row:
        for p in ("eager", "ours+compile"):
            args = dict(op=f"train step 1x{size.long_seq}", shape=[1, size.long_seq], config=label, dtype=dt,
                        provider=p, pass_name="fwd+bwd+adamw")
            jobs.append((args, lambda p=p: train_row(p, size, dev, dtype, 1, size.long_seq, max(2, steps // 4),
                                                     warmup, matmul)))
    if inference:
        for p in generate:
            args = dict(op=f"generate {size.prompt}+{size.decode}", shape=[1, size.prompt + size.decode], config=label,
                        dtype=dt, provider=p, pass_name="prefill+decode")
            jobs.append((args, lambda p=p: inference_row(p, size, dev, dtype)))
    skipped = []
    for args, job in jobs:
        if time.perf_counter() - start > budget_s:
            skipped.append(f"{args['op']} / {args['provider']}")
            results.add(Row(**args, status="skipped", note=f"the {budget_s:.0f} s time budget was spent"))
            continue
        try:
            got = job()
        except KeyboardInterrupt:  # stopped at a time limit: keep the rows already measured
            results.notes.append(f"{PARTIAL_NOTE} during {args['op']} / {args['provider']}")
            break
        except Exception as exc:  # noqa: BLE001 (one provider's failure must not lose the others)
            got = _failed(args, exc)
        if isinstance(got, tuple):  # the paired rows and their note
            got, note = got
            results.notes.append(note)
        for row in got if isinstance(got, list) else [got]:
            results.add(row)
            print(f"{row.op:>24} {row.provider:>26}: {row.status} {row.median_ms or 0:.4g} ms {row.note}", flush=True)
        if out is not None:  # written after every row, so a run killed later still leaves these
            results.write(out)
        _free(dev)
    results.notes.append(f"{steps} timed steps after {warmup} warm-up steps per training row; wall time "
                         f"{time.perf_counter() - start:.0f} s of a {budget_s:.0f} s budget")
    if skipped:
        results.notes.append(f"skipped for the time budget: {', '.join(skipped)}")
    results.notes.append("MFU: model FLOPs (6 x matmul params x tokens + causal attention) per step / step time / "
                         "the matmul ceiling above; tokens/s, warm-up and MFU are in each row's status note")
    results.notes.extend(target_check(results, f"train step {size.batch}x{size.seq}"))
    return results


# The combined target, one provider: tokens/s >= SPEEDUP x torch.compile's AND peak <= MEMORY x Liger's
TARGET_SPEEDUP, TARGET_MEMORY = 1.2, 0.9


def target_check(results: BenchmarkResults, op: str) -> list[str]:
    """One note per measured `ours*` training row of `op`: its tokens/s over torch.compile's and its peak
    over Liger's in this run, and whether both halves of the target hold (a half whose baseline did not
    run is "-", and the target is then not judged)."""
    rows = {r.provider: r for r in results.rows if r.op == op and r.status == "ok" and r.median_ms}
    base_t, base_m = rows.get("torch.compile"), rows.get("liger")
    notes = []
    for name, row in rows.items():
        if not name.startswith("ours"):
            continue
        speed = base_t.median_ms / row.median_ms if base_t else None
        memory = row.peak_mem_bytes / base_m.peak_mem_bytes if base_m and base_m.peak_mem_bytes and row.peak_mem_bytes \
            else None
        if speed is None or memory is None:
            verdict = "not judged (a baseline did not run)"
        else:
            verdict = "met" if speed >= TARGET_SPEEDUP and memory <= TARGET_MEMORY else "not met"
        notes.append(f"target (>= {TARGET_SPEEDUP}x torch.compile's tokens/s and <= {TARGET_MEMORY}x Liger's peak): "
                     f"{name} {'-' if speed is None else f'{speed:.3f}x'} and "
                     f"{'-' if memory is None else f'{memory:.3f}x'}: {verdict}")
    return notes


def generate_rows(args: argparse.Namespace) -> tuple[str, ...]:
    """The generate() rows the flags ask for; an unknown name is a ValueError naming the known ones."""
    if args.generate_providers is None:
        return GENERATE_PROVIDERS[1:] if args.static_generate_only else GENERATE_PROVIDERS
    rows = tuple(p.strip() for p in args.generate_providers.split(",") if p.strip())
    for p in rows:
        base = p.removesuffix(" + inorm").removesuffix(" + ref") if p.startswith("ours") else p
        if base not in GENERATE_PROVIDERS:
            raise ValueError(f"unknown generate provider {p!r}; known: {', '.join(GENERATE_PROVIDERS)} "
                             "(an 'ours' one may end in ' + inorm' or ' + ref')")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 steps: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/e2e-<time>)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per training row (default 8; quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 1)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting rows after this many seconds")
    parser.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS), help="comma-separated training providers")
    parser.add_argument("--no-long", action="store_true", help="skip the 16k-context row")
    parser.add_argument("--no-inference", action="store_true", help="skip the generate() rows")
    parser.add_argument("--static-generate-only", action="store_true",
                        help="of the generate() rows, only the two with the static cache (ours, HF's)")
    parser.add_argument("--generate-providers", default=None,
                        help="comma-separated generate() rows instead (GENERATE_PROVIDERS, and an 'ours' one "
                        "with ' + inorm' or ' + ref': its norms or all its ops on the reference math)")
    parser.add_argument("--paired", default=None, help="two training providers, comma-separated, stepped in turns "
                        "in one process after the other rows (a drift in the device's clock falls on both alike)")
    parser.add_argument("--paired-rounds", default="10x4", help="ROUNDSxSTEPS for --paired (default 10x4)")
    parser.add_argument("--profile", default="", help="comma-separated training providers to profile (two more "
                        "steps each, e2e_profile_<provider>.txt beside the results; on CUDA one more, what is "
                        "live at its memory peak by allocating line, e2e_memory_<provider>.txt)")
    args = parser.parse_args(argv)
    dev = resolve_device(args.device)
    size = QUICK if args.quick else Size()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    steps = args.steps or (2 if args.quick else 8)
    warmup = args.warmup or (1 if args.quick else 3)
    budget = args.budget_s if args.budget_s is not None else (240.0 if dev.type == "cuda" else 600.0)
    providers = tuple(p for p in args.providers.split(",") if p)
    out = Path(args.out) if args.out else Path("bench-results") / f"e2e-{time.strftime('%Y%m%d-%H%M%S')}"
    profile = tuple(p for p in args.profile.split(",") if p)
    paired = tuple(p.strip() for p in args.paired.split(",") if p.strip()) if args.paired else ()
    if paired and len(paired) != 2:
        raise ValueError(f"--paired takes two providers, got {len(paired)}: {args.paired!r}")
    rounds, per_round = (int(v) for v in args.paired_rounds.split("x"))
    results = run(size, dev, dtype, providers, steps, warmup, budget, not args.no_long, not args.no_inference,
                  smoke=args.quick, profile=profile, out=out,
                  generate=generate_rows(args), paired=paired, paired_rounds=(rounds, per_round))
    js, md = results.write(out)
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
