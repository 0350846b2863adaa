"""The random HF LlamaForCausalLM the inference benchmarks (bench_decode.py, bench_prefill.py) measure, its
StaticCache, optimize() as they apply it, and the logits check against a higher-precision run of the
same model (`check_logits`: the budget of long reductions, `tolerances.fp64_budget`)."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class LlamaSize:
    """The decoder's widths: the e2e benchmark's Llama (hidden 2048, intermediate 5632, 8 layers, 16/8 heads,
    vocab 128256); each benchmark adds its batch, lengths and timing."""

    hidden: int = 2048
    intermediate: int = 5632
    layers: int = 8
    heads: int = 16
    kv_heads: int = 8
    vocab: int = 128256

    @property
    def label(self) -> str:
        return (f"HF Llama h{self.hidden} i{self.intermediate} L{self.layers} H{self.heads}/{self.kv_heads} "
                f"V{self.vocab}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def max_positions(self) -> int:
        """The positions the model's RoPE table covers (a benchmark names its own: the cache's length)."""
        return 4096

    def hf_config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, max_position_embeddings=self.max_positions,
                           attn_implementation="sdpa")


def cast(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """model.to(dtype), except RoPE's inverse frequencies, which stay fp32 (as from_pretrained leaves them:
    rounded to bf16, positions in the thousands would rotate by visibly wrong angles)."""
    keep = {name: buf.clone() for name, buf in model.named_buffers() if name.endswith("inv_freq")}
    model.to(dtype)
    for name, buf in keep.items():
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, buf)
    return model


def hf_model(size: LlamaSize, dev: torch.device, dtype: torch.dtype) -> nn.Module:
    """A random LlamaForCausalLM, the same weights on every call (seeded)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(size.hf_config())
    return cast(model, dtype).eval()


def static_cache(config: Any, max_len: int, batch: int, dev: torch.device, dtype: torch.dtype) -> Any:
    """transformers' StaticCache; the constructor took the batch, device and dtype in early versions and
    allocates lazily (on the first update) in later ones."""
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    if "max_batch_size" in params:
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len, device=dev, dtype=dtype)
    return StaticCache(config=config, max_cache_len=max_len)


def cache_tensors(cache: Any, layer: int, like_k: Tensor, like_v: Tensor) -> tuple[Tensor, Tensor]:
    """The keys and values tensors (B, Hkv, max_len, Dh) of one layer of a StaticCache, allocated now if the
    release allocates lazily (`like_k`, `like_v`: (B, Hkv, 1, Dh) in the cache's dtype and device), so they
    are static addresses made outside any compiled region."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # key_cache / value_cache lists (older releases)
        return cache.key_cache[layer], cache.value_cache[layer]
    entry = layers[layer]
    if not getattr(entry, "is_initialized", True) or getattr(entry, "keys", None) is None:
        entry.lazy_initialization(like_k, like_v)
    return entry.keys, entry.values


def allocated_cache(size: LlamaSize, config: Any, max_len: int, batch: int, dev: torch.device,
                    dtype: torch.dtype) -> Any:
    """A StaticCache of `max_len` slots with every layer's tensors allocated (zeros)."""
    cache = static_cache(config, max_len, batch, dev, dtype)
    like = torch.zeros(batch, size.kv_heads, 1, size.head_dim, device=dev, dtype=dtype)
    for i in range(size.layers):
        cache_tensors(cache, i, like, like)
    return cache


def cache_kwarg(model: nn.Module) -> str:
    """The forward's name for the cache: `cache` in the releases that renamed it, else `past_key_values`."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def rewind_hf(cache: Any, pos: int) -> None:
    """Where the next update writes: transformers >= 5 static layers write at their own running length
    (a device tensor) rather than at cache_position; older ones at cache_position only."""
    for layer in getattr(cache, "layers", []):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, Tensor):
            length.fill_(pos)


def optimized(model: nn.Module, vocab: int, tokens: int, dev: torch.device) -> nn.Module:
    """kernel_pytorch.optimize() without its compile steps (the benchmark compiles), validated on the
    outputs of a prompt of `tokens` ids (no gradients: nothing here trains, and the backward kernels'
    first builds would cost device time)."""
    from kernel_pytorch.optimize import optimize
    from kernel_pytorch.validation import ValidationOptions

    ids = torch.randint(0, vocab, (1, tokens), device=dev)
    model, report = optimize(model, {"input_ids": ids}, compile=False, seeds=(0,),
                             validate_options=ValidationOptions.correctness_only().replace(check_gradients=False))
    if not report.passed:
        raise RuntimeError(f"optimize() did not validate: {report.summary(validation=False)}")
    return model


def versions() -> dict[str, str]:
    """Installed versions of torch, triton, transformers and torchao ("not installed" where absent)."""
    out = {}
    for name in ("torch", "triton", "transformers", "torchao"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["torch"] = torch.__version__
    return out


def free(dev: torch.device) -> None:
    """Forget compiled code and give the CUDA allocator's cached blocks back between providers."""
    torch._dynamo.reset()
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


# ---- the logits check ----------------------------------------------------------------------------------

@dataclass
class Reference:
    """Logits (B, 1, V) of one forward of the same model and inputs: `hi` in higher precision, `eager`
    hf-eager's in the benchmark's dtype; the budget's two ends."""

    hi: Tensor
    eager: Tensor
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return str(self.hi.dtype).removeprefix("torch.").replace("float", "fp")

    def first(self, batch: int) -> Reference:
        """The first `batch` rows (the rows are independent)."""
        return Reference(self.hi[:batch], self.eager[:batch], self.seconds)


def hi_dtype(dtype: torch.dtype) -> torch.dtype:
    """The reference's dtype: fp32 for bf16/fp16 runs, fp64 for fp32 ones."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """fp32 matmuls in full fp32 (no TF32) inside; the process's setting restored after."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def max_abs(a: Tensor, b: Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def check_logits(logits: Tensor, ref: Reference | None, rtol: float | None = None) -> tuple[bool, str, dict]:
    """Logits (B, 1, V) against the higher-precision reference: within the budget of 2 x hf-eager's error
    + floor (`tolerances.fp64_budget`); a quantized model (`rtol`: its `deploy.quantize.expected_rtol`)
    within that plus 2 x rtol x max|reference|, the error its weights' rounding adds (validate_quantized's
    rule). Returns (passed, a sentence for the row's note, the numbers)."""
    from kernel_pytorch.tolerances import BUDGET_FACTOR, fp64_budget

    if ref is None:
        return True, "logits not checked (no reference)", {}
    eager_err, vs_eager = max_abs(ref.eager, ref.hi), max_abs(logits, ref.eager)
    top = float(ref.hi.abs().max())
    if rtol is not None:
        err = max_abs(logits, ref.hi)
        floor = float(torch.finfo(logits.dtype).eps) * top
        allowed = BUDGET_FACTOR * eager_err + floor + BUDGET_FACTOR * rtol * top
        ok = bool(torch.isfinite(logits).all()) and err <= allowed
        how = (f"{BUDGET_FACTOR:g} x hf-eager's err {eager_err:.3g} + floor + {BUDGET_FACTOR:g} x expected_rtol "
               f"{rtol:.3g} x max|ref| {top:.3g}")
    else:
        c = fp64_budget(logits, ref.eager, ref.hi)
        ok, err, how = c.passed, c.max_abs_err, c.allowed
        # the same number fp64_budget compares with (its text above says how it is made)
        allowed = BUDGET_FACTOR * eager_err + float(torch.finfo(logits.dtype).eps) * top
    text = (f"logits vs {ref.label} reference {'ok' if ok else 'FAILED'}: max abs err {err:.3g}, budget "
            f"{allowed:.3g} ({how}); vs hf-eager {vs_eager:.3g}")
    info = {"passed": ok, "max_abs_err": err, "allowed": allowed, "method": how, "reference": ref.label,
            "eager_err": eager_err, "vs_eager": vs_eager}
    return ok, text, info


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(row status, note) of a provider that raised: "out of memory" or "error", the exception's first line."""
    oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
    first = str(exc).splitlines()[0][:300] if str(exc) else ""
    return "out of memory" if oom else "error", f"{type(exc).__name__}: {first}" if first else type(exc).__name__
