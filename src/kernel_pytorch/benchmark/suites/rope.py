"""The rotary-embedding suite: RoPE on q and k together (rotate-half and interleaved), and the token
embedding with its deterministic backward, against the usual peers.

Providers (see suites/providers.py; the runner is suites/runner.py):
    ours     kernel_pytorch.functional.apply_rotary / embedding; backend="triton" on CUDA (on CPU the
             registered ops' CPU kernels, which are the reference).
    eager    the code as Hugging Face transformers writes it: Llama's apply_rotary_pos_emb with
             rotate_half; Cohere's interleaved apply_rotary_pos_emb (fp32 math); nn.Embedding's
             F.embedding (atomics in its CUDA backward).
    compile  torch.compile(fullgraph=True, dynamic=False) of that eager code.
    liger    Liger-Kernel's liger_rotary_pos_emb(q, k, cos, sin) for rotate-half (it has no interleaved
             RoPE and no embedding). It rotates q and k in place when they are (B, T, H, D) memory seen
             as (B, H, T, D), as here; the gate judges it against the inputs as drawn.

Inputs as a Llama attention layer makes them: q (B, Hq, T, D) and k (B, Hk, T, D) are views of
(B, T, H, D) projections (`.view(...).transpose(1, 2)`); cos/sin are transformers' rows in the model
dtype: (1, T, D) for a training step, (B, 1, D) for decoding (one new token per sequence, at its own
position) -- the batch of cos/sin is B where tokens == 1, else 1.

Bytes are the minimum each pass must move (E = B * T * (Hq + Hk) * D elements of q and k, C the
elements of cos and sin each, s = element size):
    rope       fwd: read q, k, cos, sin; write q_embed, k_embed       (2E + 2C) s
               bwd: read dq_embed, dk_embed, cos, sin; write dq, dk   (2E + 2C) s
    embedding  fwd: read N of the V rows, write N rows (N tokens, H wide), read the ids  2NH s + 8N
               bwd: read dy, write the (V, H) gradient, read the ids                    (N + V) H s + 8N
FLOPs are nominal (rope: 3 per rotated element and pass; embedding: 1 per gradient element added).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch.benchmark.suites.spec import ModulePeer, OpBench, Shape, Suite, generator
from kernel_pytorch.reference.rope_tables import cos_sin, default_inv_freq

NAME = "rope"
THETA = 500000.0  # Llama-3's rope_theta


def heads(batch: int, heads_q: int, heads_k: int, tokens: int, head_dim: int, config: str) -> Shape:
    """A RoPE problem: q (batch, heads_q, tokens, head_dim) and k with heads_k heads."""
    return Shape.of(config, batch=batch, heads_q=heads_q, heads_k=heads_k, tokens=tokens, head_dim=head_dim)


TRAIN = heads(4, 32, 8, 4096, 128, "Llama-3-8B: 32 q / 8 kv heads, head_dim 128, 4 x 4096 tokens (training step)")
DECODE = heads(32, 32, 8, 1, 128, "Llama-3-8B decode: 32 sequences, one new token each (launch-bound)")
ROPE_CUDA = (
    TRAIN,
    heads(1, 64, 8, 8192, 128, "Llama-3-70B: 64 q / 8 kv heads, head_dim 128, 8192 tokens"),
    DECODE,
)
ROPE_CPU = (heads(1, 8, 2, 64, 64, "CPU smoke: 8 q / 2 kv heads, head_dim 64, 64 tokens"),)
ROPE_QUICK = {"cuda": DECODE, "cpu": heads(1, 4, 2, 16, 32, "CPU smoke: 4 q / 2 kv heads, head_dim 32, 16 tokens")}

VOCAB_CONFIG = "Llama-3-8B: vocabulary 128256, hidden 4096, 16384 tokens"
EMB_CUDA = (Shape.of(VOCAB_CONFIG, vocab=128256, hidden=4096, tokens=16384),)
EMB_CPU = (Shape.of("CPU smoke: vocabulary 1000, hidden 64, 256 tokens", vocab=1000, hidden=64, tokens=256),)
EMB_QUICK = {"cuda": Shape.of("vocabulary 32000, hidden 1024, 2048 tokens", vocab=32000, hidden=1024, tokens=2048),
             "cpu": Shape.of("CPU smoke: vocabulary 100, hidden 32, 64 tokens", vocab=100, hidden=32, tokens=64)}


# ---- the eager code, as Hugging Face transformers writes it --------------------------------------


def hf_rotate_half(x: Tensor) -> Tensor:
    """Llama's rotate_half."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Llama's apply_rotary_pos_emb (unsqueeze_dim=1): q (B, Hq, T, D), k (B, Hk, T, D), cos/sin (B or 1, T, D)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    q_embed = (q * cos) + (hf_rotate_half(q) * sin)
    k_embed = (k * cos) + (hf_rotate_half(k) * sin)
    return q_embed, k_embed


def hf_rotate_pairs(x: Tensor) -> Tensor:
    """Cohere's rotate_half: the interleaved pairs (2i, 2i + 1)."""
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


def hf_apply_rotary_interleaved(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Cohere's apply_rotary_pos_emb: interleaved pairs, math in fp32, cast back."""
    dtype = q.dtype
    q, k = q.float(), k.float()
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_embed = (q * cos) + (hf_rotate_pairs(q) * sin)
    k_embed = (k * cos) + (hf_rotate_pairs(k) * sin)
    return q_embed.to(dtype=dtype), k_embed.to(dtype=dtype)


# ---- inputs, counts ------------------------------------------------------------------------------


def _rope_inputs(interleaved: bool) -> Callable[..., dict[str, Tensor]]:
    """q, k as transposed (B, T, H, D) projections; cos/sin true rotations at the shape's positions."""

    def make(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
        draw = generator(device, seed)
        b, t, d = shape.batch, shape.tokens, shape.head_dim
        q = draw(b, t, shape.heads_q, d).to(dtype).transpose(1, 2)
        k = draw(b, t, shape.heads_k, d).to(dtype).transpose(1, 2)
        if t == 1:  # decoding: each sequence at its own position
            pos = 100 + 37 * torch.arange(b, device=device)[:, None]
        else:
            pos = torch.arange(t, device=device)[None]
        cos, sin = cos_sin(default_inv_freq(THETA, d, device), pos, 1.0, dtype, interleaved)
        return {"q": q, "k": k, "cos": cos, "sin": sin}

    return make


def _rope_bytes(s: Shape, es: int) -> tuple[int, int]:
    e = s.batch * s.tokens * (s.heads_q + s.heads_k) * s.head_dim
    c = (s.batch if s.tokens == 1 else 1) * s.tokens * s.head_dim
    return (2 * e + 2 * c) * es, (2 * e + 2 * c) * es


def _rope_flops(s: Shape) -> tuple[int, int]:
    e = s.batch * s.tokens * (s.heads_q + s.heads_k) * s.head_dim
    return 3 * e, 3 * e


def _embedding_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    """Uniform token ids (N,) and a (V, H) table of small normal values."""
    draw = generator(device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    ids = torch.randint(0, shape.vocab, (shape.tokens,), generator=gen, device=device)
    return {"indices": ids, "weight": (0.02 * draw(shape.vocab, shape.hidden)).to(dtype)}


def _embedding_bytes(s: Shape, es: int) -> tuple[int, int]:
    return 2 * s.tokens * s.hidden * es + 8 * s.tokens, (s.tokens + s.vocab) * s.hidden * es + 8 * s.tokens


LIGER_NOTE = "liger_rotary_pos_emb; rotates q and k in place (their memory is (B, T, H, D))"

ROPE = OpBench(
    name="rope", make_inputs=_rope_inputs(False),
    arg_names=("q", "k", "cos", "sin"), grad_names=("q", "k"), param_names=(), out_names=("q_embed", "k_embed"),
    reference=lambda q, k, cos, sin: reference.rope(q, k, cos, sin),
    eager=hf_apply_rotary_pos_emb,
    ours=lambda q, k, cos, sin, *, backend: kpf.apply_rotary(q, k, cos, sin, backend=backend),
    liger=ModulePeer(target="liger_kernel.transformers.rope:liger_rotary_pos_emb", init_args=lambda t: (),
                     call=("q", "k", "cos", "sin"), note=LIGER_NOTE),
    min_bytes=_rope_bytes, flops=_rope_flops, cuda_shapes=ROPE_CUDA, cpu_shapes=ROPE_CPU, quick_shapes=ROPE_QUICK,
)
ROPE_INTERLEAVED = OpBench(
    name="rope_interleaved", make_inputs=_rope_inputs(True),
    arg_names=("q", "k", "cos", "sin"), grad_names=("q", "k"), param_names=(), out_names=("q_embed", "k_embed"),
    reference=lambda q, k, cos, sin: reference.rope(q, k, cos, sin, interleaved=True),
    eager=hf_apply_rotary_interleaved,
    ours=lambda q, k, cos, sin, *, backend: kpf.apply_rotary(q, k, cos, sin, interleaved=True, backend=backend),
    liger=None,
    min_bytes=_rope_bytes, flops=_rope_flops, cuda_shapes=(TRAIN, DECODE), cpu_shapes=ROPE_CPU,
    quick_shapes=ROPE_QUICK,
)
EMBEDDING = OpBench(
    name="embedding", make_inputs=_embedding_inputs,
    arg_names=("indices", "weight"), grad_names=("weight",), param_names=("weight",), out_names=("y",),
    reference=lambda indices, weight: reference.embedding(indices, weight),
    eager=lambda indices, weight: torch.nn.functional.embedding(indices, weight),
    ours=lambda indices, weight, *, backend: kpf.embedding(indices, weight, backend=backend),
    liger=None,
    min_bytes=_embedding_bytes, flops=lambda s: (0, s.tokens * s.hidden),
    cuda_shapes=EMB_CUDA, cpu_shapes=EMB_CPU, quick_shapes=EMB_QUICK,
)

SPECS = {s.name: s for s in (ROPE, ROPE_INTERLEAVED, EMBEDDING)}
SUITE = Suite(NAME, tuple(SPECS.values()))
OPS = SUITE.ops
PROVIDERS = SUITE.providers  # ours, eager, compile, liger


__all__ = ["DECODE", "EMBEDDING", "NAME", "OPS", "PROVIDERS", "ROPE", "ROPE_INTERLEAVED", "SPECS", "SUITE", "TRAIN",
           "hf_apply_rotary_interleaved", "hf_apply_rotary_pos_emb", "hf_rotate_half", "hf_rotate_pairs"]
