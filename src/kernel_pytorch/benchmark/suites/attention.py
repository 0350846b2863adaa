"""The attention suite: core causal attention, the whole attention block, and document masks.

Ops (shapes from Llama-3-8B: 32 query heads, 8 KV heads, head_dim 128; the benchmark's B=4, S=4096):
    attention            q (B, Hq, S, D), k/v (B, Hk, S, D), causal.
        ours       functional.attention(backend="sdpa"): GQA by enable_gqa, K/V never repeated.
        ours-flex  the same with backend="flex" (CUDA only: no Flex backward on CPU).
        sdpa-flash a bare SDPA flash call on the same q/k/v (enable_gqa): the floor ours should be near.
        eager      transformers' eager_attention_forward: repeat_kv, matmul, fp32 softmax, matmul.
        compile    torch.compile of that eager code.
    attention_block      x (B, S, dim), w_qkv (dim, (Hq + 2 Hk) D) fused, w_o; cos/sin tables (S, D).
        ours       the path of nn.Attention: one fused QKV matmul, RoPE (reference math, fp32 rounded
                   once), functional.attention(backend="sdpa"), o_proj.
        eager      LlamaAttention as transformers writes it: three projections (views of the same
                   weight), apply_rotary_pos_emb in the model dtype, repeat_kv, eager attention, o_proj.
        compile    torch.compile of that eager block.
    attention_documents  8 documents of 512 tokens packed in each 4096-token row, causal within each.
        ours       functional.attention(seq_ids=..., backend="flex"): empty tiles skipped (CUDA; on CPU
                   the SDPA path, Flex having no CPU backward).
        eager      SDPA with the equivalent dense boolean mask (what a model without Flex does).
    attention_decode     one decoding step (inference, "fwd" only): q (B, Hq, 1, D) against a full
                         static KV cache k/v (B, Hk, cache, D); Llama-3-8B, B 32, cache 4096 and 16384.
        ours       what nn.Attention runs in a decoding step: the StaticKVCache's mask of the written
                   slots (nn.attention.cache_mask, built from the position tensor on the device) and
                   functional.attention(backend="sdpa") over the whole cache, K/V not repeated. With a
                   mask SDPA cannot take its flash kernel: memory-efficient or math, as torch picks.
        sdpa       a bare SDPA call with no mask (enable_gqa): right here only because every slot is
                   written, what a cache-aware kernel could reach.
        eager      transformers' static-cache decode: the additive mask from the position, repeat_kv,
                   matmul, fp32 softmax, matmul.
        compile    torch.compile of that eager code.
Liger-Kernel has no attention (its RoPE kernel is benchmarked by the RoPE suite): its rows say so.
Decoding a whole model (compiled with CUDA graphs, tokens/s against transformers' static-cache
generate) is not in this suite: attention_decode is the attention core of one step.

The correctness gate runs the reference in fp64; here it goes one K/V head group at a time under
activation checkpointing (`chunked_reference`), so the fp64 scores of one group (not all 32 heads) are
alive at once: at B=4, S=4096 that is 4 x 4 x 4096^2 fp64 scores, 2.1 GB, and about a second of fp64
math in all. Longer sequences grow it with S^2: where the B Hq S^2 scores exceed GATE_SCORE_ELEMENTS
(4.3e9: S=8192 at B=4 and beyond), the gate runs at `gate_shape`, batch 1 and fewer K/V heads with the
same sequence length, head_dim and GQA ratio (the rows say so); the timing stays at the full shape. The
default shapes gate at their own shape: a gate at another shape would also cost the compiled providers
(compile, ours-flex) one more compilation each.

Bytes are the minimum each pass moves (s = element size): core attention fwd reads q, k, v and writes
o, bwd reads q, k, v, o, do and writes dq, dk, dv. FLOPs are the causal count: 2 matmuls of
B Hq S^2 D / 2 multiply-adds forward (4 B Hq S^2 D / 2), 2.5x that backward. A decoding step reads
the KV cache once (2 B Hk cache D s, q and o besides): its % of copy is how close it gets to streaming
the cache; FLOPs 4 B Hq cache D.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch.benchmark.suites.spec import ExtraProvider, OpBench, Shape, Suite, generator
from kernel_pytorch.nn.attention import cache_mask
from kernel_pytorch.reference.rope_tables import default_inv_freq

NAME = "attention"
DOC_LEN = 512


def attn_shape(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, config: str) -> Shape:
    """An attention problem (dim = heads * head_dim for the block)."""
    return Shape.of(config, batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, head_dim=head_dim)


CUDA_SHAPES = (attn_shape(4, 32, 8, 4096, 128, "Llama-3-8B: 32 heads, 8 KV heads, D 128, B 4, S 4096"),)
CPU_SHAPES = (attn_shape(1, 8, 2, 256, 32, "CPU smoke: 8 heads, 2 KV heads, D 32, S 256"),)
QUICK_SHAPES = {
    "cuda": attn_shape(1, 32, 8, 1024, 128, "Llama-3-8B heads, B 1, S 1024"),
    "cpu": attn_shape(1, 4, 2, 64, 16, "CPU smoke: 4 heads, 2 KV heads, D 16, S 64"),
}
_SHAPES = dict(cuda_shapes=CUDA_SHAPES, cpu_shapes=CPU_SHAPES, quick_shapes=QUICK_SHAPES)


def decode_shape(batch: int, heads: int, kv_heads: int, cache: int, head_dim: int, config: str) -> Shape:
    """One decoding step: one query token per sequence against a KV cache of `cache` tokens."""
    return Shape.of(config, batch=batch, heads=heads, kv_heads=kv_heads, cache=cache, head_dim=head_dim)


DECODE_CUDA_SHAPES = tuple(
    decode_shape(32, 32, 8, n, 128, f"Llama-3-8B decode: 32 heads, 8 KV heads, D 128, B 32, cache {n}")
    for n in (4096, 16384)
)
DECODE_SHAPES = dict(
    cuda_shapes=DECODE_CUDA_SHAPES,
    cpu_shapes=(decode_shape(4, 8, 2, 256, 32, "CPU smoke: decode, 8 heads, 2 KV heads, D 32, cache 256"),),
    quick_shapes={"cuda": decode_shape(32, 32, 8, 1024, 128, "Llama-3-8B decode, B 32, cache 1024"),
                  "cpu": decode_shape(2, 4, 2, 32, 16, "CPU smoke: decode, 4 heads, 2 KV heads, D 16, cache 32")},
)

GATE_SCORE_ELEMENTS = 1 << 32  # fp64 scores in all (34 GB; chunked_reference holds 1 / Hk of them at once)


def gate_shape(shape: Shape) -> Shape:
    """The shape the correctness gate runs at: `shape` itself when its B Hq S^2 scores fit
    GATE_SCORE_ELEMENTS; else batch 1, then K/V heads halved (query heads with them: the GQA ratio
    kept) until they fit or one K/V head is left. Sequence length and head_dim never change."""
    dims = dict(shape.dims)
    groups = dims["heads"] // dims["kv_heads"]

    def scores() -> int:
        return dims["batch"] * dims["heads"] * dims["seq"] ** 2

    if scores() <= GATE_SCORE_ELEMENTS:
        return shape
    dims["batch"] = 1
    while scores() > GATE_SCORE_ELEMENTS and dims["kv_heads"] > 1:
        dims["kv_heads"] //= 2
        dims["heads"] = dims["kv_heads"] * groups
    return Shape.of(f"correctness gate of {shape.config}", **dims)


# ---- transformers' eager code ---------------------------------------------------------------------


def hf_repeat_kv(x: Tensor, groups: int) -> Tensor:
    """transformers' repeat_kv: (B, Hk, S, D) -> (B, Hk * groups, S, D), materialised."""
    b, hk, s, d = x.shape
    if groups == 1:
        return x
    return x[:, :, None].expand(b, hk, groups, s, d).reshape(b, hk * groups, s, d)


def hf_eager_attention(q: Tensor, k: Tensor, v: Tensor, causal_mask: Tensor | None) -> Tensor:
    """eager_attention_forward: repeat_kv, q k^T * scale + mask, softmax in fp32, @ v. -> (B, Hq, S, D)."""
    groups = q.shape[1] // k.shape[1]
    k, v = hf_repeat_kv(k, groups), hf_repeat_kv(v, groups)
    w = (q @ k.transpose(2, 3)) * q.shape[-1] ** -0.5
    if causal_mask is not None:
        w = w + causal_mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return w @ v


def _causal_additive(s: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The (1, 1, S, S) additive causal mask transformers builds (min of the dtype above the diagonal)."""
    upper = torch.ones(s, s, dtype=torch.bool, device=device).triu(1)
    return torch.zeros(s, s, dtype=dtype, device=device).masked_fill(upper, torch.finfo(dtype).min)[None, None]


def hf_rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_block(x: Tensor, w_qkv: Tensor, w_o: Tensor, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int) -> Tensor:
    """LlamaAttention.forward with three projections, rope in the model dtype, eager attention."""
    b, s, _ = x.shape
    d = cos.shape[-1]
    wq, wk, wv = w_qkv.split((n_heads * d, n_kv * d, n_kv * d), dim=0)
    q = F.linear(x, wq).view(b, s, -1, d).transpose(1, 2)
    k = F.linear(x, wk).view(b, s, -1, d).transpose(1, 2)
    v = F.linear(x, wv).view(b, s, -1, d).transpose(1, 2)
    c, sn = cos[None, None], sin[None, None]
    q, k = q * c + hf_rotate_half(q) * sn, k * c + hf_rotate_half(k) * sn
    out = hf_eager_attention(q, k, v, _causal_additive(s, x.dtype, x.device))
    return F.linear(out.transpose(1, 2).reshape(b, s, -1), w_o)


# ---- ours and the reference -----------------------------------------------------------------------


def ours_block(x: Tensor, w_qkv: Tensor, w_o: Tensor, cos: Tensor, sin: Tensor, n_heads: int, n_kv: int,
               backend: str = "sdpa") -> Tensor:
    """nn.Attention's forward as a function of its weights (fused QKV, reference RoPE, functional.attention)."""
    b, s, _ = x.shape
    d = cos.shape[-1]
    q, k, v = F.linear(x, w_qkv).split((n_heads * d, n_kv * d, n_kv * d), dim=-1)
    q = q.view(b, s, n_heads, d).transpose(1, 2)
    k = k.view(b, s, n_kv, d).transpose(1, 2)
    v = v.view(b, s, n_kv, d).transpose(1, 2)
    q, k = reference.rope(q, k, cos, sin)
    out = kpf.attention(q, k, v, is_causal=True, backend=backend)
    return F.linear(out.transpose(1, 2).reshape(b, s, -1), w_o)


def chunked_reference(q: Tensor, k: Tensor, v: Tensor, **options) -> Tensor:
    """reference.attention one K/V head (and its query group) at a time, each under checkpointing:
    the same math, with one group's scores alive at once (the fp64 gate at B=4, S=4096 fits)."""
    groups = q.shape[1] // k.shape[1]
    outs = [
        checkpoint(lambda qc, kc, vc: reference.attention(qc, kc, vc, **options),
                   q[:, h * groups:(h + 1) * groups], k[:, h:h + 1], v[:, h:h + 1], use_reentrant=False)
        for h in range(k.shape[1])
    ]
    return torch.cat(outs, dim=1)


def reference_block(x: Tensor, w_qkv: Tensor, w_o: Tensor, cos: Tensor, sin: Tensor, n_heads: int,
                    n_kv: int) -> Tensor:
    b, s, _ = x.shape
    d = cos.shape[-1]
    q, k, v = F.linear(x, w_qkv).split((n_heads * d, n_kv * d, n_kv * d), dim=-1)
    q, k = reference.rope(q.view(b, s, n_heads, d).transpose(1, 2), k.view(b, s, n_kv, d).transpose(1, 2), cos, sin)
    out = chunked_reference(q, k, v.view(b, s, n_kv, d).transpose(1, 2), is_causal=True)
    return F.linear(out.transpose(1, 2).reshape(b, s, -1), w_o)


def doc_ids(s: int, device: torch.device) -> Tensor:
    """(1, S) document ids: documents of DOC_LEN tokens packed in one row."""
    return (torch.arange(s, device=device) // DOC_LEN)[None]


def _doc_mask(s: int, device: torch.device) -> Tensor:
    ids = doc_ids(s, device)[0]
    return ((ids[:, None] == ids[None, :]) & torch.ones(s, s, dtype=torch.bool, device=device).tril())[None, None]


def hf_decode_mask(pos: Tensor, cache: int, dtype: torch.dtype) -> Tensor:
    """transformers' static-cache decode mask: (1, 1, 1, cache) additive, the dtype's min past `pos` (1,)."""
    beyond = (torch.arange(cache, device=pos.device) > pos[:, None])[None, None]
    return torch.zeros(beyond.shape, dtype=dtype, device=pos.device).masked_fill(beyond, torch.finfo(dtype).min)


def ours_decode(q: Tensor, k: Tensor, v: Tensor, pos: Tensor) -> Tensor:
    """nn.Attention's decoding step over a StaticKVCache's buffers (the mask of the written slots, SDPA)."""
    return kpf.attention(q, k, v, mask=cache_mask(pos, k.shape[2]), backend="sdpa")


# ---- inputs and counts ----------------------------------------------------------------------------


def _qkv_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    draw = generator(device, seed)
    b, h, hk, s, d = shape.batch, shape.heads, shape.kv_heads, shape.seq, shape.head_dim
    t = {"q": draw(b, h, s, d), "k": draw(b, hk, s, d), "v": draw(b, hk, s, d)}
    return {k: v.to(dtype) for k, v in t.items()}


def _block_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    draw = generator(device, seed)
    b, h, hk, s, d = shape.batch, shape.heads, shape.kv_heads, shape.seq, shape.head_dim
    dim = h * d
    inv_freq = default_inv_freq(500000.0, d, device)  # Llama-3's rope_theta
    cos, sin = reference.cos_sin_table(inv_freq, s, dtype=dtype)
    return {
        "x": draw(b, s, dim).to(dtype),
        "w_qkv": (draw((h + 2 * hk) * d, dim) / math.sqrt(dim)).to(dtype),
        "w_o": (draw(dim, dim) / math.sqrt(dim)).to(dtype),
        "cos": cos, "sin": sin,
    }


def _decode_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    draw = generator(device, seed)
    b, h, hk, n, d = shape.batch, shape.heads, shape.kv_heads, shape.cache, shape.head_dim
    t = {"q": draw(b, h, 1, d), "k": draw(b, hk, n, d), "v": draw(b, hk, n, d)}
    # the token goes in the last slot: every cached key is attended, the cache read whole
    return {**{k: v.to(dtype) for k, v in t.items()}, "pos": torch.tensor([n - 1], device=device)}


def _decode_bytes(shape: Shape, es: int) -> tuple[int, int]:
    q = shape.batch * shape.heads * shape.head_dim
    return (2 * shape.batch * shape.kv_heads * shape.cache * shape.head_dim + 2 * q) * es, 0


def _decode_flops(shape: Shape) -> tuple[int, int]:
    return 4 * shape.batch * shape.heads * shape.cache * shape.head_dim, 0


def _attn_bytes(shape: Shape, es: int) -> tuple[int, int]:
    q = shape.batch * shape.heads * shape.seq * shape.head_dim
    kv = shape.batch * shape.kv_heads * shape.seq * shape.head_dim
    return (2 * q + 2 * kv) * es, (3 * q + 2 * kv + 2 * q + 2 * kv) * es


def _attn_flops(shape: Shape, causal: float = 0.5) -> tuple[int, int]:
    fwd = int(4 * shape.batch * shape.heads * shape.seq**2 * shape.head_dim * causal)
    return fwd, int(2.5 * fwd)


def _block_bytes(shape: Shape, es: int) -> tuple[int, int]:
    dim = shape.heads * shape.head_dim
    w = ((shape.heads + 2 * shape.kv_heads) * shape.head_dim * dim + dim * dim) * es
    act = 2 * shape.batch * shape.seq * dim * es
    fwd_attn, bwd_attn = _attn_bytes(shape, es)
    return w + act + fwd_attn, 2 * w + 2 * act + bwd_attn


def _block_flops(shape: Shape) -> tuple[int, int]:
    dim = shape.heads * shape.head_dim
    tokens = shape.batch * shape.seq
    proj = 2 * tokens * dim * ((shape.heads + 2 * shape.kv_heads) * shape.head_dim + dim)
    fwd, bwd = _attn_flops(shape)
    return proj + fwd, 2 * proj + bwd


def _cuda_only(fn: Callable[..., Tensor], note: str) -> Callable[[torch.device], tuple[Callable | None, str]]:
    return lambda device: (fn, note) if device.type == "cuda" else (None, "")


def _sdpa_flash(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _heads(t: Tensor, w: Tensor, x: Tensor) -> tuple[int, int]:
    """(n_heads, n_kv_heads) of a block from its inputs: dim = heads * D, w_qkv rows = (Hq + 2 Hk) D."""
    d = t.shape[-1]
    n_heads = x.shape[-1] // d
    return n_heads, (w.shape[0] // d - n_heads) // 2


ATTENTION = OpBench(
    name="attention", make_inputs=_qkv_inputs, arg_names=("q", "k", "v"), grad_names=("q", "k", "v"),
    param_names=(), out_names=("o",),
    reference=lambda q, k, v: chunked_reference(q, k, v, is_causal=True),
    eager=lambda q, k, v: hf_eager_attention(q, k, v, _causal_additive(q.shape[2], q.dtype, q.device)),
    # the runner asks "ours" for backend="triton" on CUDA: attention's kernels are torch's (SDPA)
    ours=lambda q, k, v, *, backend: kpf.attention(q, k, v, is_causal=True, backend="sdpa"),
    liger=None, min_bytes=_attn_bytes, flops=_attn_flops,
    extras=(
        ExtraProvider("ours-flex", _cuda_only(lambda q, k, v: kpf.attention(q, k, v, is_causal=True, backend="flex"),
                                              "backend='flex', a cached causal block mask")),
        ExtraProvider("sdpa-flash", _cuda_only(_sdpa_flash, "bare SDPA, flash kernel pinned, enable_gqa: the floor")),
    ),
    ours_cpu_note="cpu: functional.attention(backend='sdpa')", gate_shape=gate_shape, **_SHAPES,
)
ATTENTION_BLOCK = OpBench(
    name="attention_block", make_inputs=_block_inputs, arg_names=("x", "w_qkv", "w_o", "cos", "sin"),
    grad_names=("x", "w_qkv", "w_o"), param_names=("w_qkv", "w_o"), out_names=("y",),
    reference=lambda x, w_qkv, w_o, cos, sin: reference_block(x, w_qkv, w_o, cos, sin, *_heads(cos, w_qkv, x)),
    eager=lambda x, w_qkv, w_o, cos, sin: hf_block(x, w_qkv, w_o, cos, sin, *_heads(cos, w_qkv, x)),
    ours=lambda x, w_qkv, w_o, cos, sin, *, backend: ours_block(x, w_qkv, w_o, cos, sin, *_heads(cos, w_qkv, x)),
    liger=None, min_bytes=_block_bytes, flops=_block_flops,
    ours_cpu_note="cpu: fused QKV, reference RoPE, functional.attention(backend='sdpa')", gate_shape=gate_shape,
    **_SHAPES,
)
ATTENTION_DOCUMENTS = OpBench(
    name="attention_documents", make_inputs=_qkv_inputs, arg_names=("q", "k", "v"), grad_names=("q", "k", "v"),
    param_names=(), out_names=("o",),
    reference=lambda q, k, v: chunked_reference(q, k, v, is_causal=True, seq_ids=doc_ids(q.shape[2], q.device)),
    eager=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_doc_mask(q.shape[2], q.device),
                                                         enable_gqa=True),
    ours=lambda q, k, v, *, backend: kpf.attention(
        q, k, v, is_causal=True, seq_ids=doc_ids(q.shape[2], q.device),
        backend="flex" if q.is_cuda else "sdpa"),
    liger=None, min_bytes=_attn_bytes, flops=lambda s: _attn_flops(s, causal=DOC_LEN / s.seq / 2),
    ours_cpu_note="cpu: the SDPA path (no Flex backward on CPU)", gate_shape=gate_shape, **_SHAPES,
)
ATTENTION_DECODE = OpBench(
    name="attention_decode", make_inputs=_decode_inputs, arg_names=("q", "k", "v", "pos"), grad_names=(),
    param_names=(), out_names=("o",), passes=("fwd",),
    reference=lambda q, k, v, pos: chunked_reference(q, k, v, mask=cache_mask(pos, k.shape[2])),
    eager=lambda q, k, v, pos: hf_eager_attention(q, k, v, hf_decode_mask(pos, k.shape[2], q.dtype)),
    ours=lambda q, k, v, pos, *, backend: ours_decode(q, k, v, pos),
    liger=None, min_bytes=_decode_bytes, flops=_decode_flops,
    extras=(ExtraProvider("sdpa", lambda device: (
        lambda q, k, v, pos: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "bare SDPA, no mask (every slot written), enable_gqa")),),
    ours_cpu_note="cpu: the StaticKVCache mask and functional.attention(backend='sdpa')", **DECODE_SHAPES,
)

SPECS = {s.name: s for s in (ATTENTION, ATTENTION_BLOCK, ATTENTION_DOCUMENTS, ATTENTION_DECODE)}
SUITE = Suite(NAME, tuple(SPECS.values()))

__all__ = ["ATTENTION", "ATTENTION_BLOCK", "ATTENTION_DECODE", "ATTENTION_DOCUMENTS", "CPU_SHAPES", "CUDA_SHAPES",
           "DECODE_CUDA_SHAPES", "GATE_SCORE_ELEMENTS", "NAME", "SPECS", "SUITE", "attn_shape", "chunked_reference",
           "decode_shape", "gate_shape", "hf_block", "hf_decode_mask", "hf_eager_attention", "ours_block",
           "ours_decode", "reference_block"]
