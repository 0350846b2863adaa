"""Token embedding, torch.nn.functional.embedding semantics, and its gradient as a segment sum.

For weight (V, H) and integer indices of any shape (N tokens in all):

    y = weight[indices]                                          # shape indices.shape + (H,)
    dweight[v] = sum over tokens n with indices[n] == v of dy[n]  # fp32 (fp64 for fp64), rounded once
    dweight[padding_idx] = 0;  with scale_grad_by_freq, dweight[v] /= count(v)

Summed in a fixed order this is deterministic: sort the indices (stably), so each vocabulary row v owns
the contiguous run order[bounds[v]:bounds[v + 1]] of the sorted tokens, and sum each run from its start.
That is what the kernel does (ops/embedding.py), one program per row, no atomics. Accumulating with
index_add_ or float atomics instead (index_add_ on CUDA does) makes low-precision gradients differ
between runs; whether torch's own CUDA embedding backward is bitwise-reproducible at the benchmark
shape is measured by benchmarks/probes/probe_rope.py (section embedding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernel_pytorch.reference._math import acc_dtype


def embedding(
    indices: Tensor, weight: Tensor, padding_idx: int | None = None, scale_grad_by_freq: bool = False
) -> Tensor:
    """weight[indices]: indices.shape + (H,) of weight's dtype. padding_idx and scale_grad_by_freq shape
    the gradient autograd gives weight (torch's, as `embedding_backward` specifies it)."""
    return F.embedding(indices, weight, padding_idx, scale_grad_by_freq=scale_grad_by_freq)


def segments(indices: Tensor, num_embeddings: int) -> tuple[Tensor, Tensor]:
    """The sorted view of the tokens: `order` (N,) int64, token ids sorted by index (stable, so ties keep
    token order), and `bounds` (V + 1,) int64, row v's tokens being order[bounds[v]:bounds[v + 1]]."""
    flat = indices.reshape(-1)
    sorted_idx, order = torch.sort(flat, stable=True)
    queries = torch.arange(num_embeddings + 1, device=flat.device, dtype=sorted_idx.dtype)
    return order, torch.searchsorted(sorted_idx, queries)


def embedding_backward(
    dy: Tensor, indices: Tensor, num_embeddings: int, padding_idx: int | None = None,
    scale_grad_by_freq: bool = False, out_dtype: torch.dtype | None = None,
) -> Tensor:
    """Gradient of `embedding` with respect to weight.

    Args:
        dy: indices.shape + (H,) upstream gradient.
        indices: integer tensor, values in [0, num_embeddings).
        padding_idx: a row whose gradient is zero (negative counts from the end, as in torch).
        scale_grad_by_freq: divide each row by how many tokens hit it.
        out_dtype: dtype of the result (default dy's; fp32 for fp32 master gradients).
    Returns:
        (num_embeddings, H): sums in fp32 (fp64 for fp64), one rounding to out_dtype.
    """
    h = dy.shape[-1]
    flat = indices.reshape(-1)
    total = torch.zeros(num_embeddings, h, dtype=acc_dtype(dy.dtype), device=dy.device)
    # on CPU index_add_ adds in token order: the fixed-order sum this function specifies
    total.index_add_(0, flat, dy.reshape(-1, h).to(total.dtype))
    if scale_grad_by_freq:
        counts = torch.bincount(flat, minlength=num_embeddings).clamp_min(1)
        total = total / counts[:, None].to(total.dtype)
    if padding_idx is not None:
        total[padding_idx % num_embeddings] = 0
    return total.to(out_dtype or dy.dtype)
