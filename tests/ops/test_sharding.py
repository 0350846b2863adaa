"""The registered ops on DTensors (ops/_common/sharding.py and each op's rule): every supported placement, forward
and backward, equal to the op on whole tensors within the tolerance table, with the outputs and gradients
placed as the rule says and no collective; unsupported placements raise naming the op and the placements.
Also functional.embedding's vocabulary-sharded lookup, apply_rotary's replicated tables and attention on
DTensors, which run on the local shards outside any op rule.

Two processes on CPU (gloo: the ops' CPU kernels, the reference), spawned once for the module by
tests/distributed.py under a timeout; on GPUs the same scenarios with NCCL on two GPUs and on one."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import Ctx, check, run_world
from tests.ops.sharding_helpers import Case, randn, run_case

TIMEOUT_S = 120
ops = torch.ops.kernel_pytorch


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Shard, Replicate(), Partial()


def norms(ctx: Ctx) -> None:
    S, R, P = _placements()
    mesh = ctx.mesh()
    x = (2, 5, 8)  # (B, T, D): T = 5 splits 3 / 2 over two ranks
    for d in (0, 1):
        run_case(Case(f"rms_norm Shard({d})", lambda x, w: ops.rms_norm_fwd(x, w, 1e-6, 0.0, "llama"),
                      lambda dev: (randn(*x, device=dev), randn(8, device=dev, seed=1)),
                      (S(d), R), (S(d), S(d)), (S(d), P)), mesh)
    run_case(Case("add_rms_norm Shard(1)", lambda x, r, w: ops.add_rms_norm_fwd(x, r, w, 1e-6, 0.0, "torch"),
                  lambda dev: (randn(*x, device=dev), randn(*x, device=dev, seed=2), randn(8, device=dev, seed=1)),
                  (S(1), S(1), R), (S(1), S(1), S(1)), (S(1), S(1), P), diff=(0, 1)), mesh)
    run_case(Case("layer_norm Shard(1)", lambda x, w, b: ops.layer_norm_fwd(x, w, b, 1e-5),
                  lambda dev: (randn(*x, device=dev), randn(8, device=dev, seed=1), randn(8, device=dev, seed=2)),
                  (S(1), R, R), (S(1), S(1), S(1)), (S(1), P, P)), mesh)
    run_case(Case("replicated rms_norm", lambda x, w: ops.rms_norm_fwd(x, w, 1e-6, 0.0, "llama"),
                  lambda dev: (randn(*x, device=dev), randn(8, device=dev, seed=1)), (R, R), (R, R), (R, R)), mesh)


def rope(ctx: Ctx) -> None:
    from kernel_pytorch.functional import apply_rotary

    S, R, _ = _placements()
    mesh = ctx.mesh()

    def tables(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        angle = randn(1, 5, 8, device=dev, seed=3)
        return angle.cos(), angle.sin()

    # (B, H, T, D), GQA: 4 query heads, 2 key/value heads
    run_case(Case("rope heads (B, H, T, D)", lambda q, k, c, s: ops.rope_fwd(q, k, c, s, None, False, 1, False),
                  lambda dev: (randn(2, 4, 5, 8, device=dev), randn(2, 2, 5, 8, device=dev, seed=1), *tables(dev)),
                  (S(1), S(1), R, R), (S(1), S(1)), (S(1), S(1)), diff=(0, 1)), mesh)
    run_case(Case("rope heads (B, T, H, D), interleaved",
                  lambda q, k, c, s: ops.rope_fwd(q, k, c, s, None, True, 2, False),
                  lambda dev: (randn(2, 5, 4, 8, device=dev), randn(2, 5, 2, 8, device=dev, seed=1), *tables(dev)),
                  (S(2), S(2), R, R), (S(2), S(2)), (S(2), S(2)), diff=(0, 1)), mesh)
    # the functional form takes plain tables as replicated
    run_case(Case("apply_rotary, plain cos/sin", lambda q, k, c, s: apply_rotary(q, k, c, s),
                  lambda dev: (randn(2, 4, 5, 8, device=dev), randn(2, 2, 5, 8, device=dev, seed=1), *tables(dev)),
                  (S(1), S(1), None, None), (S(1), S(1)), (S(1), S(1)), diff=(0, 1)), mesh)


def activations(ctx: Ctx) -> None:
    S, R, P = _placements()
    mesh = ctx.mesh()
    for d in (1, 2):  # rows, and the intermediate dim (column-parallel gate/up)
        run_case(Case(f"gated_act Shard({d})", lambda g, u: ops.gated_act_fwd(g, u, "silu", 1.0),
                      lambda dev: (randn(2, 5, 6, device=dev), randn(2, 5, 6, device=dev, seed=1)),
                      (S(d), S(d)), (S(d),), (S(d), S(d))), mesh)
    run_case(Case("gated_act_packed Shard(1)", lambda gu: ops.gated_act_packed_fwd(gu, "gelu_tanh", 0.5),
                  lambda dev: (randn(2, 5, 12, device=dev),), (S(1),), (S(1),), (S(1),)), mesh)
    run_case(Case("bias_act rows", lambda x, b: ops.bias_act_fwd(x, b, "gelu"),
                  lambda dev: (randn(2, 5, 6, device=dev), randn(6, device=dev, seed=1)),
                  (S(1), R), (S(1),), (S(1), P)), mesh)
    run_case(Case("bias_act columns", lambda x, b: ops.bias_act_fwd(x, b, "gelu"),
                  lambda dev: (randn(2, 5, 6, device=dev), randn(6, device=dev, seed=1)),
                  (S(2), S(0)), (S(2),), (S(2), S(0))), mesh)


def down(ctx: Ctx) -> None:
    S, R, P = _placements()
    mesh = ctx.mesh()

    def args(dev: torch.device, bias: bool) -> tuple:
        return (randn(2, 5, 6, device=dev), randn(2, 5, 6, device=dev, seed=1), randn(8, 6, device=dev, seed=2),
                randn(8, device=dev, seed=3) if bias else None)

    run_case(Case("gated_down rows", lambda g, u, w, b: ops.gated_down_fwd(g, u, w, b, "silu", 1.0, 0.5),
                  lambda dev: args(dev, True), (S(1), S(1), R, R), (S(1),), (S(1), S(1), P, P)), mesh)
    # tensor parallelism: gate/up column-sharded, the down weight row-sharded, y a Partial sum
    run_case(Case("gated_down intermediate", lambda g, u, w, b: ops.gated_down_fwd(g, u, w, b, "silu", 1.0, 0.5),
                  lambda dev: args(dev, False), (S(2), S(2), S(1), None), (P,), (S(2), S(2), S(1))), mesh)
    run_case(Case("gated_down_packed rows",
                  lambda gu, w, b: ops.gated_down_packed_fwd(gu, w, b, "silu", 1.0, 1.0),
                  lambda dev: (randn(2, 5, 12, device=dev), randn(8, 6, device=dev, seed=2), randn(8, device=dev)),
                  (S(0), R, R), (S(0),), (S(0), P, P)), mesh)


def embeddings(ctx: Ctx) -> None:
    from kernel_pytorch.functional import embedding

    S, R, P = _placements()
    mesh = ctx.mesh()

    def args(dev: torch.device) -> tuple:
        ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(4)).to(dev)
        return ids, randn(11, 8, device=dev, seed=1)  # 11 rows: 6 / 5 over two ranks

    for d in (0, 1):
        run_case(Case(f"embedding batch Shard({d})", lambda i, w: ops.embedding_fwd(i, w, 3, False), args,
                      (S(d), R), (S(d),), (None, P)), mesh)
    run_case(Case("embedding columns", lambda i, w: ops.embedding_fwd(i, w, -1, True), args,
                  (R, S(1)), (S(2),), (None, S(1))), mesh)
    # tensor parallelism's vocabulary-sharded table: functional.embedding's masked lookup, a Partial sum
    for ids in (None, R):
        run_case(Case(f"embedding vocabulary, ids {ids or 'plain'}", lambda i, w: embedding(i, w, padding_idx=7), args,
                      (ids, S(0)), (P,), (None, S(0))), mesh)


def losses(ctx: Ctx) -> None:
    S, R, P = _placements()
    mesh = ctx.mesh()

    def args(dev: torch.device) -> tuple:
        target = torch.randint(0, 11, (6,), generator=torch.Generator().manual_seed(5)).to(dev)
        target[2] = -100
        return randn(6, 11, device=dev), target

    for reduction, loss in (("sum", P), ("none", S(0))):
        run_case(Case(f"cross_entropy {reduction}",
                      lambda z, t, r=reduction: ops.cross_entropy_fwd(z, t, None, -100, r, 0.1, 1e-4, 0.0, True, None,
                                                                       True),
                      args, (S(0), S(0)), (loss, S(0), S(0), S(0)), (S(0),)), mesh)
        run_case(Case(f"fused_linear_cross_entropy {reduction}",
                      lambda x, w, t, r=reduction: ops.fused_linear_cross_entropy_fwd(
                          x, w, t, None, None, -100, r, 0.0, 0.0, 0.0, True, True, False, None, False),
                      lambda dev: (randn(6, 8, device=dev), randn(11, 8, device=dev, seed=1), args(dev)[1]),
                      (S(0), R, S(0)), (loss, S(0), None, None, None, None), (S(0), P)), mesh)


def attention(ctx: Ctx) -> None:
    from kernel_pytorch.functional import attention as attend

    S, _, _ = _placements()
    mesh = ctx.mesh()

    def qkv(dev: torch.device) -> tuple:
        return randn(2, 4, 5, 8, device=dev), randn(2, 2, 5, 8, device=dev, seed=1), randn(2, 2, 5, 8, device=dev,
                                                                                              seed=2)

    run_case(Case("attention heads, causal, GQA", lambda q, k, v: attend(q, k, v, is_causal=True), qkv,
                  (S(1), S(1), S(1)), (S(1),), (S(1), S(1), S(1))), mesh)
    # a padding mask per batch row: each rank keeps its rows' part
    run_case(Case("attention batch, padding mask, ALiBi",
                  lambda q, k, v: attend(q, k, v, mask=torch.tensor([[1, 1, 1, 0, 0], [1] * 5], dtype=torch.bool,
                                                                    device=q.device)[:, None, None],
                                         alibi_slopes=torch.tensor([0.5, 0.25, 0.1, 0.05], device=q.device),
                                         backend="sdpa"),
                  qkv, (S(0), S(0), S(0)), (S(0),), (S(0), S(0), S(0))), mesh)


def refused(ctx: Ctx) -> None:
    """Placements no rule takes raise, naming the op, the arguments and their placements."""
    from torch.distributed.tensor import distribute_tensor

    from kernel_pytorch.functional import attention as attend

    S, R, _ = _placements()
    mesh = ctx.mesh()
    dev = ctx.device

    def dt(t: torch.Tensor, p) -> torch.Tensor:  # noqa: ANN001
        return distribute_tensor(t, mesh, [p])

    x, w = randn(2, 5, 8, device=dev), randn(8, device=dev)
    with pytest.raises(RuntimeError, match=r"kernel_pytorch::rms_norm_fwd has no sharding rule for x "
                       r"\(Shard\(dim=2\),\), weight \(Replicate\(\),\) on mesh dimension 0.*dim other than the last"):
        ops.rms_norm_fwd(dt(x, S(2)), dt(w, R), 1e-6, 0.0, "llama")
    if ctx.world > 1:  # a dim smaller than the mesh: DTensor would gather it rather than leave a rank empty
        with pytest.raises(RuntimeError, match=rf"rms_norm_fwd: x is sharded on its dim 1 of 1 over {ctx.world} ranks"):
            ops.rms_norm_fwd(dt(x[:, :1], S(1)), dt(w, R), 1e-6, 0.0, "llama")
    with pytest.raises(RuntimeError, match=r"gated_act_packed_fwd has no sharding rule for gate_up \(Shard\(dim=2\),\)"
                       r".*shard gate and up apart"):
        ops.gated_act_packed_fwd(dt(randn(2, 5, 12, device=dev), S(2)), "silu", 1.0)
    q = randn(2, 4, 5, 8, device=dev)
    with pytest.raises(RuntimeError, match=r"rope_fwd has no sharding rule for q \(Shard\(dim=3\),\).*heads dim"):
        ops.rope_fwd(dt(q, S(3)), dt(q, S(3)), dt(randn(5, 8, device=dev), R), dt(randn(5, 8, device=dev), R), None,
                     False, 1, False)
    with pytest.raises(RuntimeError, match=r"embedding_fwd has no sharding rule for indices \(Replicate\(\),\), weight "
                       r"\(Shard\(dim=0\),\).*functional.embedding"):
        ops.embedding_fwd(dt(torch.zeros(2, 5, dtype=torch.long, device=dev), R), dt(randn(11, 8, device=dev), S(0)),
                          -1, False)
    target = torch.zeros(6, dtype=torch.long, device=dev)
    with pytest.raises(RuntimeError, match=r"cross_entropy_fwd has no sharding rule.*'mean' divides by a count"):
        ops.cross_entropy_fwd(dt(randn(6, 11, device=dev), S(0)), dt(target, S(0)), None, -100, "mean", 0.0, 0.0, 0.0,
                              True, None, False)
    g = randn(2, 5, 6, device=dev)
    with pytest.raises(RuntimeError, match=r"gated_down_fwd has no sharding rule.*bias \(Replicate\(\),\)"):
        ops.gated_down_fwd(dt(g, S(2)), dt(g, S(2)), dt(randn(8, 6, device=dev), S(1)), dt(randn(8, device=dev), R),
                           "silu", 1.0, 1.0)
    with pytest.raises(ValueError, match=r"k must be a DTensor on q's mesh placed as q"):
        attend(dt(q, S(1)), dt(q, R), dt(q, S(1)))
    with pytest.raises(ValueError, match=r"scale_grad_by_freq=True with a vocabulary-sharded"):
        from kernel_pytorch.functional import embedding

        embedding(torch.zeros(2, 5, dtype=torch.long, device=dev), dt(randn(11, 8, device=dev), S(0)),
                  scale_grad_by_freq=True)


def setup_rank(ctx: Ctx) -> None:
    import kernel_pytorch.ops  # noqa: F401  (registers the ops and their sharding rules)


SCENARIOS = ("norms", "rope", "activations", "down", "embeddings", "losses", "attention", "refused")


def _run(tmp_path_factory, world: int, backend: str = "gloo") -> dict:  # noqa: ANN001
    return run_world(__name__, SCENARIOS, world=world, tmp=tmp_path_factory.mktemp(f"sharding{world}{backend}"),
                     timeout_s=TIMEOUT_S, backend=backend)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:  # noqa: ANN001
    return _run(tmp_path_factory, 2)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ops_on_dtensors(outcomes, scenario: str) -> None:
    check(outcomes[scenario])


@pytest.fixture(scope="module")
def gpu_outcomes(tmp_path_factory, request) -> dict:  # noqa: ANN001
    return _run(tmp_path_factory, request.param, "nccl")


@pytest.mark.cuda
@pytest.mark.parametrize("gpu_outcomes", [1, 2], indirect=True, ids=["1gpu", "2gpus"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ops_on_dtensors_gpu(gpu_outcomes, scenario: str) -> None:
    """The same on CUDA (the Triton kernels on the local shards), NCCL on one GPU and on two."""
    check(gpu_outcomes[scenario])
