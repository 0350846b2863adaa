"""Checkpoints of an optimized model sharded by FSDP2 (optimize, then torchtitan's recipe):

- torch.distributed.checkpoint (`dcp.save` / `dcp.load` of `get_state_dict(model, optimizer)`) saves the
  model and kernel_pytorch.optim.AdamW's state, sharded; a fresh optimized sharded model restored from it
  trains on exactly as the saved one does, and the unoptimized model with torch's AdamW restored from the
  same checkpoint trains on alike (the keys and the optimizer state layout are the original's);
- `kernel_pytorch.save` on every rank gathers the full tensors onto rank 0, which writes them with the
  manifest's `sharding`; `kernel_pytorch.load` rebuilds the unsharded optimized model from them, and loads
  them back into a sharded optimized model on every rank (rank 0 reads, each rank keeps its shard);
- failures on rank 0 (a sharded model that was not optimized before sharding, metadata that is not
  JSON-able) raise there with the reason and on the other ranks saying rank 0 failed, instead of hanging.

Two processes on CPU with gloo (tests/distributed.py), AdamW's kernel in Triton's interpreter; the NCCL
variants need 1 or 2 GPUs.
"""

from __future__ import annotations

import json

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.deploy import LoadError
from kernel_pytorch.optim import AdamW
from kernel_pytorch.tolerances import compare
from tests.distributed import Ctx, check, run_world
from tests.optimize.sharded import MODELS, adam_kernel_on_cpu, example, full, ids, loss, shard, train

WORLD = 2
TIMEOUT_S = 120
LR = 1e-3


def setup_rank(ctx: Ctx) -> None:
    adam_kernel_on_cpu(ctx.device)


def _optimized(kind: str, ctx: Ctx, seed: int = 0) -> tuple[torch.nn.Module, kp.optimize.OptimizeReport]:
    model = MODELS[kind](seed).to(ctx.device)
    model, report = kp.optimize(model, example(model, ctx.device), compile=False)
    assert report.passed and report.applied(), report
    return model, report


def _sharded(kind: str, ctx: Ctx, seed: int = 0, optimized: bool = True) -> torch.nn.Module:
    model = _optimized(kind, ctx, seed)[0] if optimized else MODELS[kind](seed).to(ctx.device)
    return shard(model, ctx.mesh(), checkpoint=kind == "hf")


def _same(a: torch.nn.Module, b: torch.nn.Module, exact: bool) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        if exact:
            assert torch.equal(full(p), full(q)), name
        else:
            assert (result := compare(full(p), full(q))).passed, result.message(name)


def dcp_round_trip(ctx: Ctx) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    for kind in MODELS:
        where = ctx.shared_dir / f"dcp-{kind}"
        model = _sharded(kind, ctx)
        opt = AdamW(model.parameters(), lr=LR, weight_decay=0.1)
        train(model, opt, ctx.rank, 3, device=ctx.device)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(where))
        expected = train(model, opt, ctx.rank, 3, first=3, device=ctx.device)

        for optimized in (True, False):  # into our model and AdamW, and into the original and torch's AdamW
            fresh = _sharded(kind, ctx, seed=1, optimized=optimized)
            fresh_opt = (AdamW(fresh.parameters(), lr=LR, weight_decay=0.1) if optimized else
                         torch.optim.AdamW(fresh.parameters(), lr=LR, weight_decay=0.1, foreach=True))
            msd, osd = get_state_dict(fresh, fresh_opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=str(where))
            set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            got = train(fresh, fresh_opt, ctx.rank, 3, first=3, device=ctx.device)
            # bitwise where the steps are deterministic: our model on CPU (CUDA's SDPA backward adds in no
            # fixed order); within tolerance otherwise
            exact = optimized and ctx.device.type == "cpu"
            if exact:
                assert got == expected, (got, expected)
            else:
                torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-5)
            _same(fresh, model, exact=exact)


def kp_save_load(ctx: Ctx) -> None:
    for kind in MODELS:
        where = ctx.shared_dir / f"kp-{kind}"
        model, report = _optimized(kind, ctx)
        model = shard(model, ctx.mesh(), checkpoint=kind == "hf")
        train(model, AdamW(model.parameters(), lr=LR), ctx.rank, 2, device=ctx.device)
        written = kp.save(model, where, report=report, metadata={"run": kind})
        assert (written != []) == (ctx.rank == 0), written  # rank 0 writes; every rank returns after it
        manifest = json.loads((where / "kernel_pytorch.json").read_text())
        sharding = manifest["sharding"]
        assert sharding["world_size"] == ctx.world and sharding["rank"] == 0 and sharding["fsdp"], sharding
        assert sharding["dtensors"] == len(list(model.parameters())) and "full_state_dict=True" in sharding[
            "gathered_with"]
        assert len(manifest["swaps"]) == len(report.applied())

        # into the unsharded architecture: re-optimized as saved, the full weights
        whole = kp.load(where, lambda kind=kind: MODELS[kind](2).to(ctx.device))
        assert [type(m).__name__ for m in whole.modules()].count("GatedMLP") == 2
        for (name, p), q in zip(whole.named_parameters(), model.parameters(), strict=True):
            assert torch.equal(p, full(q)), name
        x = ids(ctx.rank, 50, ctx.device)
        with torch.no_grad():
            assert (result := compare(loss(whole, x), loss(model, x))).passed, result.message("loss")

        # back into a sharded optimized model, on every rank
        fresh = _sharded(kind, ctx, seed=3)
        assert kp.load(where, fresh) is fresh
        _same(fresh, model, exact=True)


def _raised(call) -> BaseException | None:
    """The exception `call()` raises (None if none): every rank makes each call, so that a failed check on
    one rank never leaves the others in a collective."""
    try:
        call()
    except Exception as exc:
        return exc
    return None


def rank0_failures(ctx: Ctx) -> None:
    model, report = _optimized("kp", ctx)
    model = shard(model, ctx.mesh())
    where = ctx.shared_dir / "failures"
    kp.save(model, where, report=report)
    plain = _sharded("kp", ctx, optimized=False)
    load_error = _raised(lambda: kp.load(where, plain))
    save_error = _raised(lambda: kp.save(model, ctx.shared_dir / "bad", metadata={"x": object()}))
    if ctx.rank == 0:
        assert isinstance(load_error, LoadError), load_error
        assert "swapped 'model.embed_tokens' (Embedding -> Embedding, rule torch_embedding); this sharded model " \
               "holds a torch.nn.modules.sparse.Embedding there" in str(load_error), load_error
        assert "optimize it before sharding" in str(load_error)
        assert isinstance(save_error, TypeError) and "metadata must be JSON-able" in str(save_error), save_error
        assert not (ctx.shared_dir / "bad" / "kernel_pytorch.json").exists()
    else:
        assert isinstance(load_error, RuntimeError), load_error
        assert f"kernel_pytorch.load from {where} failed on rank 0" in str(load_error)
        assert isinstance(save_error, RuntimeError) and "kernel_pytorch.save to" in str(save_error), save_error


SCENARIOS = ("dcp_round_trip", "kp_save_load", "rank0_failures")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path_factory.mktemp("ckpt"), timeout_s=TIMEOUT_S)


def test_dcp_round_trip_continues_training(outcomes) -> None:
    check(outcomes["dcp_round_trip"])


def test_kp_save_gathers_on_rank0_and_loads_both_ways(outcomes) -> None:
    check(outcomes["kp_save_load"])


def test_rank0_failures_raise_on_every_rank(outcomes) -> None:
    check(outcomes["rank0_failures"])


@pytest.mark.cuda
@pytest.mark.parametrize("world", [1, 2])
def test_sharded_checkpoints_nccl(tmp_path, world: int) -> None:
    got = run_world(__name__, SCENARIOS, world=world, tmp=tmp_path, backend="nccl", timeout_s=TIMEOUT_S)
    for name in SCENARIOS:
        check(got[name])
