"""FlexAttention pieces for functional/attention.py: the mask_mod and score_mod of each option, block
masks (built once per shape and cached where the mask depends only on the shape), and the call.

A block mask records, per (query block, key block) tile of 128 x 128, whether the tile is empty, full
or partial, so the kernel skips empty tiles: a causal mask halves the work, 8 documents of 512 tokens in
4096 leave 1/8 of it. Causal, sliding-window and document masks are built from each query's interval of
allowed keys (`_range_block_mask`): a few ops on the (B, K) ids and the (Q / 128, K / 128) tiles, on the
device, without the Q x K mask or a host sync, so documents can change every call (packed batches) and
the build is captured in CUDA graphs and traced by torch.compile. An eager caller's document mask on
CUDA is built by those ops compiled (`_compiled_range_tensors`): their launches cost more host time
than the sparse kernel saves otherwise. Masks that depend only on the lengths
are also cached per (lengths, device). A user's boolean or padding mask is evaluated over Q x K
(create_block_mask) once per call: build one with `block_mask(...)` and pass it to every layer to build
it once per batch.

torch 2.13 runs FlexAttention on CPU through the same Python front end: forward only (it raises for
inputs that require grad), unfused in eager (it materialises the scores), fused under torch.compile
(which takes about a minute on CPU for the first shape). On CUDA the eager path compiles
flex_attention once (`_compiled_flex`) so an uncompiled caller still gets the fused kernel.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from kernel_pytorch._env import log_once
from kernel_pytorch._errors import short_error


def _mask_mod(
    q_len: int, kv_len: int, *, is_causal: bool, window: int | None, seq_ids: Tensor | None, keep: Tensor | None,
) -> Callable | None:
    """mask_mod(b, h, q_idx, kv_idx) -> bool for the options given (None when nothing is masked).

    keep: a boolean (B, H, Q, K) view (expanded, never copied) of a user's or padding mask."""
    offset = kv_len - q_len  # queries are end-aligned with the keys (reference/attention.py)
    causal = is_causal or window is not None

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        allowed = kv_idx >= 0
        if causal:
            allowed = allowed & (kv_idx <= pos)
        if window is not None:
            allowed = allowed & (pos - kv_idx < window)
        if seq_ids is not None:
            allowed = allowed & (seq_ids[b, pos] == seq_ids[b, kv_idx])
        if keep is not None:
            allowed = allowed & keep[b, h, q_idx, kv_idx]
        return allowed

    if not causal and seq_ids is None and keep is None:
        return None
    return mask_mod


def score_mod(
    q_len: int, kv_len: int, *, softcap: float | None, alibi_slopes: Tensor | None, bias: Tensor | None,
) -> Callable | None:
    """score_mod(score, b, h, q_idx, kv_idx) applying soft-capping, ALiBi and an additive bias (B, H, Q, K)
    view in the reference's order; None when there is nothing to apply."""
    if softcap is None and alibi_slopes is None and bias is None:
        return None
    offset = kv_len - q_len

    def mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if alibi_slopes is not None:
            score = score + alibi_slopes[h] * (kv_idx - q_idx - offset)
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return mod


_BLOCK = 128  # FlexAttention's default tile (create_block_mask's BLOCK_SIZE)


def _run_starts(ids: Tensor) -> Tensor:
    """(B, K) -> (B, K): the position where each token's run of equal ids begins."""
    new_run = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), ids[:, 1:] != ids[:, :-1]], dim=1)
    positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    return torch.where(new_run, positions, 0).cummax(dim=1).values


def _key_bounds(rows: Tensor, q_len: int, kv_len: int, *, causal: bool, window: int | None,
                seq_ids: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The allowed keys of the queries `rows` (R,) as intervals: lo, hi (B, R), and exact (B, 1): False
    for a batch row whose documents are not contiguous (an id in two runs), where [lo, hi] is only the
    causal / window bound.

    With contiguous documents the query at position p sees [max(start(p), p - window + 1), min(end(p), p)]
    (its document's run, cut by the window and causality): one interval, never empty (p sees itself),
    and lo, hi never decrease with p."""
    pos = rows + (kv_len - q_len)  # queries are end-aligned with the keys
    lo = (pos - window + 1).clamp_min(0) if window is not None else torch.zeros_like(pos)
    hi = pos if causal else torch.full_like(pos, kv_len - 1)
    if seq_ids is None:
        return lo[None], hi[None], torch.ones(1, 1, dtype=torch.bool, device=rows.device)
    both = _run_starts(torch.cat([seq_ids, seq_ids.flip(1)]))  # run ends are the reversed row's starts
    start, end = both[: len(seq_ids), pos], kv_len - 1 - both[len(seq_ids):].flip(1)[:, pos]
    # contiguous documents <=> as many runs as distinct ids (never fewer runs than ids)
    runs = (seq_ids[:, 1:] != seq_ids[:, :-1]).sum(1)
    ordered = seq_ids.sort(dim=1).values
    exact = (runs == (ordered[:, 1:] != ordered[:, :-1]).sum(1))[:, None]
    return torch.where(exact, torch.maximum(lo, start), lo), torch.where(exact, torch.minimum(hi, end), hi), exact


def _ordered(dense: Tensor) -> tuple[Tensor, Tensor]:
    """(..., rows, cols) 0/1 -> the count per row and the column order create_block_mask stores: the
    listed columns first, then the others, each group ascending (int32, contiguous as the kernels read them)."""
    order = dense.argsort(dim=-1, descending=True, stable=True)
    return dense.sum(-1, dtype=torch.int32), order.to(torch.int32, memory_format=torch.contiguous_format)


def _range_tensors(q_len: int, kv_len: int, is_causal: bool, window: int | None, seq_ids: Tensor | None,
                   device: torch.device) -> tuple[Tensor, ...]:
    """The eight index tensors of `_range_block_mask`'s BlockMask (kv_num_blocks, kv_indices, full_kv_*,
    q_num_blocks, q_indices, full_q_*), from the queries' key intervals."""
    n_q, n_kv = -(-q_len // _BLOCK), -(-kv_len // _BLOCK)
    first = torch.arange(n_q, device=device) * _BLOCK
    last = (first + _BLOCK).clamp_max(q_len) - 1
    lo, hi, exact = _key_bounds(torch.cat([first, last]), q_len, kv_len, causal=is_causal or window is not None,
                                window=window, seq_ids=seq_ids)
    lo_first, lo_last = lo[:, :n_q, None], lo[:, n_q:, None]
    hi_first, hi_last = hi[:, :n_q, None], hi[:, n_q:, None]
    kv_first = torch.arange(n_kv, device=device) * _BLOCK
    kv_last = kv_first + _BLOCK - 1  # past kv_len for a short last block, which is never full
    some = (kv_last >= lo_first) & (kv_first <= hi_last)  # (B, n_q, n_kv)
    whole = (kv_first >= lo_last) & (kv_last <= hi_first) & exact[:, :, None] & (first + _BLOCK <= q_len)[:, None]
    tiles = torch.stack([some & ~whole, whole])[:, :, None].int()  # partial, full: (2, B, 1, n_q, n_kv)
    (kv_num, full_kv_num), (kv_idx, full_kv_idx) = _ordered(tiles)
    # the backward's view (key block -> query blocks), as from_kv_blocks derives it
    (q_num, full_q_num), (q_idx, full_q_idx) = _ordered(tiles.transpose(-2, -1))
    return kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx


@functools.cache
def _compiled_range_tensors() -> Callable:
    # eager callers with documents build a mask every call: ~40 small ops whose launches cost more host
    # time than the sparse kernel saves (1.9 ms against 0.5 ms of kernels on an H200, B 4, S 4096);
    # compiled they are a few fused kernels behind one guard check
    return torch.compile(_range_tensors)


def _range_block_mask(q_len: int, kv_len: int, *, is_causal: bool, window: int | None, seq_ids: Tensor | None,
                      mask_mod: Callable, device: torch.device | str) -> BlockMask:
    """The BlockMask of causal / window / document masks from the queries' key intervals: a few ops
    over (B, K) ids and (B, Q / 128, K / 128) tiles on the device, no Q x K mask and no host sync;
    the same tensors as create_block_mask's. Document masks built by an eager caller on CUDA run those
    ops compiled (`_compiled_range_tensors`), falling back to eager ops, with a log line, if that fails.

    A query block's intervals join into [lo(first query), hi(last query)] (each query sees itself, so
    neighbours' intervals touch): its non-empty key blocks. A key block is full when it lies inside every
    query's interval, [lo(last query), hi(first query)], and the query block lies inside q_len (padded
    rows are masked). Rows with non-contiguous documents keep the causal / window tiles, all partial."""
    device = torch.device(device)
    tensors = None
    if seq_ids is not None and device.type in COMPILED_BUILD and not torch.compiler.is_compiling() \
            and not _compile_failed:
        try:
            tensors = _compiled_range_tensors()(q_len, kv_len, is_causal, window, seq_ids, device)
        except Exception as err:  # Inductor's errors have no common base; the eager ops give the same mask
            _compile_failed.append(err)
            log_once(f"kernel_pytorch.attention: compiling the document block mask failed "
                     f"({short_error(err, 200, lines=1)}); building it with eager ops", logging.WARNING)
    if tensors is None:
        tensors = _range_tensors(q_len, kv_len, is_causal, window, seq_ids, device)
    kv_num, kv_idx, full_kv_num, full_kv_idx, q_num, q_idx, full_q_num, full_q_idx = tensors
    return BlockMask(
        seq_lengths=(q_len, kv_len), kv_num_blocks=kv_num, kv_indices=kv_idx, full_kv_num_blocks=full_kv_num,
        full_kv_indices=full_kv_idx, q_num_blocks=q_num, q_indices=q_idx, full_q_num_blocks=full_q_num,
        full_q_indices=full_q_idx, BLOCK_SIZE=(_BLOCK, _BLOCK), mask_mod=mask_mod,
    )


COMPILED_BUILD = ("cuda",)  # device types whose eager document masks are built by the compiled ops
_compile_failed: list[Exception] = []  # the compiled build's error, once it failed: eager from then on


@functools.lru_cache(maxsize=64)
def _shape_block_mask(is_causal: bool, window: int | None, q_len: int, kv_len: int, device: str) -> BlockMask:
    mod = _mask_mod(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=None, keep=None)
    return _range_block_mask(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=None, mask_mod=mod,
                             device=device)


def block_mask(
    q_len: int, kv_len: int, *, is_causal: bool = False, window: int | None = None,
    seq_ids: Tensor | None = None, keep: Tensor | None = None, batch: int | None = None,
    heads: int | None = None, device: torch.device | str = "cpu",
) -> BlockMask | None:
    """The BlockMask of the options (None when nothing is masked). Shape-only masks come from a cache;
    causal, window and document masks are built from each query's key interval (`_range_block_mask`),
    a user's boolean mask by evaluating it over Q x K (create_block_mask).

    Args:
        q_len, kv_len: query and key lengths.
        is_causal, window, seq_ids: as in reference/attention.py; seq_ids (B, K).
        keep: boolean (B, H, Q, K) (an expanded view is fine).
        batch, heads: the mask's B and H (None: the same for every batch row / head).
    """
    if seq_ids is None and keep is None:
        if not is_causal and window is None:
            return None
        if not torch.compiler.is_compiling():
            return _shape_block_mask(is_causal, window, q_len, kv_len, str(torch.device(device)))
    mod = _mask_mod(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=seq_ids, keep=keep)
    if keep is None:
        return _range_block_mask(q_len, kv_len, is_causal=is_causal, window=window, seq_ids=seq_ids,
                                 mask_mod=mod, device=device)
    if seq_ids is not None:
        batch = seq_ids.shape[0]
    return create_block_mask(mod, batch, heads, q_len, kv_len, device=device)


@functools.cache
def _compiled_flex() -> Callable:
    # the fused kernel exists only through torch.compile; compiled once, shapes are static
    return torch.compile(flex_attention, dynamic=False)


def flex(
    q: Tensor, k: Tensor, v: Tensor, *, mask: BlockMask | None, score: Callable | None, scale: float | None,
) -> Tensor:
    """flex_attention with GQA by enable_gqa (no repeated K/V); the compiled kernel on CUDA in eager."""
    gqa = False
    if q.shape[1] != k.shape[1]:  # a branch: with dynamic shapes the comparison is a SymBool (see _sdpa)
        gqa = True
    kwargs = dict(score_mod=score, block_mask=mask, scale=scale, enable_gqa=gqa)
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        return run_fused(_compiled_flex(), q, k, v, **kwargs)
    return flex_attention(q, k, v, **kwargs)


# Smaller tiles for the fused kernel where Inductor's default configs need more shared memory than the
# GPU has: torch 2.11 picked one needing 245760 B of the H100's 232448 for a bf16, head_dim 64 forward
# ("No valid triton configs ... out of resource"). 64 and 32 divide the 128-token mask blocks.
SMALL_TILES = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1,
               "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32}
_small_tiles: set[tuple] = set()  # (dtype, head dims, score_mod or not) whose default tiles did not fit


def _out_of_shared_memory(err: Exception) -> bool:
    text = str(err)
    return "No valid triton configs" in text or "out of resource" in text


def run_fused(run: Callable, q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """`run` (the compiled flex_attention) with Inductor's default tiles, or SMALL_TILES where those
    do not fit in shared memory: retried once and remembered per dtype, head dims and score mod, with
    a log line. (A backward that alone does not fit is not caught here: it runs later, in autograd.)"""
    key = (q.dtype, q.shape[-1], v.shape[-1], kwargs.get("score_mod") is not None)
    if key in _small_tiles:
        return run(q, k, v, kernel_options=dict(SMALL_TILES), **kwargs)
    try:
        return run(q, k, v, **kwargs)
    except Exception as err:  # Inductor raises its own error types, which wrap the Triton one
        if not _out_of_shared_memory(err):
            raise
    _small_tiles.add(key)
    log_once(f"kernel_pytorch.attention: FlexAttention's default tiles need more shared memory than this GPU "
             f"has for {q.dtype} head_dim {q.shape[-1]}; using {SMALL_TILES}")
    return run(q, k, v, kernel_options=dict(SMALL_TILES), **kwargs)
