"""Graph rewrites against compile alone: for models holding hand-written patterns (KernelBench-style
problems written here: a norm, gated and bias activations, RoPE attention, attention written out, an LM head and its
loss; and
the built-in plain-torch models), the forward+backward time and peak memory of
eager, `torch.compile`, `optimize(rewrite=True)` then `torch.compile`, the Inductor pre-grad rewrite pass
(`rewrite.compiled.inductor_options()`), and `optimize(rewrite=True)` eager; with the rewrites kept.

    python benchmarks/probes/probe_rewrite.py                      # on CUDA, bf16, the full sizes
    python benchmarks/probes/probe_rewrite.py --tiny --device cpu  # a smoke run of the script itself
    python benchmarks/probes/probe_rewrite.py --models hand_rms_norm swiglu --out results.md
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.benchmark.module import make_pass
from kernel_pytorch.benchmark.timer import time_fn
from kernel_pytorch.models import build_model
from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rewrite.compiled import inductor_options


class HandRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm written out, between two projections (the norm is a fraction of the step)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d: int, i: int) -> None:
        super().__init__()
        self.gate, self.up, self.down = (nn.Linear(d, i, bias=False), nn.Linear(d, i, bias=False),
                                         nn.Linear(i, d, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GemmBiasGelu(nn.Module):
    """KernelBench level-2 style: GEMM, a bias added apart, GELU."""

    def __init__(self, d: int, i: int) -> None:
        super().__init__()
        self.gemm, self.bias = nn.Linear(d, i, bias=False), nn.Parameter(torch.zeros(i))

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.gemm(x) + self.bias)


class NormMLPBlock(nn.Module):
    """A pre-norm SwiGLU block written in one forward: norm, gated MLP, residual."""

    def __init__(self, d: int, i: int) -> None:
        super().__init__()
        self.norm, self.mlp = HandRMSNorm(d), SwiGLU(d, i)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(self.norm(x))


def rotate_half(x: Tensor) -> Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RopeAttention(nn.Module):
    """Attention with transformers' apply_rotary_pos_emb written inline (cos/sin from the positions)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.register_buffer("inv_freq", 1.0 / 500000 ** (torch.arange(0, self.hd, 2).float() / self.hd), False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4).unbind(0)
        freqs = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, t, d))


class HandAttention(nn.Module):
    """Causal attention written out (nanoGPT's form): the scores scaled, a -inf fill of a lower-triangular
    boolean buffer, softmax, dropout(0), then the values."""

    def __init__(self, d: int, heads: int, t: int) -> None:
        super().__init__()
        self.heads, self.hd, self.scale = heads, d // heads, (d // heads) ** -0.5
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.drop = nn.Dropout(0.0)
        self.register_buffer("causal", torch.ones(t, t, dtype=torch.bool).tril(), False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.causal[:t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class HandAttentionAdditive(HandAttention):
    """The same attention with an additive causal mask: a buffer 0 on and below the diagonal, -inf above,
    added to the scores (the model's dtype once `.to` casts it)."""

    def __init__(self, d: int, heads: int, t: int) -> None:
        super().__init__(d, heads, t)
        self.register_buffer("causal_add", torch.full((t, t), float("-inf")).triu(1), False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)) * self.scale + self.causal_add[:t, :t]
        att = self.drop(F.softmax(att, dim=-1))
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


class LMHeadLoss(nn.Module):
    """An LM head and its loss written out, as Hugging Face's causal-LM loss does (fp32 upcast, views)."""

    def __init__(self, d: int, vocab: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, d) * d ** -0.5)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:
        logits = F.linear(h, self.weight).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100)


def _problems(tiny: bool, device: str, dtype: torch.dtype) -> dict[str, Callable[[], tuple[nn.Module, tuple]]]:
    b, t, d, i = (2, 16, 64, 128) if tiny else (8, 2048, 4096, 14336)
    heads, vocab = (4, 256) if tiny else (32, 128256)

    def x() -> Tensor:
        return torch.randn(b, t, d, device=device, dtype=dtype)

    def make(cls: type[nn.Module], *args: int) -> Callable[[], tuple[nn.Module, tuple]]:
        def build() -> tuple[nn.Module, tuple]:
            torch.manual_seed(0)
            return cls(*args).to(device=device, dtype=dtype), (x(),)
        return build

    def lm_head_loss() -> tuple[nn.Module, tuple]:
        torch.manual_seed(0)
        labels = torch.randint(0, vocab, (b, t), device=device)
        labels[:, : t // 8] = -100  # a prompt's tokens, ignored
        return LMHeadLoss(d, vocab).to(device=device, dtype=dtype), (x(), labels)

    def builtin(name: str) -> Callable[[], tuple[nn.Module, tuple]]:
        return lambda: build_model(name if not tiny else "llama-tiny", device=device, dtype=dtype)

    return {
        "hand_rms_norm": make(HandRMSNorm, d),
        "swiglu": make(SwiGLU, d, i),
        "gemm_bias_gelu": make(GemmBiasGelu, d, i),
        "norm_mlp_block": make(NormMLPBlock, d, i),
        "rope_attention": make(RopeAttention, d, heads),
        "hand_attention": make(HandAttention, d, heads, t),
        "hand_attention_additive": make(HandAttentionAdditive, d, heads, t),
        "lm_head_loss": lm_head_loss,
        "llama-8l-2048": builtin("llama-8l-2048"),
    }


def _variants() -> dict[str, Callable[[nn.Module, tuple], tuple[Callable[..., object], int]]]:
    def eager(m: nn.Module, inputs: tuple) -> tuple[Callable[..., object], int]:
        return m, 0

    def compiled(m: nn.Module, inputs: tuple) -> tuple[Callable[..., object], int]:
        return torch.compile(m), 0

    def rewrite_then_compile(m: nn.Module, inputs: tuple) -> tuple[Callable[..., object], int]:
        m, report = optimize(m, inputs, components=False, compile=False, rewrite=True)
        return torch.compile(m), sum(r.status == "applied" for r in report.rewrites)

    def inductor_pass(m: nn.Module, inputs: tuple) -> tuple[Callable[..., object], int]:
        return torch.compile(m, options=inductor_options()), -1  # counted by the pass, not reported here

    def rewrite_eager(m: nn.Module, inputs: tuple) -> tuple[Callable[..., object], int]:
        m, report = optimize(m, inputs, components=False, compile=False, rewrite=True)
        return m, sum(r.status == "applied" for r in report.rewrites)

    return {"eager": eager, "compile": compiled, "rewrite+compile": rewrite_then_compile,
            "inductor pass": inductor_pass, "rewrite eager": rewrite_eager}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--tiny", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--models", nargs="*", help="a subset of the problems")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    problems = _problems(args.tiny, args.device, dtype)
    names = args.models or list(problems)
    rows = ["| model | variant | fwd+bwd ms (q20-q80) | vs compile | peak MiB | rewrites kept |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name in names:
        base = None
        for variant, prepare in _variants().items():
            torch._dynamo.reset()
            model, inputs = problems[name]()
            start = time.perf_counter()
            fn, kept = prepare(model, inputs)
            step = make_pass(fn, inputs, "fwd+bwd")
            step()  # compiles
            setup = time.perf_counter() - start
            timing = time_fn(step, device=args.device)
            memory = peak_memory(step, device=args.device)
            base = timing.median_ms if variant == "compile" else base
            ratio = f"{base / timing.median_ms:.3f}x" if base else ""
            peak = f"{memory.peak_mib:.0f}" if memory.peak_mib is not None else "n/a"
            rows.append(f"| {name} | {variant} | {timing.median_ms:.3f} ({timing.q20_ms:.3f}-{timing.q80_ms:.3f}) "
                        f"| {ratio} | {peak} | {kept if kept >= 0 else 'pass'} |")
            print(rows[-1], f"(setup {setup:.1f} s)", flush=True)
            del fn, step, model
    header = f"device {args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}), {args.dtype}"
    text = "\n".join([header, "", *rows])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
