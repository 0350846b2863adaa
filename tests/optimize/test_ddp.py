"""`optimize()` then DistributedDataParallel, unchanged: DDP all-reduces the gradients of the same Parameter
objects the optimized modules hold. Each rank's gradients after each step equal those of the original model
trained in one process on both ranks' batches (the mean of their losses, which is what DDP's averaged
gradient is the gradient of), and so do the parameters after the steps (kernel_pytorch.optim.AdamW on the
DDP model, torch's AdamW on the single process).

Two processes on CPU with gloo (tests/distributed.py); the NCCL variants need 1 or 2 GPUs.
"""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.optim import AdamW
from kernel_pytorch.tolerances import compare
from tests.distributed import Ctx, check, run_world
from tests.optimize.sharded import MODELS, adam_kernel_on_cpu, example, ids, loss

WORLD = 2
TIMEOUT_S = 120
STEPS = 2


def _assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message(name)


def ddp_matches_single_process(ctx: Ctx) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    for kind in MODELS:
        model, report = kp.optimize(MODELS[kind](0).to(ctx.device), example(MODELS[kind](0), ctx.device),
                                    compile=False)
        assert report.passed and report.applied(), report
        ddp = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        single = MODELS[kind](0).to(ctx.device)
        opt = AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.1)
        ref = torch.optim.AdamW(single.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
        for step in range(STEPS):
            loss(ddp, ids(ctx.rank, step, ctx.device)).backward()
            sum(loss(single, ids(r, step, ctx.device)) for r in range(ctx.world)).div(ctx.world).backward()
            for (name, p), q in zip(model.named_parameters(), single.parameters(), strict=True):
                _assert_close(f"step {step} grad {name}", p.grad, q.grad)
            for o in (opt, ref):
                o.step()
                o.zero_grad(set_to_none=True)
        for (name, p), q in zip(model.named_parameters(), single.parameters(), strict=True):
            _assert_close(name, p, q)
    assert LAUNCHES == [True] * STEPS * len(MODELS) or ctx.device.type != "cpu", LAUNCHES

SCENARIOS = ("ddp_matches_single_process",)
LAUNCHES: list[bool] = []


def setup_rank(ctx: Ctx) -> None:
    adam_kernel_on_cpu(ctx.device, LAUNCHES)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path_factory.mktemp("ddp"), timeout_s=TIMEOUT_S)


def test_optimize_then_ddp_matches_one_process(outcomes) -> None:
    check(outcomes["ddp_matches_single_process"])


@pytest.mark.cuda
@pytest.mark.parametrize("world", [1, 2])
def test_optimize_then_ddp_nccl(tmp_path, world: int) -> None:
    got = run_world(__name__, SCENARIOS, world=world, tmp=tmp_path, backend="nccl", timeout_s=TIMEOUT_S)
    check(got["ddp_matches_single_process"])
