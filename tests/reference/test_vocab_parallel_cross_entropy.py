"""The vocabulary-parallel reference (reference/vocab_parallel_cross_entropy.py) in one process: ranks as
threads whose all-reduces meet at a barrier, each holding its rows of the head, against the unsharded fused
loss in fp64: loss and gradients (the ranks' grad_x terms summed, their weight rows concatenated), uneven
and empty shards, chunks, every reduction and option, all rows ignored; and torch's Shard(0) split."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.reference import vocab_parallel_cross_entropy as VP
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from kernel_pytorch.tolerances import compare
from tests.grid import randn

IGNORE = -100
N, H, V = 11, 8, 37

CASES = {
    "mean": ("mean", {}),
    "smoothing+zloss+softcap": ("mean", {"label_smoothing": 0.1, "lse_square_scale": 1e-2, "softcap": 3.0}),
    "sum+smoothing": ("sum", {"label_smoothing": 0.2}),
    "none+zloss": ("none", {"lse_square_scale": 0.1}),
}


class ThreadGroup:
    """`world` threads whose `reduce` calls meet: each deposits its tensor, all combine all of them."""

    def __init__(self, world: int) -> None:
        self.world, self.slots = world, [None] * world
        self.deposited, self.read = threading.Barrier(world), threading.Barrier(world)

    def reduce_for(self, rank: int) -> VP.Reduce:
        def reduce(t: torch.Tensor, op: str) -> torch.Tensor:
            self.slots[rank] = t
            self.deposited.wait()
            stack = torch.stack(self.slots)
            out = stack.amax(0) if op == "max" else stack.sum(0)
            self.read.wait()
            return out

        return reduce

    def run(self, fn: Callable[[int, VP.Reduce], object]) -> list:
        out, errors = [None] * self.world, []

        def work(rank: int) -> None:
            try:
                out[rank] = fn(rank, self.reduce_for(rank))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)
                self.deposited.abort()
                self.read.abort()

        threads = [threading.Thread(target=work, args=(r,)) for r in range(self.world)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        if errors:
            raise errors[0]
        return out


@pytest.mark.parametrize("world", [1, 2, 4, 5, 40])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_ranks_match_the_unsharded_loss(case: str, world: int) -> None:
    reduction, opts = CASES[case]
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    dt = torch.float64
    x, w, b = randn(N, H, dtype=dt), randn(V, H, dtype=dt), randn(V, dtype=dt, scale=0.1)
    t = torch.randint(0, V, (N,))
    t[[1, 4]] = IGNORE
    u = torch.rand(N, dtype=dt) + 0.5
    dloss = torch.rand(t.shape if reduction == "none" else (), dtype=dt) + 0.5

    def rank_fn(rank: int, reduce: VP.Reduce) -> tuple:
        s = VP.shard_range(V, world, rank)
        rows = slice(s.start, s.start + s.size)
        kw = dict(shard=s, options=o, token_scale=u)
        loss, lse = VP.vocab_parallel_linear_cross_entropy(x, w[rows], t, b[rows], reduce=reduce, chunk=4, **kw)
        return loss, VP.vocab_parallel_linear_cross_entropy_backward(dloss, x, w[rows], t, lse, b[rows], chunk=3, **kw)

    outs = ThreadGroup(world).run(rank_fn)
    kw = dict(options=o, token_scale=u)
    expected = R.fused_linear_cross_entropy(x, w, t, b, **kw)
    dx, dw, db = R.fused_linear_cross_entropy_backward(dloss, x, w, t, b, **kw)
    for loss, _ in outs:
        assert compare(loss, expected).passed, compare(loss, expected).message("loss")
    got = (sum(g[0] for _, g in outs), torch.cat([g[1] for _, g in outs]), torch.cat([g[2] for _, g in outs]))
    for name, a, e in zip(("grad_x", "grad_w", "grad_b"), got, (dx, dw, db)):
        assert compare(a, e).passed, compare(a, e).message(name)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_rows_ignored(reduction: str) -> None:
    """torch's answer: "mean" 0/0 = NaN, "sum" 0, and a zero gradient."""
    o = O(ignore_index=IGNORE, reduction=reduction, lse_square_scale=1e-2)
    x, w, t = randn(3, H, dtype=torch.float64), randn(V, H, dtype=torch.float64), torch.full((3,), IGNORE)

    def rank_fn(rank: int, reduce: VP.Reduce) -> tuple:
        s = VP.shard_range(V, 2, rank)
        rows = slice(s.start, s.start + s.size)
        loss, lse = VP.vocab_parallel_linear_cross_entropy(x, w[rows], t, reduce=reduce, shard=s, options=o)
        return loss, VP.vocab_parallel_linear_cross_entropy_backward(torch.ones_like(loss), x, w[rows], t, lse,
                                                                     shard=s, options=o)

    for loss, (dx, dw, _) in ThreadGroup(2).run(rank_fn):
        assert torch.isnan(loss) if reduction == "mean" else loss == 0
        assert not dx.any() and not dw.any()


@pytest.mark.parametrize("vocab, world", [(37, 2), (37, 4), (5, 4), (40, 40), (8, 3)])
def test_shard_range_is_torchs_shard0_split(vocab: int, world: int) -> None:
    """torch.chunk's split (what DTensor's Shard(0) gives each rank)."""
    chunks = torch.arange(vocab).chunk(world)
    for rank in range(world):
        s = VP.shard_range(vocab, world, rank)
        expected = chunks[rank] if rank < len(chunks) else torch.arange(0)
        assert s.size == expected.numel() and (s.size == 0 or s.start == int(expected[0])), (rank, s)
        assert s.widest == max(c.numel() for c in chunks)
