"""`optimize()` then FSDP2, the documented order: kp.optimize(model), then torchtitan's recipe (activation
checkpointing and compile per decoder layer, `fully_shard` on each layer and the root with a
MixedPrecisionPolicy), trained with kernel_pytorch.optim.AdamW. Checked against the same model unoptimized
and sharded alike, trained with torch's AdamW: losses and final full parameters over 10 steps at fp32
parameters; at bf16 parameters (FSDP2 casts the unsharded ones) a shorter smoke run within bf16's
tolerance.

FSDP2 puts plain unsharded Parameters on the modules for their forward and backward, so our fused paths
(the gated MLP's gated_down op, the shared-input q/k/v Linears, the norms' and embedding's registered
ops) take them: a spy on the plain-parameter check (`functional._dispatch._one_kind`) and on every
module of ours records what they saw.

Two processes on CPU with gloo (world 2, one timeout for the module; tests/distributed.py). The compiled
case uses backend="aot_eager": Dynamo, AOT autograd and the partitioner run as under Inductor (the FSDP2
hooks, the checkpointed region, our registered ops), but Inductor's C++ compile of the layer's graphs
took about 30 s of the module's budget on the 2-core CPU that runs these tests. The NCCL variants run on
1 and 2 GPUs.
"""

from __future__ import annotations

import functools

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch._env import is_plain_tensor
from kernel_pytorch.optim import AdamW
from kernel_pytorch.tolerances import compare
from tests.distributed import Ctx, check, run_world
from tests.optimize.sharded import MODELS, VOCAB, adam_kernel_on_cpu, example, full, layers, shard, train

WORLD = 2
TIMEOUT_S = 120
STEPS = 10
LR = 1e-3

SEEN: dict[str, list] = {"one_kind": [], "modules": [], "launches": [], "loss_head": []}


SPIES: dict[str, tuple] = {}  # name -> (module, original, spy)


def setup_rank(ctx: Ctx) -> None:
    """Spies: every answer of the fused paths' plain-parameter check, every forward of a module of ours
    (whether its parameters were plain tensors), and the LM head weight the fused loss gets (plain and
    whole); on CPU the AdamW kernel runs in Triton's interpreter (tests/optim/test_adam.py), its launches
    counted."""
    from kernel_pytorch.functional import _dispatch
    from kernel_pytorch.optimize.rules import cross_entropy

    one_kind, fused_loss = _dispatch._one_kind, cross_entropy.fused_causal_lm_loss

    @functools.wraps(one_kind)
    def one_kind_spied(x, params):
        answer = one_kind(x, params)
        SEEN["one_kind"].append((answer, tuple(type(p).__name__ for p in params if p is not None)))
        return answer

    @functools.wraps(fused_loss)
    def loss_spied(hidden, weight, *args, **kwargs):
        SEEN["loss_head"].append(is_plain_tensor(weight) and weight.shape == (VOCAB, hidden.shape[-1]))
        return fused_loss(hidden, weight, *args, **kwargs)

    SPIES["_one_kind"] = (_dispatch, one_kind, one_kind_spied)
    SPIES["fused_causal_lm_loss"] = (cross_entropy, fused_loss, loss_spied)
    _spy(True)
    adam_kernel_on_cpu(ctx.device, SEEN["launches"])


def _spy(on: bool) -> None:
    """Put the spies in (on) or the originals back: a compiled graph must not trace the spies' appends
    (a side effect inside the checkpointed region breaks the graph)."""
    for name, (module, original, spy) in SPIES.items():
        setattr(module, name, spy if on else original)


def _watch(model: torch.nn.Module) -> None:
    """A forward pre-hook on every module of ours recording whether its parameters are plain tensors."""
    for name, module in model.named_modules():
        if type(module).__module__.startswith(("kernel_pytorch.nn.", "kernel_pytorch.optimize.")):
            plain = lambda m, args, name=name: SEEN["modules"].append(  # noqa: E731
                (name, all(is_plain_tensor(p) for p in m.parameters())))
            module.register_forward_pre_hook(plain)


def _optimized(kind: str, device: torch.device) -> tuple[torch.nn.Module, kp.optimize.OptimizeReport]:
    model = MODELS[kind](0).to(device)
    model, report = kp.optimize(model, example(model, device), compile=False)
    assert report.passed and report.applied(), report
    return model, report


def _pair(ctx: Ctx, kind: str, watch: bool = True, **recipe) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(optimized, original), both sharded by the recipe from the same weights."""
    mesh = ctx.mesh()
    ours, _ = _optimized(kind, ctx.device)
    theirs = MODELS[kind](0).to(ctx.device)
    if watch:
        _watch(ours)
    return shard(ours, mesh, **recipe), shard(theirs, mesh, **recipe)


def _run(ctx: Ctx, kind: str, steps: int, watch: bool = True, **recipe) -> tuple[list[float], list[float],
                                                                                torch.nn.Module, torch.nn.Module]:
    ours, theirs = _pair(ctx, kind, watch, **recipe)
    for value in SEEN.values():
        value.clear()
    opt = AdamW(ours.parameters(), lr=LR, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs.parameters(), lr=LR, weight_decay=0.1, foreach=True)
    our_losses = train(ours, opt, ctx.rank, steps, device=ctx.device)
    their_losses = train(theirs, ref, ctx.rank, steps, device=ctx.device)
    return our_losses, their_losses, ours, theirs


def _fused_paths_took_unsharded(kind: str) -> None:
    """Every fused-path check said yes, on plain Parameters; every module of ours ran on plain ones; the
    fused loss of transformers' model got the whole LM head weight, a plain tensor."""
    if kind == "hf":
        assert SEEN["loss_head"] and all(SEEN["loss_head"]), SEEN["loss_head"]
    assert SEEN["one_kind"], "no fused path was asked"
    refused = [seen for seen in SEEN["one_kind"] if not seen[0]]
    assert not refused, refused[:3]
    assert {kinds for _, kinds in SEEN["one_kind"]} == {("Parameter",) * len(kinds)
                                                      for _, kinds in SEEN["one_kind"]}
    assert SEEN["modules"] and all(plain for _, plain in SEEN["modules"]), SEEN["modules"][:5]


def _same_training(our_losses, their_losses, ours, theirs) -> None:
    torch.testing.assert_close(torch.tensor(our_losses), torch.tensor(their_losses), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        result = compare(full(p), full(q))
        assert result.passed, result.message(name)


def fp32_checkpointed(ctx: Ctx) -> None:
    """HF Llama, activation checkpointing per layer, fp32 parameters: 10 steps as the original's."""
    our_losses, their_losses, ours, theirs = _run(ctx, "hf", STEPS, checkpoint=True)
    _fused_paths_took_unsharded("hf")
    assert SEEN["launches"] == [True] * STEPS or ctx.device.type != "cpu", SEEN["launches"]
    _same_training(our_losses, their_losses, ours, theirs)


def fp32_builtin(ctx: Ctx) -> None:
    """kernel_pytorch.models' Llama, no activation checkpointing (the norms' outputs are made again in the
    backward from FSDP2's re-gathered weights), fp32 parameters: 10 steps as the original's."""
    our_losses, their_losses, ours, theirs = _run(ctx, "kp", STEPS)
    _fused_paths_took_unsharded("kp")
    _same_training(our_losses, their_losses, ours, theirs)


def bf16_smoke(ctx: Ctx) -> None:
    """bf16 parameters (FSDP2 casts the unsharded ones, reduces in fp32): the fused paths take the bf16
    Parameters, and 3 steps stay within bf16's tolerance of the original's."""
    our_losses, their_losses, ours, theirs = _run(ctx, "hf", 3, param_dtype=torch.bfloat16, checkpoint=True)
    _fused_paths_took_unsharded("hf")
    torch.testing.assert_close(torch.tensor(our_losses), torch.tensor(their_losses), rtol=2e-2, atol=2e-2)
    for p in ours.parameters():
        assert p.dtype == torch.float32 and torch.isfinite(full(p)).all()


def compiled(ctx: Ctx) -> None:
    """Activation checkpointing and compile per layer (fullgraph=True, backend="aot_eager") under
    fully_shard: one graph for the layers, no graph break, and 3 steps as the original's, compiled alike.
    The spies stay out of the traced code (`_spy`)."""
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401 (registers aot_eager)
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters

    graphs: list[str] = []

    def recorded(gm, example_inputs):  # aot_eager, keeping the code Dynamo captured (subgraphs included)
        graphs.append(gm.print_readable(print_output=False))
        return lookup_backend("aot_eager")(gm, example_inputs)

    _spy(False)
    try:
        counters.clear()
        our_losses, their_losses, ours, theirs = _run(ctx, "kp", 3, checkpoint=True, compile_backend=recorded,
                                                      watch=False)
    finally:
        _spy(True)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters)
    # the optimized layers' graph (the original's is recorded too): the gated MLP's fused op on FSDP2's
    # unsharded parameters, inside the checkpointed region
    ours_graphs = [g for g in graphs if "kernel_pytorch.gated_down_fwd" in g]
    assert len(ours_graphs) == 1 and "tag_activation_checkpoint" in ours_graphs[0], [g[:300] for g in graphs]
    _same_training(our_losses, their_losses, ours, theirs)
    assert all(layer._compiled_call_impl is not None for layer in layers(ours))


SCENARIOS = ("fp32_checkpointed", "fp32_builtin", "bf16_smoke", "compiled")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=WORLD, tmp=tmp_path_factory.mktemp("fsdp"), timeout_s=TIMEOUT_S)


def test_optimize_then_fully_shard_trains_as_the_original(outcomes) -> None:
    check(outcomes["fp32_checkpointed"])
    check(outcomes["fp32_builtin"])


def test_optimize_then_fully_shard_bf16(outcomes) -> None:
    check(outcomes["bf16_smoke"])


def test_optimize_then_compile_and_fully_shard(outcomes) -> None:
    check(outcomes["compiled"])


@pytest.mark.cuda
@pytest.mark.parametrize("world", [1, 2])
def test_optimize_then_fully_shard_nccl(tmp_path, world: int) -> None:
    got = run_world(__name__, SCENARIOS, world=world, tmp=tmp_path, backend="nccl", timeout_s=TIMEOUT_S)
    for name in SCENARIOS:
        check(got[name])
