"""A small Llama, optimize()d, under tensor and sequence parallelism: kernel_pytorch.models' Llama and transformers'
LlamaForCausalLM with kernel_pytorch.distributed's plan (and the built-in one with torch's own styles, the
torchtitan plan), against the single-process model: the loss, the logits and every gradient within the
tolerance table, and the plan's collectives only (an all-gather or reduce-scatter per norm and per block,
no all-reduce). The plan's checks: heads that do not split over the ranks, a mesh without the named
dimension, a 2-D mesh with none named, a fused gate_up projection, an embedding tied to lm_head.

A world of 4 processes on CPU (gloo), spawned once by tests/distributed.py under a timeout, shards each model
over tensor-parallel groups of 4 (the world) and of 2 (the "tp" dimension of a (2, 2) mesh); on GPUs the same
with NCCL on two GPUs (a group of 2) and on one."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kernel_pytorch.tolerances import compare_reordered
from tests.distributed import Ctx, check, run_world

TIMEOUT_S = 120
LAYERS = 2
# fwd + bwd of the plan on LAYERS layers: per layer two norm outputs all-gathered and two block outputs
# reduce-scattered, each mirrored in the backward; the embedding's reduce-scatter, the final norm's and the
# logits' all-gathers (the logits' backward is a local split)
COLLECTIVES = {"all_gather_into_tensor": 4 * LAYERS + 3, "reduce_scatter_tensor": 4 * LAYERS + 2}
# optimize()'s fused loss on the vocabulary-sharded head: no logits gathered (one all-gather and its
# backward's reduce-scatter fewer), the vocabulary-parallel loss's three all-reduces instead (the row
# maxima, the sums, grad_x)
VOCAB_PARALLEL_COLLECTIVES = {"all_gather_into_tensor": 4 * LAYERS + 2, "reduce_scatter_tensor": 4 * LAYERS + 1,
                              "all_reduce": 3}


def _builtin(ctx: Ctx, heads: int = 8, kv_heads: int = 4, tie: bool = False) -> torch.nn.Module:
    from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, dim=64, n_layers=LAYERS, n_heads=heads, n_kv_heads=kv_heads,
                         intermediate_size=96, tie_embeddings=tie)
    model = LlamaForCausalLM(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.to(ctx.device)


def _hf(ctx: Ctx) -> torch.nn.Module:
    import transformers

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(ctx.device).train()


def _inputs(ctx: Ctx, hf: bool) -> dict[str, Any]:
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1)).to(ctx.device)
    # transformers' KV cache would mix plain tensors with the DTensor keys: training runs without it
    return {"input_ids": ids, "labels": ids, **({"use_cache": False} if hf else {})}


def _optimized(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.nn.Module:
    import kernel_pytorch as kp

    model, _ = kp.optimize(model, inputs, compile=False, validate=False)
    return model


def _loss_and_logits(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = model(**inputs)
    if isinstance(out, torch.Tensor):  # the built-in model returns its loss
        return out, None
    return out.loss, out.logits


def _matches(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    # sums over shards are the whole sums in another order
    result = compare_reordered(actual, expected)
    assert result.passed, result.message(name)


@contextlib.contextmanager
def _gated_routes() -> Iterator[list[str]]:
    """The route of each gated MLP call (functional/mlp.py: "block", "gated_down" or "composed") meanwhile."""
    from kernel_pytorch.functional import mlp

    routes: list[str] = []
    route = mlp._gated_route

    def spied(*args: Any) -> str:
        routes.append(route(*args))
        return routes[-1]

    mlp._gated_route = spied
    try:
        yield routes
    finally:
        mlp._gated_route = route


def _meshes(ctx: Ctx) -> list[Any]:
    """The meshes a model is sharded on, each with a "tp" dimension: the whole world and, on a world of 4,
    a (2, 2) mesh whose tensor-parallel groups hold 2 ranks (the two "dp" halves compute the same step)."""
    meshes = [ctx.mesh(names=("tp",))]
    if ctx.world == 4:
        meshes.append(ctx.mesh((2, 2), ("dp", "tp")))
    return meshes


def _against_single_process(ctx: Ctx, model: torch.nn.Module, inputs: dict[str, Any], shard,  # noqa: ANN001
                            routes: list[str], collectives: dict[str, int] = COLLECTIVES) -> None:
    """On each of `_meshes`, shard a copy of `model` with `shard(copy, mesh)` and compare one training step
    with the model's; `routes`: the gated MLP calls' routes in the sharded step; `collectives`: what the
    step runs, by kind."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    loss, logits = _loss_and_logits(model, inputs)
    loss.backward()
    params = dict(model.named_parameters())
    for mesh in _meshes(ctx):
        ranks = mesh["tp"].size() if mesh.ndim > 1 else mesh.size()
        sharded = shard(copy.deepcopy(model), mesh)
        with CommDebugMode() as comm, _gated_routes() as taken:
            tp_loss, tp_logits = _loss_and_logits(sharded, inputs)
            tp_loss.backward()
        assert taken == routes, taken
        counts = {str(op).rpartition(".")[2]: n for op, n in comm.get_comm_counts().items()}
        assert counts == (collectives if ranks > 1 else {}), (ranks, counts)  # a group of one rank moves nothing
        _matches(f"tp {ranks}: loss", tp_loss.detach(), loss.detach())
        if logits is not None:
            _matches(f"tp {ranks}: logits", tp_logits.detach(), logits.detach())
        sharded_params = dict(sharded.named_parameters())
        assert sharded_params.keys() == params.keys()
        assert any(isinstance(p, DTensor) for p in sharded_params.values())
        for name, p in sharded_params.items():
            grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            _matches(f"tp {ranks}: grad {name}", grad, params[name].grad)


def _our_plan(model: torch.nn.Module, mesh) -> torch.nn.Module:  # noqa: ANN001
    from kernel_pytorch.distributed import tensor_parallel

    return tensor_parallel(model, mesh, dim="tp")


def _torch_styles(model: torch.nn.Module, mesh) -> torch.nn.Module:  # noqa: ANN001
    """torchtitan's Llama plan with torch's styles alone, on our modules (hooks on the MLP's projections)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from kernel_pytorch.distributed import tp_mesh

    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        plan.update({
            f"{layer}.input_layernorm": SequenceParallel(),
            f"{layer}.self_attn": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                     desired_input_layouts=(Replicate(), None)),
            **{f"{layer}.self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
            f"{layer}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            f"{layer}.post_attention_layernorm": SequenceParallel(),
            f"{layer}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{layer}.mlp.gate_proj": ColwiseParallel(),
            f"{layer}.mlp.up_proj": ColwiseParallel(),
            f"{layer}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return parallelize_module(model, tp_mesh(mesh, "tp"), plan)


def builtin_llama(ctx: Ctx) -> None:
    inputs = _inputs(ctx, hf=False)
    model = _optimized(_builtin(ctx), inputs)
    # GatedMLPParallel keeps the block fused: the gated_down op on each rank's columns
    _against_single_process(ctx, model, inputs, _our_plan, ["gated_down"] * LAYERS)


def builtin_llama_torch_styles(ctx: Ctx) -> None:
    inputs = _inputs(ctx, hf=False)
    model = _optimized(_builtin(ctx), inputs)
    # hooks on the projections: the block calls them as modules, the gated activation between them
    _against_single_process(ctx, model, inputs, _torch_styles, [])


def hf_llama(ctx: Ctx) -> None:
    inputs = _inputs(ctx, hf=True)
    model = _optimized(_hf(ctx), inputs)
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"HFAttention", "GatedMLP", "RMSNorm", "Embedding", "FusedLossLMHead"} <= kinds, kinds

    def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:  # noqa: ANN001
        sharded = _our_plan(model, mesh)
        mlps = [m for m in sharded.modules() if type(m).__name__ == "GatedMLP"]
        assert mlps and all(m._forward_pre_hooks and not m.down_proj._forward_hooks for m in mlps)  # on the block
        return sharded

    _against_single_process(ctx, model, inputs, shard, ["gated_down"] * LAYERS, VOCAB_PARALLEL_COLLECTIVES)


def fsdp_and_tp(ctx: Ctx) -> None:
    """FSDP2 over "dp" on top of the plan over "tp" (a (2, 2) mesh on 4 ranks, (1, 2) on 2, (1, 1) on 1): one
    training step of the optimized HF Llama, its loss and every gradient as the single-process model's
    (every dp rank sees the same batch, so FSDP2's averaged gradient is the batch's)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    inputs = _inputs(ctx, hf=True)
    model = _optimized(_hf(ctx), inputs)
    loss, _ = _loss_and_logits(model, inputs)
    loss.backward()
    dp = 2 if ctx.world == 4 else 1
    mesh = ctx.mesh((dp, ctx.world // dp), ("dp", "tp"))
    sharded = _our_plan(copy.deepcopy(model), mesh)
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(sharded, mesh=mesh["dp"])
    tp_loss, _ = _loss_and_logits(sharded, inputs)
    tp_loss.backward()
    _matches("fsdp + tp: loss", tp_loss.detach(), loss.detach())
    params = dict(model.named_parameters())
    for name, p in sharded.named_parameters():
        assert isinstance(p, DTensor) and p.device_mesh.ndim in (1, 2), name
        _matches(f"fsdp + tp: grad {name}", p.grad.full_tensor(), params[name].grad)


def plan_errors(ctx: Ctx) -> None:
    from kernel_pytorch.distributed import llama_tp_plan
    from kernel_pytorch.nn import GatedMLP

    mesh = ctx.mesh(names=("tp",))
    if ctx.world > 1:  # whole heads per rank: one key/value head cannot be split
        with pytest.raises(ValueError, match=rf"self_attn: {2 * ctx.world} query heads and 1 key/value heads do not "
                           rf"split over {ctx.world} tensor-parallel ranks"):
            llama_tp_plan(_builtin(ctx, heads=2 * ctx.world, kv_heads=1), mesh)
    model = _builtin(ctx)
    with pytest.raises(ValueError, match=r"the mesh has no dimension 'model' \(its dimensions: \('tp',\)\)"):
        llama_tp_plan(model, mesh, dim="model")
    with pytest.raises(ValueError, match=r"a 2-D mesh \(dimensions \('dp', 'tp'\)\): name its tensor-parallel"):
        llama_tp_plan(model, ctx.mesh((1, ctx.world), ("dp", "tp")))
    assert llama_tp_plan(model, ctx.mesh((1, ctx.world), ("dp", "tp")), dim="tp")
    with pytest.raises(ValueError, match=r"lm_head.weight is tied to the input embedding"):
        llama_tp_plan(_builtin(ctx, tie=True), mesh)
    optimized = _optimized(model, _inputs(ctx, hf=False))
    optimized.model.layers[1].mlp = GatedMLP(64, 96, fuse_gate_up=True, device=ctx.device)
    with pytest.raises(ValueError, match=r"model.layers.1.mlp: GatedMLPParallel cannot shard a GatedMLP with "
                       r"fuse_gate_up=True"):
        llama_tp_plan(optimized, mesh)


def sequence_parallel_norms(ctx: Ctx) -> None:
    """SequenceParallelNorm on RMSNorm and FusedAddRMSNorm: local (B, T/n, D) sequence shards in, the normed
    output all-gathered (Replicate), FusedAddRMSNorm's residual stream left sharded; values and gradients as
    the module on whole tensors."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    from kernel_pytorch.distributed import SequenceParallelNorm
    from kernel_pytorch.nn import FusedAddRMSNorm, RMSNorm

    mesh = ctx.mesh(names=("tp",))
    g = torch.Generator().manual_seed(2)
    for norm in (RMSNorm(16, casting="llama"), FusedAddRMSNorm(16)):
        with torch.no_grad():
            norm.weight.copy_(torch.randn(16, generator=g))
        norm = norm.to(ctx.device)
        n_inputs = 2 if isinstance(norm, FusedAddRMSNorm) else 1  # (x, residual) or x
        xs = [torch.randn(2, 4 * ctx.world, 16, generator=g).to(ctx.device) for _ in range(n_inputs)]
        ups = [torch.randn(2, 4 * ctx.world, 16, generator=g).to(ctx.device) for _ in xs]
        whole = [x.clone().requires_grad_() for x in xs]
        ref = copy.deepcopy(norm)
        outs = ref(*whole)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs, ups)
        sharded = parallelize_module(copy.deepcopy(norm), mesh, SequenceParallelNorm())
        local = [x.chunk(ctx.world, 1)[ctx.rank].clone().requires_grad_() for x in xs]
        got = sharded(*local)
        got = got if isinstance(got, tuple) else (got,)
        assert [tuple(o.placements) for o in got] == [(Replicate(),), (Shard(1),)][: len(got)]
        torch.autograd.backward(got, [distribute_tensor(u, mesh, o.placements) for u, o in zip(ups, got)])
        for i, (o, want) in enumerate(zip(got, outs)):
            _matches(f"{type(norm).__name__} output {i}", o.full_tensor().detach(), want.detach())
        for i, (x, w) in enumerate(zip(local, whole)):
            _matches(f"{type(norm).__name__} grad {i}", x.grad, w.grad.chunk(ctx.world, 1)[ctx.rank])
        _matches(f"{type(norm).__name__} grad weight", sharded.weight.grad.full_tensor(), ref.weight.grad)


SCENARIOS = ("builtin_llama", "builtin_llama_torch_styles", "hf_llama", "fsdp_and_tp", "sequence_parallel_norms",
             "plan_errors")


def setup_rank(ctx: Ctx) -> None:
    import kernel_pytorch.ops  # noqa: F401  (the ops and their sharding rules)


def _run(tmp_path_factory, world: int, backend: str = "gloo") -> dict:  # noqa: ANN001
    return run_world(__name__, SCENARIOS, world=world, tmp=tmp_path_factory.mktemp(f"tp{world}{backend}"),
                     timeout_s=TIMEOUT_S, backend=backend)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:  # noqa: ANN001
    pytest.importorskip("transformers")
    return _run(tmp_path_factory, 4)  # tensor-parallel groups of 4 and of 2 (`_meshes`)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tensor_parallel_llama(outcomes, scenario: str) -> None:
    check(outcomes[scenario])


@pytest.fixture(scope="module", params=[1, 2], ids=["1gpu", "2gpus"])
def gpu_outcomes(tmp_path_factory, request) -> dict:  # noqa: ANN001
    pytest.importorskip("transformers")
    return _run(tmp_path_factory, request.param, "nccl")


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_tensor_parallel_llama_gpu(gpu_outcomes, scenario: str) -> None:
    """The same on CUDA (Triton kernels on the local shards), NCCL on one GPU and on two."""
    check(gpu_outcomes[scenario])
