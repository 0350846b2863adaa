"""Model-level decoding: single-token decode steps of an HF LlamaForCausalLM against a full static KV cache,
transformers' static-cache decode (eager, and compiled with CUDA graphs) against ours (`optimize()` then
the same compiled decode), a decoder built from kernel_pytorch.nn pieces, and torchao weight-only int8/fp8.

    python benchmarks/bench_decode.py --out benchmarks/results       # H100: the benchmark's config, ~200 s
    python benchmarks/bench_decode.py --quick --device cpu           # tiny config: checks the pipeline

Model: a random HF Llama of the e2e benchmark's size (hidden 2048, intermediate 5632, 8 layers, 16/8
heads, vocab 128256, bf16; no download). Cache: a StaticCache of `--cache` slots (4096) at batch 8,
filled directly with the same seeded random keys and values for every provider, so the whole cache is
read by every step; each timed run decodes `--steps` consecutive tokens at the last slots (the cache's
write position rewound before each run, untimed). Time per step: CUDA events around the run / steps
(`kernel_pytorch.benchmark.decode.time_steps`); tokens/s = batch / step time. Peak memory: the CUDA
allocator's peak over the timed runs, with nothing else resident (weights, cache, CUDA-graph pools).

Providers, in this order, each in its own try/except (a failure is a row with the reason):
  hf-eager    transformers' forward with StaticCache and cache_position, eager (its error is the budget's base)
  hf-compile  the same forward under torch.compile(mode="reduce-overhead"), as transformers recommends
  ours        kernel_pytorch.optimize(model) (module swaps; the attention rule passes HF's mask when
              decoding), then the same compiled decode
  ours-nn     a decoder of nn.Attention + StaticKVCache, RMSNorm, GatedMLP, Embedding and lm_head loaded
              with the same weights, compiled the same way
  ours+int8, ours+fp8   deploy.quantize after optimize, compiled (torchao; rows say so when missing)
  ours+int8-kp, ours+int4-kp, ours+fp8-kp   the same with backend="kernel_pytorch": our own weight-only
              kernels (ops/quant_matmul; int4 in groups of 128)
              then ours and the quantized rows at batch 1, where decoding is bound by the weights
Each quantized provider's accuracy, against the same model unquantized (ours, a copy taken before
quantize()), measured once by its first row and shown in both rows' notes and the "Quantized accuracy"
table (deploy.quant_accuracy): greedy agreement over `new_tokens` (64) generated tokens, teacher-forced
on the unquantized model's tokens, and the first divergence when the quantized model generates on its
own; the perplexity change and mean KL divergence on a seeded random token stream; the largest logit
error against expected_rtol; the linear layers' bytes against the unquantized ones.
Before timing, each provider's logits of one step are checked against a higher-precision reference: the
same model (its bf16 weights) and cache contents upcast to fp32 (fp64 when the run is fp32), one step,
built once before the first provider and freed. A provider passes when its max abs error against it is
within the budget of long reductions, 2 x hf-eager's own error against it + a floor
(`tolerances.fp64_budget`, as validate does); a quantized one when its error is within
that + 2 x expected_rtol x max|reference| (deploy.quantize.validate_quantized's rule). Dynamo frames
compiled during the timed runs (recompiles) are counted. New providers stop starting once the
`--budget-s` wall budget could not hold another (judged by the slowest compiled provider so far); the
results are written after every provider and on SIGINT; the exit code is nonzero if any row failed.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.benchmark.decode import compiled_frames, cudagraph_skips, time_steps  # noqa: E402
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import resolve_device  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared HF Llama helpers
from hf_llama import (  # noqa: E402
    LlamaSize,
    Reference,
    cache_tensors,
    cast,
    check_logits,
    exact_fp32,
    failure_status,
    hf_model,
    hi_dtype,
    optimized,
    rewind_hf,
    static_cache,
    versions,
)
from hf_llama import free as _free  # noqa: E402
from hf_llama import max_abs as _max_abs  # noqa: E402

BASELINE = "hf-compile"


@dataclass(frozen=True)
class Size(LlamaSize):
    """The decoder's widths (LlamaSize), the batch, the cache and the timing (the benchmark's config, or --quick's)."""

    batch: int = 8
    cache: int = 4096
    steps: int = 32  # consecutive decode steps per timed run
    reps: int = 15  # timed runs
    # quantized rows' accuracy against ours (bf16): greedy tokens after a seeded prompt, and a seeded stream
    new_tokens: int = 64
    prompt: int = 16
    stream: int = 256

    @property
    def max_positions(self) -> int:
        return self.cache


QUICK = Size(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256, batch=2, cache=64, steps=4,
             reps=2, new_tokens=8, prompt=4, stream=16)


@dataclass
class Decoder:
    """One provider's decode step: forward(ids (B, 1), position_ids (B, 1), cache_position (1,)) -> logits
    (B, 1, V); rewind(pos) sets where the next step writes; holds whatever keeps them alive."""

    forward: Callable[[Tensor, Tensor, Tensor], Tensor]
    rewind: Callable[[int], None]
    weights_bytes: int
    keep: list[Any] = field(default_factory=list)
    rtol: float | None = None  # quantized: deploy.quantize.expected_rtol of its weights before quantizing
    accuracy: dict[str, Any] | None = None  # quantized: `measure_accuracy` against ours (bf16)


# ---- the HF model, its static cache, ours ---------------------------------------------------------------

def cache_values(layer: int, batch: int, size: Size, dev: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The keys and values every provider's cache holds for `layer`: (batch, Hkv, cache, Dh) each, seeded;
    batch 1 gets batch 8's first row."""
    g = torch.Generator(device=dev).manual_seed(1000 + layer)
    shape = (max(batch, size.batch), size.kv_heads, size.cache, size.head_dim)
    k = torch.randn(shape, generator=g, device=dev, dtype=dtype)
    v = torch.randn(shape, generator=g, device=dev, dtype=dtype)
    return k[:batch].contiguous(), v[:batch].contiguous()


def filled_hf_cache(config: Any, size: Size, batch: int, dev: torch.device, dtype: torch.dtype,
                    store: torch.dtype | None = None) -> Any:
    """A StaticCache of size.cache slots holding `cache_values` in every layer (allocated now, so its
    tensors are marked as static addresses outside any compiled region); `store`: the cache's dtype when
    not `dtype` (the reference's: the same values, upcast)."""
    store = store or dtype
    cache = static_cache(config, size.cache, batch, dev, store)
    for i in range(size.layers):
        k, v = (t.to(store) for t in cache_values(i, batch, size, dev, dtype))
        keys, values = cache_tensors(cache, i, k[:, :, :1], v[:, :, :1])
        keys.copy_(k)
        values.copy_(v)
    return cache


def compiled(fn: Callable, backend: str, dev: torch.device) -> Callable:
    """fn under torch.compile: inductor with mode="reduce-overhead" (CUDA graphs) on CUDA, or `backend`."""
    if backend == "none":
        return fn
    if backend == "inductor":
        return torch.compile(fn, mode="reduce-overhead" if dev.type == "cuda" else None)
    return torch.compile(fn, backend=backend)


def weights_bytes(model: nn.Module) -> int:
    """Bytes of the saved weights (a quantized weight counted by its parts: int8/fp8 data and scales)."""
    from kernel_pytorch.deploy.quantize import tensors_of

    seen: set[int] = set()
    total = 0
    for t in tensors_of(model.state_dict()).values():
        key = t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def quant_scheme(provider: str) -> tuple[str, dict[str, Any]]:
    """(scheme, deploy.quantize's backend arguments) of a quantized provider: "ours+int8" is torchao's
    int8, "ours+int4-kp" kernel_pytorch's int4 (groups of 128)."""
    scheme = provider.split("+")[1]
    if scheme.endswith("-kp"):
        return scheme.removesuffix("-kp"), {"backend": "kernel_pytorch"}
    return scheme, {}


def hf_logits(model: nn.Module, ids: Tensor) -> Tensor:
    """Logits (B, T, V) of a whole sequence of ids (B, T), no cache."""
    return model(input_ids=ids, use_cache=False).logits


def measure_accuracy(reference: nn.Module, quantized: nn.Module, size: Size, dev: torch.device,
                     rtol: float) -> dict[str, Any]:
    """deploy.quant_accuracy of `quantized` against `reference` (the same model before quantize()) on a
    seeded prompt (2, size.prompt) and a seeded random stream (2, size.stream), the linear layers'
    bytes against the reference's, and the largest logit error against expected_rtol; {"error": ...}
    when it fails (the row is still timed)."""
    from kernel_pytorch._errors import short_error
    from kernel_pytorch.deploy.quant_accuracy import linear_weight_bytes, quantized_agreement
    from kernel_pytorch.deploy.quantize import quantized_linears

    t0 = time.perf_counter()
    try:
        g = torch.Generator(device="cpu").manual_seed(11)
        prompt = torch.randint(0, size.vocab, (2, size.prompt), generator=g).to(dev)
        stream = torch.randint(0, size.vocab, (2, size.stream), generator=g).to(dev)
        acc = quantized_agreement(reference, quantized, prompt, new_tokens=size.new_tokens, stream=stream,
                                  logits_fn=hf_logits)
        names = quantized_linears(quantized)
        q_bytes, ref_bytes = linear_weight_bytes(quantized, names), linear_weight_bytes(reference, names)
        return {**acc.to_dict(), "linear_bytes": q_bytes, "linear_bytes_reference": ref_bytes,
                "linear_bytes_ratio": q_bytes / ref_bytes if ref_bytes else None, "linear_layers": len(names),
                "expected_rtol": rtol, "err_over_rtol": acc.max_rel_err / rtol if rtol else None,
                "seconds": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001 (the accuracy is reported, the timing still runs)
        return {"error": f"{type(exc).__name__}: {short_error(exc, 300)}"}


def accuracy_text(a: dict[str, Any] | None, batch: int) -> str:
    """The row note's account of `measure_accuracy`'s result (measured once per provider)."""
    if not a:
        return ""
    if "error" in a:
        return f"accuracy not measured ({a['error']})"
    div = ", ".join("none" if p is None else str(p) for p in a["first_divergence"]) or "-"
    where = f" (measured with its B={a['measured_at_batch']} row)" if a["measured_at_batch"] != batch else ""
    return (f"accuracy{where} against ours unquantized (the same weights): greedy agreement {a['agreement']:.3f}, "
            f"teacher-forced on its tokens ({len(a['first_divergence'])} x {a['new_tokens']} generated), "
            f"free-running first divergence at {div}; on a seeded stream of {a['stream_tokens']} tokens "
            f"perplexity {a['ppl_change']:+.3%}, mean KL {a['kl']:.3g} nats/token, max rel logit err "
            f"{a['max_rel_err']:.3g} = {a['err_over_rtol']:.2f} x expected_rtol {a['expected_rtol']:.3g}; "
            f"linear weights {a['linear_bytes_ratio']:.3f}x unquantized ({a['linear_layers']} layers)")


def hf_decoder(provider: str, size: Size, batch: int, dev: torch.device, dtype: torch.dtype, backend: str,
               accuracy: dict[str, dict] | None = None) -> Decoder:
    """hf-eager, hf-compile, ours, ours+int8, ours+fp8: transformers' forward with a filled StaticCache.
    A quantized provider's accuracy is measured once (`accuracy` holds it by provider for its other
    batch: the same weights give the same numbers)."""
    model = hf_model(size, dev, dtype)
    if provider.startswith("ours"):
        model = optimized(model, size.vocab, min(size.cache, 128), dev)
    rtol = acc = None
    if "+" in provider:
        from kernel_pytorch.deploy.quantize import expected_rtol, quantize

        scheme, backend_kw = quant_scheme(provider)
        rtol = expected_rtol(model, scheme, **backend_kw)[0]  # from the float weights, before quantize()
        memo = accuracy if accuracy is not None else {}
        reference = copy.deepcopy(model) if provider not in memo else None  # ours, unquantized
        quantize(model, scheme, **backend_kw)
        if reference is not None:
            acc = {**measure_accuracy(reference, model, size, dev, rtol), "measured_at_batch": batch}
            del reference
            _free(dev)
            if "error" not in acc:
                memo[provider] = acc
        else:
            acc = memo[provider]
    cache = filled_hf_cache(model.config, size, batch, dev, dtype)
    if provider != "hf-eager":
        model.forward = compiled(model.forward, backend, dev)  # the instance's forward; hooks stay outside

    def forward(ids: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        out = model(input_ids=ids, position_ids=position_ids, cache_position=cache_position,
                    past_key_values=cache, use_cache=True)
        return out.logits

    return Decoder(forward, lambda pos: rewind_hf(cache, pos), weights_bytes(model), [model, cache], rtol, acc)


# ---- ours-nn: the same decoder from kernel_pytorch.nn --------------------------------------------------

class NNBlock(nn.Module):
    """Pre-norm Llama block of kernel_pytorch.nn modules, HF's parameter names."""

    def __init__(self, size: Size, config: Any) -> None:
        super().__init__()
        from kernel_pytorch import nn as knn

        eps = config.rms_norm_eps
        self.input_layernorm = knn.RMSNorm(size.hidden, eps, casting="llama")
        self.self_attn = knn.Attention(size.hidden, size.heads, size.kv_heads, rope=config)
        self.post_attention_layernorm = knn.RMSNorm(size.hidden, eps, casting="llama")
        self.mlp = knn.GatedMLP(size.hidden, size.intermediate, "silu")

    def forward(self, x: Tensor, position_ids: Tensor, cache: nn.Module, cache_position: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), position_ids, kv_cache=cache, cache_position=cache_position)
        return x + self.mlp(self.post_attention_layernorm(x))


class NNDecoder(nn.Module):
    """Embedding, NNBlocks with a StaticKVCache each, final RMSNorm, lm_head; an HF Llama's state dict loads.

    forward: input_ids (B, T), position_ids (B, T), cache_position (T,) -> logits (B, T, V).
    """

    def __init__(self, size: Size, config: Any, batch: int) -> None:
        super().__init__()
        from kernel_pytorch import nn as knn

        self.model = nn.Module()
        self.model.embed_tokens = knn.Embedding(size.vocab, size.hidden)
        self.model.layers = nn.ModuleList(NNBlock(size, config) for _ in range(size.layers))
        self.model.norm = knn.RMSNorm(size.hidden, config.rms_norm_eps, casting="llama")
        self.lm_head = nn.Linear(size.hidden, size.vocab, bias=False)
        self.caches = nn.ModuleList(knn.StaticKVCache(batch, size.cache, size.kv_heads, size.head_dim)
                                    for _ in range(size.layers))

    def forward(self, input_ids: Tensor, position_ids: Tensor, cache_position: Tensor) -> Tensor:
        x = self.model.embed_tokens(input_ids)
        for layer, cache in zip(self.model.layers, self.caches):
            x = layer(x, position_ids, cache, cache_position)
        return self.lm_head(self.model.norm(x))


def nn_decoder(size: Size, batch: int, dev: torch.device, dtype: torch.dtype, backend: str) -> Decoder:
    hf = hf_model(size, dev, dtype)
    with torch.device(dev):
        model = cast(NNDecoder(size, hf.config, batch), dtype).eval()
    model.load_state_dict(hf.state_dict())  # strict: every HF weight has its place
    del hf
    for i, cache in enumerate(model.caches):
        k, v = cache_values(i, batch, size, dev, dtype)
        cache.k.copy_(k)
        cache.v.copy_(v)
        # written in place every step: tag them as fixed addresses, as transformers does its cache's, so CUDA
        # graphs keep them as they are rather than falling back for a mutated input
        torch._dynamo.mark_static_address(cache.k)
        torch._dynamo.mark_static_address(cache.v)
    step = compiled(model, backend, dev)
    return Decoder(lambda ids, pos, cpos: step(ids, pos, cpos), lambda pos: None, weights_bytes(model), [model])


# ---- the reference: the same step in higher precision -----------------------------------------------

def reference_logits(size: Size, batch: int, dev: torch.device, dtype: torch.dtype, inputs: Inputs) -> Reference:
    """hf-eager's first timed step in `dtype`, then the same model upcast to `hi_dtype(dtype)` (exactly the
    same weights: bf16 -> fp32 is exact) with the same cache values upcast, the same step; one model
    resident at a time, everything freed after (peak on the H100 config: fp32 weights 3.6 GB + cache 2.1 GB)."""
    t0 = time.perf_counter()
    model = hf_model(size, dev, dtype)

    def step(model: nn.Module, cache: Any) -> Tensor:
        rewind_hf(cache, inputs.start)
        out = model(input_ids=inputs.ids[0], position_ids=inputs.position_ids[0],
                    cache_position=inputs.cache_position[0], past_key_values=cache, use_cache=True)
        return out.logits.detach().clone()

    with torch.no_grad():
        eager = step(model, filled_hf_cache(model.config, size, batch, dev, dtype))
        _free(dev)  # the low-precision cache
        hi = hi_dtype(dtype)
        cast(model, hi)
        with exact_fp32():
            ref = step(model, filled_hf_cache(model.config, size, batch, dev, dtype, store=hi))
    del model
    _free(dev)
    return Reference(ref, eager, time.perf_counter() - t0)


# ---- one provider: check, warm up, time -----------------------------------------------------------------

@dataclass
class Job:
    provider: str
    batch: int
    build: Callable[[], Decoder]
    compiled: bool
    scheme: str | None = None  # quantized rows: the scheme (their tolerance comes from Decoder.rtol)

    def row(self, size: Size, dtype: torch.dtype, backend: str, **kw: Any) -> Row:
        how = "eager" if not self.compiled or backend == "none" else (
            "compiled, reduce-overhead (CUDA graphs)" if backend == "inductor" else f"compiled, backend {backend}")
        return Row(op=f"decode B={self.batch} cache={size.cache}", shape=[self.batch, size.cache], config=size.label,
                   dtype=str(dtype).removeprefix("torch."), provider=self.provider, pass_name=f"decode step ({how})",
                   **kw)


@dataclass
class Inputs:
    """Per-step inputs of one timed run at one batch, on the device (no host copies while timing)."""

    start: int
    ids: list[Tensor]
    position_ids: list[Tensor]
    cache_position: list[Tensor]

    @classmethod
    def make(cls, size: Size, batch: int, dev: torch.device) -> Inputs:
        start = size.cache - size.steps
        g = torch.Generator(device="cpu").manual_seed(7)
        ids = torch.randint(0, size.vocab, (size.steps, max(batch, size.batch), 1), generator=g)[:, :batch]
        pos = [torch.full((batch, 1), start + j, dtype=torch.long, device=dev) for j in range(size.steps)]
        cpos = [torch.tensor([start + j], dtype=torch.long, device=dev) for j in range(size.steps)]
        return cls(start, [i.contiguous().to(dev) for i in ids], pos, cpos)


def measure(job: Job, size: Size, dev: torch.device, dtype: torch.dtype, backend: str, inputs: Inputs,
            reference: Reference | None, summary: dict) -> tuple[Row, Tensor]:
    """Build the provider, check one step's logits, warm up, time; the row and the checked logits."""
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    dec = job.build()
    frames0, skips0 = compiled_frames(), cudagraph_skips()  # after the build: optimize() may reset Dynamo
    graphs = job.compiled and backend == "inductor" and cuda

    def step(j: int) -> Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return dec.forward(inputs.ids[j], inputs.position_ids[j], inputs.cache_position[j])

    dec.rewind(inputs.start)
    logits = step(0).detach().clone()  # the first call compiles; its output is checked
    ok, check, info = check_logits(logits, reference, dec.rtol)
    summary["check"] = info
    if dec.accuracy is not None:
        summary["accuracy"] = dec.accuracy
    # warm-up: CUDA-graph trees record on the second call of a shape; a few runs reach the steady state
    for _ in range(2 if job.compiled and backend != "none" else 0):
        dec.rewind(inputs.start)
        for j in range(size.steps):
            step(j)
    if cuda:
        torch.cuda.synchronize(dev)
    warm_s = time.perf_counter() - t0
    frames1 = compiled_frames()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    timing = time_steps(step, steps=size.steps, reps=size.reps, warmup=1, reset=lambda: dec.rewind(inputs.start),
                        device=dev)
    # Inductor decides to fall back from CUDA graphs when it compiles, so these count from the build on
    recompiles, skips = compiled_frames() - frames1, cudagraph_skips() - skips0
    row = job.row(size, dtype, backend)
    row.set_timing(timing)
    if cuda:
        row.peak_mem_bytes = torch.cuda.max_memory_allocated(dev)
        row.peak_mem_method = "cuda allocator peak over the timed runs (weights, cache, graph pools)"
    tok_s = job.batch / (timing.median_ms / 1e3)
    compiles = f"{frames1 - frames0} frames compiled in warm-up, {recompiles} during the timed steps" + (
        f", CUDA graphs skipped {skips} times (see the log)" if skips else "")
    acc = accuracy_text(dec.accuracy, job.batch)
    row.note = (f"{tok_s:,.0f} tok/s; {check}; {acc + '; ' if acc else ''}{compiles}; weights "
                f"{dec.weights_bytes / 2**20:.1f} MiB; build + check + warm-up {warm_s:.1f} s")
    summary.update(tokens_per_s=tok_s, ms_per_step=timing.median_ms, q20_ms=timing.q20_ms, q80_ms=timing.q80_ms,
                   peak_mib=row.peak_mem_bytes / 2**20 if row.peak_mem_bytes else None,
                   weights_mib=dec.weights_bytes / 2**20, frames_compiled_warmup=frames1 - frames0,
                   recompiles=recompiles, cudagraph_fallbacks=skips, warmup_s=warm_s)
    if not ok:
        row.status = "failed: correctness"
    return row, logits


def _reference(size: Size, dev: torch.device, dtype: torch.dtype, inputs: Inputs,
               results: BenchmarkResults) -> tuple[Reference | None, bool]:
    """The reference logits, with a note saying what they are; (None, True) and the reason when they
    could not be made (the rows then say "not checked" and the run fails)."""
    try:
        ref = reference_logits(size, size.batch, dev, dtype, inputs)
    except Exception as exc:  # noqa: BLE001 (the providers still run, unchecked)
        _free(dev)
        results.notes.append(f"logits not checked: the reference failed ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300] if str(exc) else ''})")
        return None, True
    from kernel_pytorch.tolerances import BUDGET_FACTOR

    results.notes.append(
        f"logits check: one step against the same model and cache in {ref.label} (built in {ref.seconds:.1f} s; "
        f"hf-eager's max abs err against it {_max_abs(ref.eager, ref.hi):.3g}); a provider passes within "
        f"{BUDGET_FACTOR:g} x hf-eager's err + floor (tolerances.fp64_budget), a quantized one within that + "
        f"{BUDGET_FACTOR:g} x the error its weights' rounding adds (deploy.quantize.expected_rtol x max|reference|)")
    return ref, False


def _failed(job: Job, size: Size, dtype: torch.dtype, backend: str, exc: BaseException) -> Row:
    status, note = failure_status(exc)
    return job.row(size, dtype, backend, status=status, note=note)


# ---- the run --------------------------------------------------------------------------------------------

def torchao_missing() -> str | None:
    try:
        import torchao  # noqa: F401
    except Exception as exc:  # noqa: BLE001 (a broken install is as missing as an absent one)
        return "torchao not installed" if isinstance(exc, ImportError) else f"torchao does not import: {exc}"
    return None


def jobs(size: Size, dev: torch.device, dtype: torch.dtype, backend: str, providers: tuple[str, ...]) -> list[Job]:
    """Every row, in the order the targets compare them first; names not known become error rows."""
    b, out = size.batch, []
    accuracy: dict[str, dict] = {}  # a quantized provider's accuracy, measured by its first row that runs
    for p in providers:
        if p == "ours-nn":
            out.append(Job(p, b, lambda: nn_decoder(size, b, dev, dtype, backend), True))
        elif p in ("hf-eager", "hf-compile", "ours"):
            out.append(Job(p, b, lambda p=p: hf_decoder(p, size, b, dev, dtype, backend), p != "hf-eager"))
        elif p in QUANTIZED:
            out.append(Job(p, b, lambda p=p: hf_decoder(p, size, b, dev, dtype, backend, accuracy), True,
                           quant_scheme(p)[0]))
        else:
            out.append(Job(p, b, lambda p=p: (_ for _ in ()).throw(ValueError(f"unknown provider {p!r}")), False))
    for p in ("ours", *QUANTIZED):  # batch 1: weight-bound, where weight-only quantization pays
        if p in providers:
            scheme = quant_scheme(p)[0] if "+" in p else None
            out.append(Job(p, 1, lambda p=p: hf_decoder(p, size, 1, dev, dtype, backend, accuracy), True, scheme))
    return out


# torchao's weight-only int8 and fp8, then kernel_pytorch's own kernels (deploy.quantize backend="kernel_pytorch")
QUANTIZED = ("ours+int8", "ours+fp8", "ours+int8-kp", "ours+int4-kp", "ours+fp8-kp")
PROVIDERS = ("hf-eager", "hf-compile", "ours", "ours-nn", *QUANTIZED)


def write(results: BenchmarkResults, summary: list[dict], vers: dict[str, str], out: Path) -> tuple[Path, Path]:
    """decode.json (the results schema plus "versions" and a "decode" summary) and decode.md."""
    out.mkdir(parents=True, exist_ok=True)
    d = results.to_dict()
    d["versions"] = vers
    d["decode"] = summary
    js = out / f"{results.name}.json"
    js.write_text(json.dumps(d, indent=2) + "\n")
    md = out / f"{results.name}.md"
    md.write_text(results.to_markdown(baseline=BASELINE) + "\n" + summary_markdown(summary) + "\n")
    return js, md


TARGET = ("ours", "ours-nn")  # what the benchmark asks about: these against BASELINE, same run


def _find(summary: list[dict], provider: str, batch: int) -> dict | None:
    """The summary entry of `provider` at `batch` that was timed, or None."""
    return next((s for s in summary if s["provider"] == provider and s["batch"] == batch
                 and s.get("tokens_per_s")), None)


def _verdict(s: dict) -> str:
    """'ok 0.031 <= 0.14', 'FAILED 0.3 > 0.2', or the status of a row that did not get that far."""
    c = s.get("check") or {}
    if not isinstance(c.get("allowed"), float):  # not checked (or a file from before the reference)
        return s["status"] if s["status"] != "ok" else "not checked"
    ok = c["passed"]
    return f"{'ok' if ok else 'FAILED'} {c['max_abs_err']:.3g} {'<=' if ok else '>'} {c['allowed']:.3g}"


def headline(summary: list[dict]) -> list[str]:
    """One line per batch: the target providers' tokens/s against hf-compile's, the recompiles during the
    timed steps and the logits check (error against the reference, and its budget)."""
    lines = []
    for batch in sorted({s["batch"] for s in summary}, reverse=True):
        entries = [s for s in summary if s["batch"] == batch]
        base = _find(summary, BASELINE, batch)
        speed = []
        for p in TARGET:
            s = next((e for e in entries if e["provider"] == p), None)
            if s is None:
                continue
            mine = _find(summary, p, batch)
            if mine is None:
                speed.append(f"{p} {s['status']}")
            else:
                vs = f" = {mine['tokens_per_s'] / base['tokens_per_s']:.2f}x {BASELINE}" if base else ""
                speed.append(f"{p} {mine['tokens_per_s']:,.0f} tok/s{vs}")
        if not speed:
            continue
        base_txt = f"{BASELINE} {base['tokens_per_s']:,.0f} tok/s" if base else f"{BASELINE} not timed"
        timed = [s for s in entries if s.get("tokens_per_s")]
        recompiles = ", ".join(f"{s['provider']} {s['recompiles']}" for s in timed) or "-"
        ref = next((s["check"]["reference"] for s in entries if (s.get("check") or {}).get("reference")), None)
        checks = ", ".join(f"{s['provider']} {_verdict(s)}" for s in entries if s["provider"] != "hf-eager")
        lines.append(f"- batch {batch}: {'; '.join(speed)} ({base_txt}); recompiles during the timed steps: "
                     f"{recompiles}; logits vs {ref or 'the'} reference (max abs err, budget): {checks or '-'}")
    return lines


def summary_markdown(summary: list[dict]) -> str:
    """The headline (ours and ours-nn against hf-compile), then tokens/s per provider and batch, against
    hf-compile and unquantized ours at the same batch (tokens/s, and peak memory in brackets), with the
    recompiles and the logits check against the reference."""
    lines = ["## Decode summary", "", *headline(summary), "",
             "| batch | provider | tok/s | vs hf-compile | ms/step | recompiles | logits err vs ref | budget | check | "
             "peak MiB | weights MiB | vs ours (unquantized) | status |", "|" + " --- |" * 13]
    for s in summary:
        tok = s.get("tokens_per_s")
        base, bf16 = _find(summary, BASELINE, s["batch"]), _find(summary, "ours", s["batch"])

        def ratio(r: dict | None, key: str, s: dict = s) -> str:
            return f"{s[key] / r[key]:.2f}x" if r and s.get(key) and r.get(key) else "-"

        c = s.get("check") or {}
        cells = [str(s["batch"]), s["provider"], f"{tok:,.0f}" if tok else "-", ratio(base, "tokens_per_s"),
                 f"{s['ms_per_step']:.3f}" if s.get("ms_per_step") else "-", str(s.get("recompiles", "-")),
                 f"{c['max_abs_err']:.3g}" if "max_abs_err" in c else "-",
                 f"{c['allowed']:.3g}" if isinstance(c.get("allowed"), float) else "-",
                 ("ok" if c["passed"] else "FAILED") if "passed" in c else "-",
                 f"{s['peak_mib']:.0f}" if s.get("peak_mib") else "-",
                 f"{s['weights_mib']:.4g}" if s.get("weights_mib") else "-",
                 ratio(bf16, "tokens_per_s") + (f" (memory {ratio(bf16, 'peak_mib')})" if s.get("peak_mib") else ""),
                 s["status"]]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines + accuracy_markdown(summary))


def accuracy_markdown(summary: list[dict]) -> list[str]:
    """The quantized rows' accuracy against ours unquantized (measure_accuracy), one line per provider."""
    rows = {s["provider"]: s["accuracy"] for s in summary if s.get("accuracy") and "error" not in s["accuracy"]}
    if not rows:
        return []
    a = next(iter(rows.values()))
    out = ["", "## Quantized accuracy", "",
           f"Against ours unquantized, the same weights, in the run's dtype. Greedy agreement: the fraction of "
           f"{len(a['first_divergence'])} x {a['new_tokens']} generated positions where the argmax tokens are equal, "
           f"both models teacher-forced on the unquantized model's greedy continuation of a seeded prompt (so one "
           f"early difference does not cascade); first divergence: the first generated position where the "
           f"quantized model's own greedy continuation differs (per sequence). Perplexity change and mean "
           f"KL(unquantized || quantized) on a seeded random stream of {a['stream_tokens']} predicted tokens "
           f"(random weights: absolute perplexity is near the vocabulary size, the KL is the number to read). "
           f"Max rel err: max|q - ref| / max|ref| of the stream's logits, against deploy.quantize.expected_rtol.",
           "", "| provider | greedy agreement | first divergence | ppl change | mean KL (nats) | max rel err | "
           "expected_rtol | err / rtol | linear weights vs unquantized |", "|" + " --- |" * 9]
    for provider, a in rows.items():
        div = ", ".join("none" if p is None else str(p) for p in a["first_divergence"]) or "-"
        out.append(f"| {provider} | {a['agreement']:.3f} | {div} | {a['ppl_change']:+.3%} | {a['kl']:.3g} | "
                   f"{a['max_rel_err']:.3g} | {a['expected_rtol']:.3g} | {a['err_over_rtol']:.2f} | "
                   f"{a['linear_bytes_ratio']:.3f}x |")
    return out


def run(size: Size, dev: torch.device, dtype: torch.dtype, backend: str, providers: tuple[str, ...],
        budget_s: float, out: Path, smoke: bool) -> tuple[BenchmarkResults, int]:
    """Every job in its own try/except within the budget, written after each; (results, exit code)."""
    start = time.perf_counter()
    results = BenchmarkResults(name="decode", device=device_name(dev), smoke=smoke)
    vers = versions()
    results.notes.append("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    results.notes.append(
        f"batch {size.batch} (and 1), static cache of {size.cache} slots filled with the same seeded random keys "
        f"and values for every provider; {size.reps} timed runs of {size.steps} consecutive one-token steps at "
        f"the cache's last slots; tokens/s = batch / median step time")
    results.notes.append("compile: " + {"inductor": "torch.compile(mode='reduce-overhead'): CUDA graphs" if dev.type
                                        == "cuda" else "torch.compile (inductor, no CUDA graphs on CPU)",
                                        "none": "none (--backend none): every provider runs eager"}.get(
                                            backend, f"torch.compile(backend={backend!r})"))
    if smoke:
        results.notes.append("quick run: tiny config, few steps; checks the pipeline, says nothing about speed")
    missing_ao = torchao_missing()
    summary: list[dict] = []
    reference: Reference | None = None
    tried_reference = False
    slowest = {True: 0.0, False: 0.0}  # the longest job so far, compiled or not
    failed = False
    per_batch = {b: Inputs.make(size, b, dev) for b in sorted({size.batch, 1})}
    try:
        for job in jobs(size, dev, dtype, backend, providers):
            entry: dict[str, Any] = {"provider": job.provider, "batch": job.batch, "cache": size.cache}
            elapsed = time.perf_counter() - start
            if job.scheme is not None and missing_ao and not quant_scheme(job.provider)[1]:  # torchao's rows
                row = job.row(size, dtype, backend, status="not installed", note=missing_ao)
            elif elapsed + slowest[job.compiled] > budget_s:
                kind = "compiled" if job.compiled else "eager"
                row = job.row(size, dtype, backend, status="skipped",
                              note=f"the {budget_s:.0f} s budget could not hold it ({elapsed:.0f} s spent, the "
                                   f"slowest {kind} provider took {slowest[job.compiled]:.0f} s)")
            else:
                if not tried_reference:  # once, before the first provider that runs; its time counts
                    tried_reference = True
                    reference, failed_ref = _reference(size, dev, dtype, per_batch[size.batch], results)
                    failed |= failed_ref
                t0 = time.perf_counter()
                try:
                    ref = reference.first(job.batch) if reference is not None else None
                    with torch.no_grad():
                        row, _ = measure(job, size, dev, dtype, backend, per_batch[job.batch], ref, entry)
                except Exception as exc:  # noqa: BLE001 (one provider's failure must not lose the others)
                    row = _failed(job, size, dtype, backend, exc)
                slowest[job.compiled] = max(slowest[job.compiled], time.perf_counter() - t0)
                _free(dev)
            failed |= not (row.ok or row.status in ("not installed", "skipped"))
            entry.update(status=row.status, note=row.note)
            summary.append(entry)
            results.add(row)
            print(f"{row.op:>22} {row.provider:>10}: {row.status} {row.median_ms or 0:.4g} ms/step  {row.note}",
                  flush=True)
            write(results, summary, vers, out)
    except KeyboardInterrupt:
        # stopped by Ctrl-C or a time limit (SIGINT): what finished is written, said so
        results.notes.append(f"{PARTIAL_NOTE} after {len(results.rows)} rows; the rows missing were not measured")
        failed = True
    results.notes.append(f"wall time {time.perf_counter() - start:.0f} s of a {budget_s:.0f} s budget")
    skipped = [f"{r.provider} B={r.shape[0]}" for r in results.rows if r.status == "skipped"]
    if skipped:
        results.notes.append(f"skipped for the time budget: {', '.join(skipped)}")
    write(results, summary, vers, out)
    return results, 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny config, few steps, no compile: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/decode-<time>)")
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop starting providers after this (s)")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated providers")
    parser.add_argument("--backend", default=None, help="inductor (reduce-overhead on CUDA), eager, aot_eager or "
                        "none (no compile); default inductor, none with --quick")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                        help="default bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--steps", type=int, default=None, help="consecutive steps per timed run")
    parser.add_argument("--reps", type=int, default=None, help="timed runs")
    args = parser.parse_args(argv)
    dev = resolve_device(args.device)
    size = QUICK if args.quick else Size()
    if args.steps or args.reps:
        size = Size(**{**size.__dict__, "steps": args.steps or size.steps, "reps": args.reps or size.reps})
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if dev.type == "cuda" else torch.float32
    backend = args.backend or ("none" if args.quick else "inductor")
    out = Path(args.out) if args.out else Path("bench-results") / f"decode-{time.strftime('%Y%m%d-%H%M%S')}"
    providers = tuple(p for p in args.providers.split(",") if p)
    results, code = run(size, dev, dtype, backend, providers, args.budget_s, out, smoke=args.quick)
    print(f"wrote {out / 'decode.json'} and {out / 'decode.md'}")
    return 130 if results.partial else code


if __name__ == "__main__":
    sys.exit(main())
