"""functional.vocab_parallel_linear_cross_entropy under torch.compile(fullgraph=True) across two processes (gloo
on CPU; NCCL where there are two GPUs): the functional all-reduces trace into the graph, and the compiled loss
and gradients are the eager ones. A module of its own: compiling costs most of its time.

The processes are spawned once by tests/distributed.py, under a timeout."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.functional import vocab_parallel_linear_cross_entropy
from kernel_pytorch.tolerances import compare_reordered
from tests.distributed import Ctx, check, run_world

TIMEOUT_S = 120
IGNORE = -100


def compiled_matches_eager(ctx: Ctx) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = ctx.mesh()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g).to(ctx.device)
    w = (torch.randn(37, 8, generator=g) * 8 ** -0.5).to(ctx.device)
    t = torch.randint(0, 37, (2, 5), generator=g).to(ctx.device)
    t[0, 1] = IGNORE

    def loss_fn(x, w, t):
        return vocab_parallel_linear_cross_entropy(x, w, t, ignore_index=IGNORE, label_smoothing=0.1,
                                                   lse_square_scale=1e-2)

    results = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        xs = x.clone().requires_grad_()
        wd = distribute_tensor(w.clone(), mesh, [Shard(0)]).requires_grad_()
        loss = fn(xs, wd, t)
        loss.backward()
        results.append((loss.detach(), xs.grad, wd.grad.to_local()))
    for name, compiled, eager in zip(("loss", "grad_x", "grad_w"), results[1], results[0]):
        result = compare_reordered(compiled, eager)
        assert result.passed, result.message(f"compiled {name}")


SCENARIOS = ("compiled_matches_eager",)


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=2, tmp=tmp_path_factory.mktemp("vpc"), timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def nccl2(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=2, tmp=tmp_path_factory.mktemp("vpcn"), timeout_s=TIMEOUT_S,
                     backend="nccl")


def test_compiled_world_of_2(world2) -> None:
    check(world2["compiled_matches_eager"])


@pytest.mark.cuda
def test_compiled_nccl_world_of_2(nccl2) -> None:
    check(nccl2["compiled_matches_eager"])
