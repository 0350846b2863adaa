"""One rank's part of the vocabulary-parallel loss (ops/cross_entropy/vocab_parallel.py) against the reference:
the stats and gradient kernels on every shard of an uneven split (ranks simulated in one process: each
shard's statistics stacked and reduced as the all-reduces would), and the chunked forward and backward of
a group of one against the unsharded fused loss, every reduction and option, a partial last chunk."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops.cross_entropy import FusedLinearArgs, scale_grad_
from kernel_pytorch.ops.cross_entropy import vocab_parallel as K
from kernel_pytorch.reference import vocab_parallel_cross_entropy as VP
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.reference.cross_entropy import row_scales
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.cross_entropy_helpers import IGNORE, upstream
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
N, H, V = 9, 8, 37

OPTIONS = {
    "plain": ("mean", {}),
    "smoothing+zloss": ("sum", {"label_smoothing": 0.1, "lse_square_scale": 1e-2}),
    "everything": ("none", {"label_smoothing": 0.05, "lse_square_scale": 1e-3, "softcap": 3.0}),
}


def _stacked(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    stack = torch.stack(parts)
    return stack.amax(0) if op == "max" else stack.sum(0)


@pytest.mark.parametrize("world", [1, 4, 9])
@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_kernels_over_shards_match_the_unsharded_loss(case: str, world: int) -> None:
    """Each shard's stats kernel, the statistics reduced over the shards, then each shard's gradient kernel:
    the unsharded loss's rows and logits gradient (37 classes over 9 ranks: 5, ..., 5, 2, 0)."""
    reduction, opts = OPTIONS[case]
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    logits = randn(N, V, device=DEV, scale=3.0)
    logits[2, :5] = float("-inf")  # masked classes, one shard's whole row among them
    t = torch.randint(0, V, (N,), device=DEV)
    t[[1, 5]] = IGNORE
    shards = [VP.shard_range(V, world, r) for r in range(world)]
    parts = [logits[:, s.start:s.start + s.size] for s in shards]
    with Poisoned():
        stats = [K.launch_stats(p, t, s, o) for p, s in zip(parts, shards)]
    for p, s, got in zip(parts, shards, stats):
        expected = VP.shard_stats(VP.apply_softcap(p, o.softcap), t, s, o)
        valid = t != IGNORE  # the kernel leaves ignored rows' statistics at -inf, 0, 0, 0
        assert_close(got[:, valid], expected[:, valid], f"stats of {s}")
    m = _stacked([st[0] for st in stats], "max")
    ref = torch.where(m == float("-inf"), 0.0, m)
    lse = ref + torch.log(_stacked([st[1] * torch.exp(st[0] - ref) for st in stats], "sum"))
    zt, total = _stacked([st[2] for st in stats], "sum"), _stacked([st[3] for st in stats], "sum")
    ce, zl = VP.row_terms(lse, zt, total, t, V, o)
    expected_rows = R.cross_entropy(logits, t, options=O(o.ignore_index, "none", o.label_smoothing,
                                                         o.lse_square_scale, o.softcap))
    assert_close(ce + zl, expected_rows, "loss rows")
    dloss = upstream(reduction, t)
    r, q = row_scales(dloss, t, None, o, torch.float32)
    with Poisoned():
        grads = []
        for p, s in zip(parts, shards):
            g = torch.empty_like(p)
            K.launch_grad(p.contiguous(), t, lse, r.contiguous(), q.contiguous(), g, s, o)
            grads.append(g)
    assert_close(torch.cat(grads, 1), R.cross_entropy_backward(dloss, logits, t, options=o), "logits gradient")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_chunked_rank_of_a_group_of_one(case: str, dtype: torch.dtype) -> None:
    """vocab_parallel_fwd / _bwd with the identity all-reduce: the fused loss's loss and gradients, three chunks
    of four rows (the last of one), a bias and token scales."""
    reduction, opts = OPTIONS[case]
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    x = randn(N, H, dtype=dtype, device=DEV)
    w = randn(V, H, dtype=dtype, device=DEV, scale=H ** -0.5)
    b = randn(V, dtype=dtype, device=DEV, scale=0.1)
    t = torch.randint(0, V, (N,), device=DEV)
    t[[0, 7]] = IGNORE
    u = torch.rand(N, device=DEV) + 0.5
    shard = VP.shard_range(V, 1, 0)
    args = FusedLinearArgs(w, t, b, None, u)
    dloss = upstream(reduction, t)
    with Poisoned():
        out = K.vocab_parallel_fwd(x, args, shard, VP.no_reduce, o, chunk=4)
        if reduction == "none":
            assert out.grad_x is None
            grads = K.vocab_parallel_bwd(dloss, x, args, shard, out.lse, o, chunk=4)
        else:
            grads = tuple(scale_grad_(g, dloss) for g in out[2:5])
    kw = dict(options=o, token_scale=u)
    assert_close(out.loss, R.fused_linear_cross_entropy(x, w, t, b, **kw), "loss")
    for name, got, expected in zip(("grad_x", "grad_w", "grad_b"), grads,
                                   R.fused_linear_cross_entropy_backward(dloss, x, w, t, b, **kw)):
        assert_close(got, expected, name)


def test_rank_without_classes() -> None:
    """A rank holding no class (5 classes over 4 ranks: 2, 2, 1, 0) gives -inf / 0 statistics and empty gradients."""
    x, t = randn(3, H, device=DEV), torch.tensor([0, 4, IGNORE], device=DEV)
    shard = VP.shard_range(5, 4, 3)
    assert shard == VP.VocabShard(5, 0, 5, 2)
    args = FusedLinearArgs(torch.empty(0, H, device=DEV), t)
    out = K.vocab_parallel_fwd(x, args, shard, VP.no_reduce, O(ignore_index=IGNORE))
    assert out.grad_w.shape == (0, H)
    assert torch.equal(out.grad_x, torch.zeros_like(x))
