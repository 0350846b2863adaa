"""kernel_pytorch.optim.AdamW under FSDP2 (`fully_shard`, DTensor parameters Shard(0) on a 1-D mesh), two
processes on CPU with gloo: the kernel steps the local shards (one launch a step) along torch's AdamW's
trajectory, its state dict and DCP's optimizer state load into torch's AdamW, and layouts it does not take
raise (backend="triton") or fall back (auto), naming the tensor and torch's step.

The processes are spawned once for the module by tests/distributed.py, under a timeout."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from kernel_pytorch.optim import Adam, AdamW
from kernel_pytorch.optim import adam as optim_adam
from kernel_pytorch.tolerances import compare
from tests.distributed import Ctx, check, run_world

WORLD = 2
TIMEOUT_S = 120
STEPS = 3


def _model() -> torch.nn.Module:
    """Shards of 16-byte-aligned sizes; the last layer's 7 rows split 4 / 3 (uneven shards)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.GELU(), torch.nn.Linear(32, 7))


def _shard(model: torch.nn.Module, mesh, per_layer: bool = True) -> torch.nn.Module:
    """fully_shard on each Linear (per_layer) and the root, the torchtitan recipe."""
    from torch.distributed.fsdp import fully_shard

    for layer in model if per_layer else ():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(6, 16, generator=torch.Generator().manual_seed(100 * rank + step))


def _train(model, opt, rank: int, steps: int, first: int = 0) -> list[float]:
    losses = []
    for step in range(first, first + steps):
        loss = model(_batch(rank, step)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _assert_full_params_match(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        result = compare(p.full_tensor(), q.full_tensor())
        assert result.passed, result.message(name)


def trajectory_and_state(ctx: Ctx) -> None:
    rank, mesh = ctx.rank, ctx.mesh()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.tensor import DTensor

    base = _model()
    ours, theirs = _shard(copy.deepcopy(base), mesh), _shard(copy.deepcopy(base), mesh)
    opt = AdamW(ours.parameters(), lr=1e-2, weight_decay=0.05, backend="triton")
    ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.05, foreach=True)
    assert all(isinstance(p, DTensor) for p in ours.parameters())
    LAUNCHES.clear()
    our_losses, their_losses = _train(ours, opt, rank, STEPS), _train(theirs, ref, rank, STEPS)
    # the kernel ran, once a step, on every parameter's local shard (plain tensors), not torch's step
    n = len(list(ours.parameters()))
    assert LAUNCHES == [(n, True)] * STEPS, LAUNCHES
    torch.testing.assert_close(torch.tensor(our_losses), torch.tensor(their_losses), rtol=1e-5, atol=1e-6)
    _assert_full_params_match(ours, theirs)

    # torch's state layout: DTensor moments of the parameter's placements, a plain CPU step
    ours_sd, theirs_sd = opt.state_dict(), ref.state_dict()
    assert ours_sd["state"].keys() == theirs_sd["state"].keys()
    for i, state in ours_sd["state"].items():
        assert state.keys() == theirs_sd["state"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in ("exp_avg", "exp_avg_sq"):
            mine, torchs = state[key], theirs_sd["state"][i][key]
            assert isinstance(mine, DTensor) and mine.placements == torchs.placements, (i, key)
            assert compare(mine.full_tensor(), torchs.full_tensor()).passed, (i, key)

    # our state (through DCP's API and plain load_state_dict) continues in torch's AdamW as in ours
    for load in ("dcp", "state_dict"):
        model = _shard(copy.deepcopy(base), mesh)
        model.load_state_dict(ours.state_dict())
        torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, foreach=True)
        if load == "dcp":
            # a copy, as from a file: load_state_dict keeps the tensors it is given, shared with ours
            set_optimizer_state_dict(model, torch_opt, copy.deepcopy(get_optimizer_state_dict(ours, opt)))
        else:
            torch_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # the same
        snapshot = copy.deepcopy(ours.state_dict()), copy.deepcopy(opt.state_dict())
        _train(model, torch_opt, rank, 1, first=STEPS)
        _train(ours, opt, rank, 1, first=STEPS)
        _assert_full_params_match(ours, model)
        ours.load_state_dict(snapshot[0])
        opt.load_state_dict(snapshot[1])


def adam_amsgrad(ctx: Ctx) -> None:
    """Adam with amsgrad (a third moment, max_exp_avg_sq, as a DTensor too) against torch's Adam."""
    rank, mesh = ctx.rank, ctx.mesh()
    base = _model()
    ours, theirs = _shard(copy.deepcopy(base), mesh), _shard(copy.deepcopy(base), mesh)
    opt = Adam(ours.parameters(), lr=1e-2, weight_decay=0.05, amsgrad=True, backend="triton")
    ref = torch.optim.Adam(theirs.parameters(), lr=1e-2, weight_decay=0.05, amsgrad=True, foreach=True)
    LAUNCHES.clear()
    _train(ours, opt, rank, 2)
    _train(theirs, ref, rank, 2)
    assert len(LAUNCHES) == 2, LAUNCHES
    _assert_full_params_match(ours, theirs)


def misaligned_shards(ctx: Ctx) -> None:
    """One fully_shard over layers whose padded shards are not 16-byte multiples: the later gradient
    shards (views into the reduce-scatter buffer) are misaligned, so torch's step runs, as documented."""
    rank, mesh = ctx.rank, ctx.mesh()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 4))
    ours, theirs = (_shard(copy.deepcopy(base), mesh, per_layer=False) for _ in range(2))
    LAUNCHES.clear()
    for model, opt in ((ours, AdamW(ours.parameters(), lr=1e-2)),
                       (theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2))):
        for step in range(2):
            model(_batch(rank, step)[:, :4]).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert LAUNCHES == [], LAUNCHES
    _assert_full_params_match(ours, theirs)
    with pytest.raises(ValueError, match="not contiguous and 16-byte aligned"):
        ours(_batch(rank, 0)[:, :4]).sum().backward()
        AdamW(ours.parameters(), backend="triton").step()


def bad_layouts(ctx: Ctx) -> None:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = ctx.mesh()

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("kernel_pytorch").addHandler(handler)
    logging.getLogger("kernel_pytorch").setLevel(logging.INFO)

    def mismatched() -> torch.nn.Parameter:
        p = torch.nn.Parameter(distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)]))
        p.grad = distribute_tensor(torch.ones(8, 4), mesh, [Replicate()])
        return p

    with pytest.raises(ValueError, match=r"backend='triton' cannot run this AdamW step: param_groups\[0\]\['params'\]"
                       r"\[1\] is a DTensor with placements \(Shard\(dim=0\),\) but its gradient has "
                       r"\(Replicate\(\),\).*torch.optim.AdamW \(fused=True or foreach=True\) runs it"):
        AdamW([torch.nn.Parameter(torch.zeros(4)), mismatched()], backend="triton").step()
    partial = torch.nn.Parameter(DTensor.from_local(torch.ones(4, 4), mesh, [Partial()]))
    partial.grad = DTensor.from_local(torch.ones(4, 4), mesh, [Partial()])
    with pytest.raises(ValueError, match=r"\['params'\]\[0\] is a DTensor with a Partial placement.*"
                       r"torch.optim.AdamW \(fused=True or foreach=True\)"):
        AdamW([partial], backend="triton").step()
    # auto: torch's step, said once, and the kernel not launched
    LAUNCHES.clear()
    p = mismatched()
    AdamW([p], lr=1e-2).step()
    assert LAUNCHES == [] and any("is a DTensor with placements" in r and "using torch's AdamW step" in r
                                  for r in records), records


SCENARIOS = ("trajectory_and_state", "adam_amsgrad", "bad_layouts", "misaligned_shards")


LAUNCHES: list = []  # (number of tensors, all plain tensors) for each kernel launch, in a rank's process


def setup_rank(ctx: Ctx) -> None:
    """The kernel on CPU through Triton's interpreter (as tests/optim/test_adam.py does), its launcher spied
    on."""
    from kernel_pytorch.ops import adam as K

    optim_adam.kernel_ready = lambda device: (True, "interpreter")
    launch = K.adam_step

    def spied(params, *args, **kwargs):
        LAUNCHES.append((len(params), all(type(t) is torch.Tensor for t in params)))
        launch(params, *args, **kwargs)

    K.adam_step = spied


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path_factory.mktemp("fsdp"), timeout_s=TIMEOUT_S)


def test_fsdp2_trajectory_and_state_match_torch(outcomes) -> None:
    """3 steps of an MLP under fully_shard (per layer and root): losses and full parameters as torch's
    AdamW (foreach); the state is torch's layout and continues in torch's AdamW (DCP and load_state_dict)."""
    check(outcomes["trajectory_and_state"])


def test_fsdp2_adam_amsgrad_matches_torch(outcomes) -> None:
    check(outcomes["adam_amsgrad"])


def test_fsdp2_bad_layouts_raise_or_fall_back(outcomes) -> None:
    check(outcomes["bad_layouts"])
    check(outcomes["misaligned_shards"])
