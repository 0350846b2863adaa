"""`optimize()` on a model already sharded or parallelized: the modules holding sharded parameters are left
as they are, named in the report with the reason, and the rest is optimized and validated as usual.
FSDP2 puts the unsharded parameters on the original module objects for each forward and backward, and a
tensor-parallel plan's hooks sit on them, so a replacement would compute with the shards or skip the plan.

- a model holding FSDP modules (fully_shard on the layers and the root, the root after a forward, the
  layers alone): nothing is offered to the rules and the model is not run (a forward outside training
  leaves FSDP2's root modules holding their unsharded Parameters, which an optimizer built afterwards
  would take); nothing is validated, the compile steps are skipped, and the model trains exactly as its
  twin that never met optimize(), validate=True and validate=False alike;
- tensor parallelism (parallelize_module on the attention and MLP projections): the projections stay,
  the norms, embedding and LM head + loss are swapped, validated, and train as the original.

Two processes on CPU with gloo (tests/distributed.py); the NCCL variant needs 2 GPUs.
"""

from __future__ import annotations

import logging

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch._env import is_dtensor
from kernel_pytorch.optimize.report import SHARDED_REASON
from kernel_pytorch.tolerances import compare
from tests.distributed import Ctx, check, run_world
from tests.optimize.sharded import MODELS, example, full, ids, layers, loss, shard, train

WORLD = 2
TIMEOUT_S = 120
# modules holding parameters in either tiny Llama: embedding, 2 x (4 attention + 3 MLP + 2 norms), norm, lm_head
OWNERS = 21


def _twins(ctx: Ctx, kind: str, parallelize) -> tuple[torch.nn.Module, torch.nn.Module]:
    mesh = ctx.mesh()
    return parallelize(MODELS[kind](0).to(ctx.device), mesh), parallelize(MODELS[kind](0).to(ctx.device), mesh)


def _train_alike(ctx: Ctx, ours, theirs, steps: int, exact: bool) -> None:
    """Train both; losses and final parameters equal (`exact`: bitwise, on CPU; CUDA's SDPA and embedding
    backwards add in no fixed order, so there within the tolerance table)."""
    exact = exact and ctx.device.type == "cpu"
    # not foreach: a tensor-parallel model mixes plain and DTensor parameters, which torch's foreach ops refuse
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False) for m in (ours, theirs)]
    our_losses = train(ours, opts[0], ctx.rank, steps, device=ctx.device)
    their_losses = train(theirs, opts[1], ctx.rank, steps, device=ctx.device)
    if exact:
        assert our_losses == their_losses
    else:
        torch.testing.assert_close(torch.tensor(our_losses), torch.tensor(their_losses), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        if exact:
            assert torch.equal(full(p), full(q)), name
        else:
            assert (result := compare(full(p), full(q))).passed, result.message(name)


def _shard_layers(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """fully_shard on the decoder layers only (the root's embedding, norm and LM head stay plain)."""
    from torch.distributed.fsdp import fully_shard

    for layer in layers(model):
        fully_shard(layer, mesh=mesh)
    return model


def under_fsdp(ctx: Ctx) -> None:
    """Root and layers sharded (both models), the root after a forward (its modules then hold plain unsharded
    Parameters), the layers alone (the root's modules plain): nothing is looked at or run, with validation
    and without; the model trains exactly as its twin that never met optimize()."""
    cases = [("hf", shard, False), ("kp", shard, False), ("hf", shard, True), ("hf", _shard_layers, False)]
    for kind, parallelize, ran in cases:
        for validate in (True, False):
            ours, theirs = _twins(ctx, kind, parallelize)
            if ran:
                with torch.no_grad():
                    loss(ours, ids(ctx.rank, -2, ctx.device))
                    loss(theirs, ids(ctx.rank, -2, ctx.device))
                assert not is_dtensor(ours.lm_head.weight)  # FSDP2 keeps the root unsharded after a forward
            before = dict(ours.named_modules())
            model, report = kp.optimize(ours, example(ours, ctx.device), validate=validate)
            assert model is ours and dict(ours.named_modules()) == before  # the same module objects
            assert not report.changes and len(report.sharded) == OWNERS and not report.validated, report
            assert report.sharded[:2] == ["model.embed_tokens", "model.layers.0.self_attn.q_proj"], report.sharded
            [step] = report.compile_steps
            assert (step.name, step.status) == ("regional", "skipped") and "sharded parameters" in step.reason
            text = str(report)
            assert text.startswith(f"optimize: 0 modules replaced, 0 reverted, {OWNERS} left alone"), text
            assert f"left alone [sharded] {SHARDED_REASON}: model.embed_tokens" in text, text
            assert f"({OWNERS} in all)" in text and "validation: not run: nothing was changed" in text, text
            assert "note: the model holds FSDP modules: none of its modules is offered" in text, text
            assert report.to_dict()["sharded"] == report.sharded
            _train_alike(ctx, ours, theirs, 2, exact=True)


def tensor_parallel(ctx: Ctx) -> None:
    """parallelize_module on the projections (Colwise q/k/v, gate/up; Rowwise o, down)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
    plan |= {"self_attn.o_proj": RowwiseParallel(), "mlp.gate_proj": ColwiseParallel(),
             "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}

    def parallelize(model, mesh):
        for layer in layers(model):
            parallelize_module(layer, mesh, plan)
        return model

    ours, theirs = _twins(ctx, "hf", parallelize)
    _, report = kp.optimize(ours, example(ours, ctx.device), compile=False)
    assert report.passed and report.validated, report
    assert report.counts() == {"torch_embedding": 1, "hf_rms_norm": 5, "fused_linear_cross_entropy": 1}, report
    assert report.sharded == [f"model.layers.{i}.{p}" for i in range(2) for p in plan], report.sharded
    assert not report.skipped()  # the attention and MLP blocks are not offered: they hold the projections
    assert type(ours.model.layers[0].mlp).__name__ == "LlamaMLP"
    _train_alike(ctx, ours, theirs, 2, exact=False)


def subclass_parameters_said_once(ctx: Ctx) -> None:
    """A fused path's plain-parameter check refuses a DTensor parameter and says so once."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    from kernel_pytorch.functional import _dispatch

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kernel_pytorch").addHandler(handler)
    logging.getLogger("kernel_pytorch").setLevel(logging.INFO)
    w = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4, device=ctx.device), ctx.mesh(), [Replicate()]))
    x = torch.randn(3, 4, device=ctx.device)
    assert not _dispatch._one_kind(x, [w]) and not _dispatch._one_kind(x, [w])
    said = [r for r in records if "a DTensor parameter runs its own ops" in r]
    assert len(said) == 1, records
    assert _dispatch._one_kind(x, [torch.nn.Parameter(torch.randn(8, 4, device=ctx.device)), None])


SCENARIOS = ("under_fsdp", "tensor_parallel", "subclass_parameters_said_once")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path_factory.mktemp("sharded"), timeout_s=TIMEOUT_S)


def test_model_under_fsdp_is_left_as_it_is(outcomes) -> None:
    check(outcomes["under_fsdp"])


def test_tensor_parallel_projections_left_alone_rest_optimized(outcomes) -> None:
    check(outcomes["tensor_parallel"])


def test_fused_paths_say_once_they_step_aside_for_dtensors(outcomes) -> None:
    check(outcomes["subclass_parameters_said_once"])


def test_report_rows_for_sharded_modules() -> None:
    """One process: the report's rendering of `sharded` (the model itself named as such)."""
    from kernel_pytorch.optimize import OptimizeReport

    report = OptimizeReport(sharded=["", "lm_head"])
    text = str(report)
    assert text.splitlines()[0] == "optimize: 0 modules replaced, 0 reverted, 2 left alone"
    assert f"  left alone [sharded] {SHARDED_REASON}: the model itself, lm_head" in text
    assert "validation: not run: nothing was changed" in text
    assert report.to_dict()["sharded"] == ["", "lm_head"] and report.passed


@pytest.mark.cuda
def test_sharded_models_nccl(tmp_path) -> None:
    got = run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path, backend="nccl", timeout_s=TIMEOUT_S)
    for name in SCENARIOS:
        check(got[name])
