"""Attention family: `attention(q, k, v, *, masks and score options, backend="auto")`.

Backends (reference/attention.py defines what every one computes):
    "sdpa"   torch's scaled_dot_product_attention (flash / cuDNN / memory-efficient / math chosen by
             torch, or pinned with `sdpa_kernel=`); GQA by enable_gqa, K/V never repeated. Structural
             masks become one dense boolean mask (ALiBi and additive masks a float one); a plain causal
             mask over equal lengths stays `is_causal=True` (the flash path). Cannot soft-cap.
    "flex"   FlexAttention: masks as block masks (empty tiles skipped), soft-capping, ALiBi and additive
             masks as score mods (functional/_flex.py). CPU: forward only (torch 2.13 raises for
             inputs that require grad).
    "eager"  the reference: matmul, softmax, matmul in fp32 (materialises the scores, repeats K/V).
    "auto"   "sdpa", unless the options need or favour Flex: a soft-cap (SDPA cannot express it), a
             `block_mask`, or documents / a sliding window on CUDA (block-sparse: the empty tiles cost
             nothing); where Flex cannot run (CPU with gradients) soft-capping falls back to "eager".
             Why it leaves SDPA is logged once.

Masks as Hugging Face passes them go through `prepare_mask` once per forward (not per layer): a 2-D
(B, K) padding mask of 1 = keep, a 4-D boolean mask, or a 4-D additive float mask.

DTensor q, k, v (tensor parallelism's head-sharded attention) placed alike on each mesh dimension,
Replicate, Shard(0) (the batch) or Shard(1) (the heads, query and key/value heads each split evenly):
each rank attends its own rows and heads on its local tensors, on any backend, and the result is a
DTensor placed as q (`_sharded`). Torch's SDPA has sharding strategies for its CUDA kernels but none for
CPU's; batch rows and heads are independent, so the local call is the whole rule. Masks, ALiBi slopes
and document ids are plain tensors every rank holds whole, cut to the rank's rows and heads where they
have more than one.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch import reference
from kernel_pytorch._env import is_dtensor, log_once
from kernel_pytorch.functional._dispatch import _check_float, _check_same_device
from kernel_pytorch.reference.attention import allowed_keys, query_positions

if TYPE_CHECKING:
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.flex_attention import BlockMask

AttentionBackend = Literal["auto", "sdpa", "flex", "eager"]
_BACKENDS = ("auto", "sdpa", "flex", "eager")


def prepare_mask(attention_mask: Tensor | None, q_len: int, kv_len: int) -> Tensor | None:
    """A Hugging Face attention mask as `attention(mask=...)` takes it; call once per forward.

    Args:
        attention_mask: None; (B, K) padding mask (1 / True = a real token); (B, 1 or H, Q, K) boolean
            (True = attend) or additive float mask (0 = attend, a large negative = masked).
    Returns:
        None, a boolean (B, 1, 1, K) or (B, 1|H, Q, K) mask, or the additive mask unchanged.
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 2:
        if attention_mask.shape[-1] != kv_len:
            raise ValueError(
                f"attention_mask (B, K) must cover the {kv_len} keys (got shape {tuple(attention_mask.shape)})"
            )
        return attention_mask.bool()[:, None, None, :]
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (q_len, kv_len):
        raise ValueError(
            f"attention_mask must be (B, K) or (B, 1|H, {q_len}, {kv_len}) (got shape {tuple(attention_mask.shape)})"
        )
    return attention_mask


def seq_ids_from_cu_seqlens(cu_seqlens: Tensor, total: int) -> Tensor:
    """Document ids (1, total) of packed sequences from cumulative lengths (n + 1,) [0, l0, l0 + l1, ...]
    (flash-attn's varlen convention); tokens past cu_seqlens[-1] get id n (one more document)."""
    positions = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)[None, :]


def _check(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, alibi_slopes: Tensor | None,
           seq_ids: Tensor | None, backend: str) -> None:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS} (got {backend!r})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, T, D) (got shape {tuple(t.shape)})")
    _check_same_device("q", q, k=k, v=v, mask=mask, alibi_slopes=alibi_slopes, seq_ids=seq_ids)
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must share (B, Hk, K) with q's B and k q's head dim "
            f"(q {tuple(q.shape)})"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q's {q.shape[1]} heads must be a multiple of k's {k.shape[1]} heads (grouped-query attention)"
        )
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"q has {q.shape[2]} positions but k only {k.shape[2]}: queries are end-aligned with keys")
    if alibi_slopes is not None and alibi_slopes.shape != (q.shape[1],):
        raise ValueError(f"alibi_slopes must be ({q.shape[1]},) (got {tuple(alibi_slopes.shape)})")
    if seq_ids is not None and tuple(seq_ids.shape) not in ((q.shape[0], k.shape[2]), (1, k.shape[2])):
        raise ValueError(f"seq_ids must be (B or 1, {k.shape[2]}) (got {tuple(seq_ids.shape)})")


def _flex_runs(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """FlexAttention has no backward on CPU in torch 2.13."""
    return q.device.type == "cuda" or not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))


def _pick(backend: str, q: Tensor, k: Tensor, v: Tensor, *, softcap: float | None, window: int | None,
          seq_ids: Tensor | None, block_mask: BlockMask | None) -> str:
    """The backend that runs this call ("sdpa", "flex" or "eager"); for "auto" logs once why not SDPA."""
    if backend == "flex" and not _flex_runs(q, k, v) and not torch.compiler.is_compiling():
        raise ValueError("backend='flex' cannot run: FlexAttention has no backward on CPU (inputs require grad)")
    if backend == "sdpa" and (softcap is not None or block_mask is not None):
        raise ValueError("backend='sdpa' cannot apply softcap or a block_mask; use backend='flex' or 'eager'")
    if backend != "auto":
        return backend
    why = None
    if block_mask is not None:
        why = "a block_mask was given"
    elif softcap is not None:
        why = "soft-capping is a score mod SDPA cannot express"
    elif q.device.type == "cuda" and (seq_ids is not None or window is not None):
        why = "documents / a sliding window are block-sparse: Flex skips the empty tiles"
    if why is None:
        return "sdpa"
    compiling = torch.compiler.is_compiling()  # the log is an eager-only side effect
    if _flex_runs(q, k, v):
        if not compiling:
            log_once(f"kernel_pytorch.attention: backend='auto' runs FlexAttention: {why}")
        return "flex"
    if block_mask is not None:
        raise ValueError("a block_mask needs FlexAttention, which has no backward on CPU (inputs require grad)")
    if not compiling:
        log_once(
            f"kernel_pytorch.attention: {why}, and FlexAttention has no backward on CPU; using the eager reference"
        )
    return "eager"


def _sdpa(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool, scale: float | None,
          window: int | None, alibi_slopes: Tensor | None, seq_ids: Tensor | None,
          sdpa_kernel: SDPBackend | list[SDPBackend] | None) -> Tensor:
    q_len, kv_len = q.shape[2], k.shape[2]
    plain_causal = is_causal and window is None and seq_ids is None and alibi_slopes is None and mask is None
    attn_mask = None
    if not plain_causal or q_len != kv_len:
        # end-aligned causality (a decoding step attends to every cached key) as a dense mask
        keep = allowed_keys(q_len, kv_len, is_causal=is_causal and q_len > 1, window=window, seq_ids=seq_ids,
                            device=q.device)
        if mask is not None and mask.dtype == torch.bool:
            keep = mask if keep is None else keep & mask
        bias = None
        if alibi_slopes is not None:
            distance = torch.arange(kv_len, device=q.device) - query_positions(q_len, kv_len, q.device)[:, None]
            bias = alibi_slopes.float()[:, None, None] * distance
        if mask is not None and mask.dtype != torch.bool:
            bias = mask if bias is None else bias + mask
        if bias is not None:
            bias = bias.to(q.dtype)
            attn_mask = bias if keep is None else bias.masked_fill(~keep, float("-inf"))
        else:
            attn_mask = keep
    context = nullcontext()
    if sdpa_kernel is not None:
        from torch.nn.attention import sdpa_kernel as pinned

        context = pinned(sdpa_kernel)
    # branches, not values: with dynamic shapes `q_len == kv_len` and the head comparison are SymBools, which
    # SDPA refuses (bool() of one does not help under Dynamo); `if` makes Dynamo and export decide them
    causal = gqa = False
    if plain_causal and q_len == kv_len:
        causal = True
    if q.shape[1] != k.shape[1]:
        gqa = True
    with context:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale,
                                              enable_gqa=gqa)


def _flex(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, is_causal: bool, scale: float | None,
          softcap: float | None, window: int | None, alibi_slopes: Tensor | None, seq_ids: Tensor | None,
          block_mask: BlockMask | None) -> Tensor:
    from kernel_pytorch.functional import _flex

    b, hq, q_len, _ = q.shape
    kv_len = k.shape[2]
    shape = (b, hq, q_len, kv_len)
    keep = mask.expand(shape) if mask is not None and mask.dtype == torch.bool else None
    bias = mask.expand(shape) if mask is not None and mask.dtype != torch.bool else None
    if block_mask is None:
        if seq_ids is not None:
            seq_ids = seq_ids.expand(b, kv_len)
        # a mask the same for every head (or batch row) gives a block mask broadcast over them
        block_mask = _flex.block_mask(
            q_len, kv_len, is_causal=is_causal, window=window, seq_ids=seq_ids, keep=keep,
            batch=b if keep is not None and mask.shape[0] > 1 else None,
            heads=hq if keep is not None and mask.dim() == 4 and mask.shape[1] > 1 else None, device=q.device,
        )
    score = _flex.score_mod(q_len, kv_len, softcap=softcap, alibi_slopes=alibi_slopes, bias=bias)
    return _flex.flex(q, k, v, mask=block_mask, score=score, scale=scale)


def attention(
    q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None = None, is_causal: bool = False,
    scale: float | None = None, softcap: float | None = None, window: int | None = None,
    alibi_slopes: Tensor | None = None, seq_ids: Tensor | None = None, cu_seqlens: Tensor | None = None,
    block_mask: BlockMask | None = None, sdpa_kernel: SDPBackend | list[SDPBackend] | None = None,
    backend: AttentionBackend = "auto",
) -> Tensor:
    """Scaled dot-product attention with masks and score options (reference/attention.py's semantics).

    Args:
        q: (B, Hq, Q, D); k: (B, Hk, K, D); v: (B, Hk, K, Dv); Hq % Hk == 0 (GQA, K/V not repeated).
        mask: boolean (True = attend) or additive, broadcastable to (B, Hq, Q, K) (see `prepare_mask`).
        is_causal: queries end-aligned with keys attend to keys at or before their position.
        scale: default 1 / sqrt(D).
        softcap: scores -> softcap * tanh(scores / softcap) (flex, eager).
        window: sliding window (implies causal): a query sees its last `window` keys.
        alibi_slopes: (Hq,) ALiBi slopes (reference.alibi_slopes).
        seq_ids: (B or 1, K) document ids of packed sequences (`seq_ids_from_position_ids` reads them from
            position ids restarting at each document); or cu_seqlens (n + 1,) for one packed row.
        block_mask: a prebuilt FlexAttention BlockMask (replaces the structural masks; flex only).
        sdpa_kernel: pin SDPA's kernel(s), e.g. SDPBackend.FLASH_ATTENTION (sdpa only).
        backend: "auto" | "sdpa" | "flex" | "eager" (module docstring).
    Returns:
        (B, Hq, Q, Dv) in q's dtype.
    """
    if cu_seqlens is not None:
        seq_ids = seq_ids_from_cu_seqlens(cu_seqlens, k.shape[2])
    if not torch.compiler.is_compiling():
        _check(q, k, v, mask, alibi_slopes, seq_ids, backend)
    if is_dtensor(q):
        return _sharded(q, k, v, dict(mask=mask, is_causal=is_causal, scale=scale, softcap=softcap, window=window,
                                      alibi_slopes=alibi_slopes, seq_ids=seq_ids, block_mask=block_mask,
                                      sdpa_kernel=sdpa_kernel, backend=backend))
    run = _pick(backend, q, k, v, softcap=softcap, window=window, seq_ids=seq_ids, block_mask=block_mask)
    if run == "eager":
        if seq_ids is not None:
            seq_ids = seq_ids.expand(q.shape[0], k.shape[2])
        return reference.attention(q, k, v, mask=mask, is_causal=is_causal, scale=scale, softcap=softcap,
                                   window=window, alibi_slopes=alibi_slopes, seq_ids=seq_ids)
    if run == "sdpa":
        return _sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale, window=window,
                     alibi_slopes=alibi_slopes, seq_ids=seq_ids, sdpa_kernel=sdpa_kernel)
    return _flex(q, k, v, mask=mask, is_causal=is_causal, scale=scale, softcap=softcap, window=window,
                 alibi_slopes=alibi_slopes, seq_ids=seq_ids, block_mask=block_mask)


def _sharded(q: Tensor, k: Tensor, v: Tensor, options: dict) -> Tensor:
    """`attention` of DTensor q, k, v (module docstring): the local call on each rank's rows and heads,
    returned as a DTensor placed as q. Raises for other placements, heads that do not split evenly and a
    block_mask (its tensors cover every head and row)."""
    from torch.distributed.tensor import DTensor

    mesh, placements = q.device_mesh, q.placements
    for name, t in (("k", k), ("v", v)):
        if not is_dtensor(t) or t.device_mesh != mesh or t.placements != placements:
            got = tuple(t.placements) if is_dtensor(t) else "a plain tensor"
            raise ValueError(f"{name} must be a DTensor on q's mesh placed as q {tuple(placements)} (got {got})")
    even = True
    for i, p in enumerate(placements):
        if not (p.is_replicate() or p.is_shard(0) or p.is_shard(1)):
            raise ValueError(f"attention runs on DTensor q, k, v Replicate, sharded on the batch (Shard(0)) or on the "
                             f"heads (Shard(1)), alike on each mesh dimension (got {tuple(placements)})")
        if p.is_shard(1) and (q.shape[1] % mesh.size(i) or k.shape[1] % mesh.size(i)):
            raise ValueError(f"{q.shape[1]} query heads and {k.shape[1]} key/value heads do not split evenly over mesh "
                             f"dimension {i} of size {mesh.size(i)}: each rank needs whole heads, as many query heads "
                             "per key/value head as the model")
        even = even and not (p.is_shard(0) and q.shape[0] % mesh.size(i))
    if options["block_mask"] is not None:
        raise ValueError("a block_mask with DTensor q, k, v: build it for the local heads and rows and call attention "
                         "on the local tensors (DTensor.to_local)")
    local = dict(options)
    # where q's batch (0) and heads (1) dims sit in each tensor, counted from its end as broadcasting does
    for name, where in (("mask", (-4, -3)), ("alibi_slopes", (None, -1)), ("seq_ids", (-2, None))):
        t = local[name]
        if t is None:
            continue
        if is_dtensor(t):
            raise ValueError(f"{name} must be a plain tensor every rank holds whole (got a DTensor)")
        for i, p in enumerate(placements):
            at = where[p.dim] if p.is_shard() else None
            if at is not None and t.dim() >= -at and t.shape[at] > 1:
                t = t.chunk(mesh.size(i), at)[mesh.get_local_rank(i)]
        local[name] = t
    out = attention(q.to_local(), k.to_local(), v.to_local(), **local)
    if even:  # the global shape and strides follow from the local tensor's
        return DTensor.from_local(out, mesh, placements, run_check=False)
    shape = torch.Size((*q.shape[:3], v.shape[-1]))
    return DTensor.from_local(out.contiguous(), mesh, placements, run_check=False, shape=shape,
                              stride=torch.empty(shape, device="meta").stride())
