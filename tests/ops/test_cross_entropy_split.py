"""The split-row cross-entropy kernel (ops/_cross_entropy_split.py): rows split over programs of a few
columns, against the reference, on the edge cases of the merge (bad targets, -inf chunks, ignored
rows), its one-launch rendezvous, when it is chosen, and how it divides a row. Every option and
reduction also runs through it in test_cross_entropy_kernels.py (the `block_path` "split" case)."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import cross_entropy as ce_ops
from kernel_pytorch.ops._cross_entropy_split import SplitLaunch, split_shape
from kernel_pytorch.ops._row_view import contiguous_rows
from kernel_pytorch.ops.cross_entropy import CrossEntropyOptions, cross_entropy_fwd
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
IGNORE = -100


@pytest.fixture(params=[0, 2], ids=["rendezvous", "pipelined"])
def split4(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Rows split into 4-column parts, by the rendezvous kernel or the pipelined one (groups of 2 rows);
    the list records each launch's (kernel, grid, SPLIT, PHASE or GROUP)."""
    monkeypatch.setattr(ce_ops, "SPLIT_LAUNCH", SplitLaunch(chunk=4, num_warps=1, group=request.param))
    calls: list[tuple] = []
    for name, key in (("_split_kernel", "PHASE"), ("_pipe_kernel", "GROUP")):
        real = getattr(ce_ops, name)

        def spy(grid, *args, real=real, name=name, key=key, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            calls.append((name, grid, kw["SPLIT"], kw[key]))
            return real(grid, *args, **kw)

        monkeypatch.setattr(ce_ops, name, spy)
    return calls


def test_split_is_chosen_for_wide_rows_with_a_gradient(split4: list[tuple]) -> None:
    """Rows wider than a chunk with a gradient: 9 columns in 4-column parts are 3 programs a row; on
    CPU the rendezvous kernel's partials and gradient are two launches, the pipelined kernel one
    launch of persistent programs. Loss only, or one chunk a row: not used."""
    logits, target = randn(5, 9, device=DEV), torch.randint(0, 9, (5,), device=DEV)
    out = cross_entropy_fwd(logits, target)
    if split4[0][0] == "_split_kernel":
        assert [c[1:3] for c in split4] == [((15,), 3)] * len(split4)
        assert [c[3] for c in split4] == ([0] if DEV == "cuda" else [1, 2])
    else:
        assert len(split4) == 1 and split4[0][2:] == (3, 2)
    assert_close(out.grad, R.cross_entropy_backward(torch.ones((), device=DEV), logits, target), "grad")
    split4.clear()
    cross_entropy_fwd(logits, target, with_grad=False)
    cross_entropy_fwd(logits[:, :4].contiguous(), target % 4)
    assert split4 == []


def test_bad_targets_nan_rows_only(split4: list[tuple]) -> None:
    """An out-of-range target makes its row NaN in every part; the target's logit of a good row comes
    from whichever part holds it (first, middle and last chunk)."""
    logits = randn(5, 11, device=DEV)
    target = torch.tensor([0, 11, 6, -2, 10], device=DEV)
    out = cross_entropy_fwd(logits, target, reduction="none")
    assert split4
    assert torch.isnan(out.loss[[1, 3]]).all() and torch.isnan(out.grad[[1, 3]]).all()
    good = torch.tensor([0, 2, 4])
    assert_close(out.loss[good], R.cross_entropy(logits[good], target[good], reduction="none"), "loss")
    assert_close(out.grad[good], R.cross_entropy_backward(torch.ones(3, device=DEV), logits[good], target[good],
                                                          reduction="none"), "grad")


def test_masked_chunks_and_ignored_rows(split4: list[tuple]) -> None:
    """A part whose logits are all -inf adds nothing (not NaN); a row of only -inf is NaN as in torch;
    ignored rows get zeros, and a batch of only ignored rows has torch's NaN mean."""
    logits = randn(4, 12, device=DEV)
    logits[0, 4:8] = float("-inf")
    logits[1, :8] = float("-inf")
    logits[2] = float("-inf")
    target = torch.tensor([1, 9, 3, IGNORE], device=DEV)
    out = cross_entropy_fwd(logits, target, reduction="none", ignore_index=IGNORE)
    expected = torch.nn.functional.cross_entropy(logits.cpu(), target.cpu(), reduction="none", ignore_index=IGNORE)
    assert_close(out.loss[:2], expected[:2].to(DEV), "rows with masked chunks")
    assert torch.isnan(out.loss[2]) and out.loss[3] == 0 and torch.equal(out.grad[3], torch.zeros(12, device=DEV))
    assert_close(out.grad[:2], R.cross_entropy_backward(torch.ones(2, device=DEV), logits[:2], target[:2],
                                                        reduction="none"),
                 "grad with masked chunks")
    none = cross_entropy_fwd(logits, torch.full((4,), IGNORE, device=DEV), ignore_index=IGNORE)
    assert torch.isnan(none.loss) and torch.equal(none.grad, torch.zeros_like(logits))



def test_one_launch_rendezvous_with_one_part() -> None:
    """PHASE 0, the CUDA path (ticket, publish, wait, merge), launched directly: with one part a row
    the wait ends at once, so it also runs in the CPU interpreter; the tickets all get taken."""
    n, v = 6, 10
    logits, target = randn(n, v, device=DEV), torch.randint(0, v, (n,), device=DEV)
    loss, lse = torch.empty(n, device=DEV), torch.empty(n, device=DEV)
    grad = torch.empty_like(logits)
    sync = torch.zeros(1 + n, dtype=torch.int32, device=DEV)
    part = torch.empty(n * 4, device=DEV)
    rows, g_rows = contiguous_rows(logits), contiguous_rows(grad)
    opts = CrossEntropyOptions(reduction="sum")
    ce_ops._split_kernel((n,), rows.tensor, target, lse, lse, loss, lse, g_rows.tensor, part, sync, v, *rows.args,
                         *g_rows.args, *opts.scalars(), CHUNK=16, SPLIT=1, SPLIT_P2=1, PHASE=0, TICKET=True,
                         PRECISE=False, num_warps=1, eager=True, **opts.flags(None))
    assert sync[0] == n and torch.equal(sync[1:], torch.ones(n, dtype=torch.int32, device=DEV))
    assert_close(loss, R.cross_entropy(logits, target, reduction="none"), "loss rows")
    assert_close(grad, R.cross_entropy_backward(torch.ones((), device=DEV), logits, target, reduction="sum"), "grad")


def test_split_shape_bounds() -> None:
    launch = SplitLaunch(chunk=16384, num_warps=16, max_split=64)
    assert split_shape(128256, launch, 132) == (16384, 8)
    assert split_shape(262144, launch, 132) == (16384, 16)
    assert split_shape(20000, launch, 132) == (16384, 2)
    assert split_shape(1000, launch, 132) == (1024, 1)
    assert split_shape(2_000_000, launch, 132) is None  # more parts than max_split
    assert split_shape(128256, launch, 4) is None  # more parts than programs surely resident at once
