"""functional.vocab_parallel_linear_cross_entropy and nn.VocabParallelLinearCrossEntropyLoss across processes
(gloo on CPU, worlds of 2 and 4; NCCL where there are GPUs): loss and gradients (x whole, the weight's and
bias's shards against the matching rows of the unsharded gradients) as the single-process fused loss, under
the tolerance table in fp64 and fp32 and the fp64-derived budget in bf16, for a vocabulary of 37 split unevenly
(torch's Shard(0): 19 / 18 and 10 / 10 / 10 / 7; plain shards of any sizes), ignored rows, z-loss, label
smoothing, soft-capping, token scales, every reduction and all rows ignored; a 2-D mesh; the head after
ColwiseParallel; the collectives carrying O(rows) values, never the logits; the chunked kernels (Triton's
interpreter on CPU); the errors naming the argument. World size 1 runs without processes.

The processes are spawned once per world by tests/distributed.py, under a timeout."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kernel_pytorch.functional.vocab_parallel_cross_entropy as VPF
from kernel_pytorch.functional import fused_linear_cross_entropy, vocab_parallel_linear_cross_entropy
from kernel_pytorch.nn import VocabParallelLinearCrossEntropyLoss
from kernel_pytorch.ops import tuning
from kernel_pytorch.tolerances import compare, fp64_budget
from tests.distributed import Ctx, check, run_world
from tests.grid import device_under_test
from tests.ops.cross_entropy_helpers import eager_loss

TIMEOUT_S = 120
IGNORE = -100
LEAD, H, V = (2, 5), 8, 37  # 10 rows; 37 classes split unevenly over 2 and 4 ranks

# name -> (reduction, options, bias, token scales)
CASES = {
    "mean": ("mean", {}, False, False),
    "mean+zloss+smoothing+softcap": ("mean", {"lse_square_scale": 1e-2, "label_smoothing": 0.1, "softcap": 4.0},
                                     True, False),
    "sum+smoothing": ("sum", {"label_smoothing": 0.2}, False, True),
    "none+zloss": ("none", {"lse_square_scale": 1e-3}, True, True),
}


def _inputs(dtype: torch.dtype, device: torch.device, bias: bool = False, seed: int = 0, lead: tuple = LEAD,
            v: int = V) -> tuple:
    """The same (x, weight, bias, target, token_scale, upstream gradients by reduction) on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, H, generator=g)
    w = torch.randn(v, H, generator=g) * H ** -0.5
    b = torch.randn(v, generator=g) * 0.1 if bias else None
    t = torch.randint(0, v, lead, generator=g)
    t.view(-1)[[1, 6]] = IGNORE
    u = torch.rand(lead, generator=g) + 0.5
    dloss = {"none": torch.rand(lead, generator=g) + 0.5, "mean": torch.tensor(1.5), "sum": torch.tensor(0.75)}
    to = {k: d.to(device) for k, d in dloss.items()}
    return (x.to(dtype).to(device), w.to(dtype).to(device), b.to(dtype).to(device) if b is not None else None,
            t.to(device), u.to(device), to)


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.detach().clone().requires_grad_() if t is not None else None


def _grads(loss: torch.Tensor, dloss: torch.Tensor, *leaves: torch.Tensor | None) -> list[torch.Tensor | None]:
    loss.backward(dloss.to(loss.dtype))
    return [p.grad if p is not None else None for p in leaves]


def _unsharded(x, w, b, t, u, dloss, use_u: bool, **kw) -> tuple:
    """The single-process fused loss and its gradients."""
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    loss = fused_linear_cross_entropy(xs, ws, t, bs, token_scale=u if use_u else None, ignore_index=IGNORE, **kw)
    return loss.detach(), *_grads(loss, dloss, xs, ws, bs)


def _sharded(ctx: Ctx, mesh, x, w, b, t, u, dloss, use_u: bool, **kw) -> tuple:
    """The vocabulary-parallel loss over DTensor shards, and its gradients (x whole; the DTensors' local rows)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    xs = _leaf(x)
    wd = distribute_tensor(w.detach().clone(), mesh, [Shard(0)]).requires_grad_()
    bd = distribute_tensor(b.detach().clone(), mesh, [Shard(0)]).requires_grad_() if b is not None else None
    loss = vocab_parallel_linear_cross_entropy(xs, wd, t, bd, token_scale=u if use_u else None, ignore_index=IGNORE,
                                               **kw)
    gx, gw, gb = _grads(loss, dloss, xs, wd, bd)
    assert gw.placements == wd.placements
    return loss.detach(), gx, gw.to_local(), gb.to_local() if gb is not None else None


def _assert_matches(ctx: Ctx, got: tuple, expected: tuple, what: str) -> None:
    """Loss and grad_x whole; the weight's and bias's gradients: this rank's rows of the unsharded ones."""
    names = ("loss", "grad_x", "grad_w", "grad_b")
    for name, a, e in zip(names, got, expected):
        assert (a is None) == (e is None), (what, name)
        if a is None:
            continue
        if name in ("grad_w", "grad_b"):
            e = e.chunk(ctx.world)[ctx.rank] if ctx.rank < len(e.chunk(ctx.world)) else e[:0]
        result = compare(a, e)
        assert result.passed, result.message(f"{what}: {name}")


def parity(ctx: Ctx) -> None:
    """Every case in fp64 and fp32 against the single-process loss under the tolerance table."""
    mesh = ctx.mesh()
    for dtype in (torch.float64, torch.float32):
        for case, (reduction, opts, bias, use_u) in CASES.items():
            x, w, b, t, u, dl = _inputs(dtype, ctx.device, bias)
            kw = dict(reduction=reduction, **opts)
            expected = _unsharded(x, w, b, t, u, dl[reduction], use_u, **kw)
            got = _sharded(ctx, mesh, x, w, b, t, u, dl[reduction], use_u, **kw)
            _assert_matches(ctx, got, expected, f"{case} {dtype}")


def bf16_budget(ctx: Ctx) -> None:
    """bf16: within the fp64-derived budget (2x PyTorch's own bf16 linear + cross-entropy's error)."""
    mesh = ctx.mesh()
    reduction, opts = "mean", {"lse_square_scale": 1e-3, "label_smoothing": 0.1}
    x, w, b, t, u, dl = _inputs(torch.bfloat16, ctx.device)
    got = _sharded(ctx, mesh, x, w, b, t, u, dl[reduction], False, reduction=reduction, **opts)
    grads = {}
    for name, dtype in (("eager", torch.bfloat16), ("ref64", torch.float64)):
        xs, ws = _leaf(x.to(dtype)), _leaf(w.to(dtype))
        loss = eager_loss(torch.nn.functional.linear(xs, ws), t, None, reduction, **opts)
        gx, gw = _grads(loss, dl[reduction], xs, ws)
        grads[name] = {"loss": loss.detach(), "grad_x": gx, "grad_w": gw.chunk(ctx.world)[ctx.rank]}
    for name in ("loss", "grad_x", "grad_w"):
        a = got[("loss", "grad_x", "grad_w").index(name)]
        result = fp64_budget(a, grads["eager"][name], grads["ref64"][name])
        assert result.passed, result.message(f"bf16 {name}")


def all_ignored(ctx: Ctx) -> None:
    """Every target ignore_index: "mean" NaN, "sum" 0, zero gradients, on every rank."""
    mesh = ctx.mesh()
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device)
    t = torch.full_like(t, IGNORE)
    for reduction in ("mean", "sum"):
        loss, gx, gw, _ = _sharded(ctx, mesh, x, w, None, t, u, dl[reduction], False, reduction=reduction,
                                   lse_square_scale=1e-2)
        assert torch.isnan(loss) if reduction == "mean" else loss == 0
        assert not gx.any() and not gw.any()


def plain_shards(ctx: Ctx) -> None:
    """Plain local rows of any sizes with their group: a ProcessGroup (sizes gathered, or given), a 1-D mesh."""
    import torch.distributed as dist

    sizes = {2: [5, 32], 4: [9, 1, 20, 7]}[ctx.world]
    start = sum(sizes[:ctx.rank])
    rows = slice(start, start + sizes[ctx.rank])
    reduction, opts, _, _ = CASES["mean+zloss+smoothing+softcap"]
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, bias=True)
    expected = _unsharded(x, w, b, t, u, dl[reduction], True, reduction=reduction, **opts)
    for how, kw in (("gathered", {"group": dist.group.WORLD}), ("given", {"group": dist.group.WORLD,
                                                                            "shard_sizes": sizes}),
                    ("mesh", {"group": ctx.mesh(names=("tp",)), "mesh_dim": "tp"})):
        xs, ws, bs = _leaf(x), _leaf(w[rows]), _leaf(b[rows])
        loss = vocab_parallel_linear_cross_entropy(xs, ws, t, bs, token_scale=u, ignore_index=IGNORE,
                                                   reduction=reduction, **opts, **kw)
        got = (loss.detach(), *_grads(loss, dl[reduction], xs, ws, bs))
        for name, a, e in zip(("loss", "grad_x", "grad_w", "grad_b"), got,
                              (expected[0], expected[1], expected[2][rows], expected[3][rows])):
            assert compare(a, e).passed, compare(a, e).message(f"{how}: {name}")


def mesh_2d(ctx: Ctx) -> None:
    """A (dp 2, tp 2) mesh: weight (Replicate, Shard(0)) found by its Shard(0) and named by mesh_dim; each dp
    rank's own rows."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = ctx.mesh((2, 2), ("dp", "tp"))
    dp, tp = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, seed=0)
    x, t = x + dp, (t + dp * 3).clamp(max=V - 1).masked_fill(t == IGNORE, IGNORE)  # another batch per dp rank
    expected = _unsharded(x, w, None, t, u, dl["mean"], False, label_smoothing=0.1)
    xs = _leaf(x)
    wd = distribute_tensor(w.clone(), mesh, [Replicate(), Shard(0)]).requires_grad_()
    loss = vocab_parallel_linear_cross_entropy(xs, wd, t, mesh_dim="tp", ignore_index=IGNORE, label_smoothing=0.1)
    gx, gw = _grads(loss, dl["mean"], xs, wd)
    for name, a, e in (("loss", loss.detach(), expected[0]), ("grad_x", gx, expected[1]),
                       ("grad_w", gw.to_local(), expected[2].chunk(2)[tp])):
        assert compare(a, e).passed, compare(a, e).message(f"2-D mesh: {name}")


def colwise_module(ctx: Ctx) -> None:
    """The nn loss on the head's weight after parallelize_module(ColwiseParallel): DTensor gradients of its rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = ctx.mesh()
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, bias=True)
    model = torch.nn.ModuleDict({"lm_head": torch.nn.Linear(H, V, device=ctx.device)})
    with torch.no_grad():
        model.lm_head.weight.copy_(w)
        model.lm_head.bias.copy_(b)
    parallelize_module(model, mesh, {"lm_head": ColwiseParallel(use_local_output=False)})
    loss_fn = VocabParallelLinearCrossEntropyLoss(ignore_index=IGNORE, lse_square_scale=1e-2, return_z_loss=True)
    xs = _leaf(x)
    out = loss_fn(xs, model.lm_head.weight, t, model.lm_head.bias)
    expected = _unsharded(x, w, b, t, u, dl["mean"], False, lse_square_scale=1e-2)
    head = model.lm_head
    got = (out.loss.detach(), *_grads(out.loss, dl["mean"], xs), head.weight.grad.to_local(), head.bias.grad.to_local())
    _assert_matches(ctx, got, expected, "ColwiseParallel")
    assert out.z_loss is not None and out.z_loss.requires_grad is False


class CollectiveSpy(TorchDispatchMode):
    """Records (op name, elements sent) of every collective dispatched inside it."""

    KINDS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "all_to_all")

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if any(k in name for k in self.KINDS):
            sent = args[0] if isinstance(args[0], torch.Tensor) else args[0][0]
            self.calls.append((name, sent.numel()))
        return func(*args, **(kwargs or {}))


def no_logits_gathered(ctx: Ctx) -> None:
    """Forward: two all-reduces of one value per row (max) and three per row (sums with label smoothing);
    backward: one of grad_x (rows x H). Nothing of rows x classes, and no gather."""
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = ctx.mesh()
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, v=64)
    n = x.numel() // H
    xs = _leaf(x)
    wd = distribute_tensor(w, mesh, [Shard(0)]).requires_grad_()
    with CollectiveSpy() as spy:
        loss = vocab_parallel_linear_cross_entropy(xs, wd, t, label_smoothing=0.1, ignore_index=IGNORE)
        forward = list(spy.calls)
        loss.backward()
    backward = spy.calls[len(forward):]
    assert [c[1] for c in forward] == [n, 3 * n], forward
    assert [c[1] for c in backward] == [n * H], backward
    assert all("all_reduce" in name for name, _ in spy.calls), spy.calls


def kernel_path(ctx: Ctx) -> None:
    """The chunked Triton path (interpreted on CPU), two or three chunks per rank: as the unsharded loss."""
    resolve = VPF._resolve
    VPF._resolve = lambda *args: "eager"
    try:
        with tuning.changed("fused_linear_cross_entropy", chunk_bytes=4 * 19 * 4, min_rows=1, row_align=1):
            for case in ("mean+zloss+smoothing+softcap", "none+zloss"):
                reduction, opts, bias, use_u = CASES[case]
                x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, bias)
                kw = dict(reduction=reduction, **opts)
                expected = _unsharded(x, w, b, t, u, dl[reduction], use_u, **kw)
                got = _sharded(ctx, ctx.mesh(), x, w, b, t, u, dl[reduction], use_u, **kw)
                _assert_matches(ctx, got, expected, f"kernels: {case}")
    finally:
        VPF._resolve = resolve


def bad_inputs(ctx: Ctx) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = ctx.mesh()
    x, w, b, t, u, dl = _inputs(torch.float32, ctx.device, bias=True)
    wd = distribute_tensor(w, mesh, [Shard(0)])
    cases = [
        (dict(weight=distribute_tensor(w, mesh, [Shard(1)])), r"weight is a DTensor with placements \(Shard\(dim=1\)"),
        (dict(weight=distribute_tensor(w, mesh, [Replicate()])), "weight is a DTensor with placements"),
        (dict(x=distribute_tensor(x, mesh, [Shard(0)])), r"x is a DTensor with placements \(Shard\(dim=0\),\)"),
        (dict(mesh_dim="tp"), "mesh_dim 'tp' is not a dim of weight's device mesh"),
        (dict(bias=b), "bias must be a DTensor of weight's mesh"),
        (dict(weight=w), "group: weight is a plain tensor"),
        (dict(weight=w, group=mesh, mesh_dim="nope"), "mesh_dim 'nope' is not a dim of group"),
        (dict(weight=w, group=dist.group.WORLD, shard_sizes=[V]), "shard_sizes must list"),
        (dict(weight=w, group="tp"), "group must be a ProcessGroup, a DeviceMesh or None"),
        (dict(group=dist.group.WORLD), "group: weight is a DTensor"),
        (dict(target=torch.full_like(t, V)), f"target {V} at index .* out of range for {V} classes"),
        (dict(return_token_accuracy=True), "return_token_accuracy: the vocabulary-parallel loss returns"),
        (dict(ce_weight=torch.ones(V)), r"vocab_parallel_linear_cross_entropy\(\) got an unexpected keyword "
                                        "argument 'ce_weight'"),
    ]
    for change, message in cases:
        args = dict(x=x, weight=wd, target=t, bias=None, ignore_index=IGNORE) | change
        try:
            vocab_parallel_linear_cross_entropy(**args)
        except (ValueError, TypeError) as e:
            assert re.search(message, str(e)), (change, message, str(e))
        else:
            raise AssertionError(f"no error for {message!r}")
    with pytest.raises(ValueError, match="ce_weight"):
        VocabParallelLinearCrossEntropyLoss(ce_weight=torch.ones(V))


SCENARIOS = ("parity", "bf16_budget", "all_ignored", "plain_shards", "colwise_module", "no_logits_gathered",
             "kernel_path", "bad_inputs")


@pytest.fixture(scope="module")
def world2(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=2, tmp=tmp_path_factory.mktemp("vp2"), timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def world4(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, (*SCENARIOS, "mesh_2d"), world=4, tmp=tmp_path_factory.mktemp("vp4"),
                     timeout_s=TIMEOUT_S)


@pytest.fixture(scope="module")
def nccl2(tmp_path_factory) -> dict[str, dict[int, str | None]]:
    return run_world(__name__, SCENARIOS, world=2, tmp=tmp_path_factory.mktemp("vpn"), timeout_s=TIMEOUT_S,
                     backend="nccl")


@pytest.mark.parametrize("name", SCENARIOS)
def test_world_of_2(world2, name: str) -> None:
    check(world2[name])


@pytest.mark.parametrize("name", (*SCENARIOS, "mesh_2d"))
def test_world_of_4(world4, name: str) -> None:
    check(world4[name])


@pytest.mark.cuda
@pytest.mark.parametrize("name", SCENARIOS)
def test_nccl_world_of_2(nccl2, name: str) -> None:
    check(nccl2[name])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_world_of_1(dtype: torch.dtype) -> None:
    """No group, no process group: the fused loss over one rank's whole head (on CUDA, the chunked kernels)."""
    dev = torch.device(device_under_test())
    reduction, opts, bias, use_u = CASES["mean+zloss+smoothing+softcap"]
    x, w, b, t, u, dl = _inputs(dtype, dev, bias)
    expected = _unsharded(x, w, b, t, u, dl[reduction], use_u, reduction=reduction, **opts)
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    loss = vocab_parallel_linear_cross_entropy(xs, ws, t, bs, ignore_index=IGNORE, reduction=reduction, **opts)
    got = (loss.detach(), *_grads(loss, dl[reduction], xs, ws, bs))
    for name, a, e in zip(("loss", "grad_x", "grad_w", "grad_b"), got, expected):
        assert compare(a, e).passed, compare(a, e).message(name)
