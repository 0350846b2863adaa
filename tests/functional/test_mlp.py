"""kernel_pytorch.functional's MLP blocks: argument errors, every backend against the reference (output and
every gradient), the whole-block function (forced onto the interpreter here) against the reference and
HF's eager composition, what it saves for the backward, frozen parameters, a second backward, the paths
that compose the block instead (inference, autocast, mixed dtypes), and Falcon-H1's gate and down
multipliers on every path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import _dispatch as dispatch_mod
from kernel_pytorch.functional import activation
from kernel_pytorch.functional import mlp as mlp_mod
from kernel_pytorch.ops import tuning
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
N, H, I = 6, 16, 24  # tokens, hidden, intermediate  # noqa: E741


@pytest.fixture
def eager_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager launcher path of CUDA (the whole-block function), run on the interpreter on CPU."""
    for module in (mlp_mod, activation):
        monkeypatch.setattr(module, "_resolve", lambda backend, op, x, compiling: "eager")


def _params(dtype=torch.float32, bias=False, packed=False):
    scale = H ** -0.5
    p = {"x": randn(2, N // 2, H, dtype=dtype, device=DEV)}
    if packed:
        p["gate_up_weight"] = randn(2 * I, H, dtype=dtype, device=DEV, scale=scale)
    else:
        p["gate_weight"] = randn(I, H, dtype=dtype, device=DEV, scale=scale)
        p["up_weight"] = randn(I, H, dtype=dtype, device=DEV, scale=scale)
    p["down_weight"] = randn(H, I, dtype=dtype, device=DEV, scale=I ** -0.5)
    if bias:
        for name in [k for k in p if k.endswith("_weight")]:
            p[name.replace("weight", "bias")] = randn(p[name].shape[0], dtype=dtype, device=DEV, scale=0.1)
    return {k: v.requires_grad_() for k, v in p.items()}


def _ours(p, act="silu", backend="auto", **multipliers):
    kw = {k: v for k, v in p.items() if k.endswith("_bias")} | multipliers
    if "gate_up_weight" in p:
        return F.gated_mlp_packed(p["x"], p["gate_up_weight"], p["down_weight"], act, backend=backend, **kw)
    return F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"], act, backend=backend, **kw)


def _reference(p, act="silu", **multipliers):
    kw = {k: v for k, v in p.items() if k.endswith("_bias")} | multipliers
    if "gate_up_weight" in p:
        return R.gated_mlp_packed(p["x"], p["gate_up_weight"], p["down_weight"], act, **kw)
    return R.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"], act, **kw)


def _hf_eager(p, act="silu", gate_multiplier=1.0, down_multiplier=1.0):
    """transformers' LlamaMLP / Phi3MLP forward, written out; with multipliers FalconH1MLP's."""
    fn = {"silu": TF.silu, "gelu": TF.gelu, "gelu_tanh": lambda t: TF.gelu(t, approximate="tanh")}[act]
    if "gate_up_weight" in p:
        gate, up = TF.linear(p["x"], p["gate_up_weight"], p.get("gate_up_bias")).chunk(2, dim=-1)
    else:
        gate = TF.linear(p["x"], p["gate_weight"], p.get("gate_bias"))
        up = TF.linear(p["x"], p["up_weight"], p.get("up_bias"))
    if gate_multiplier == down_multiplier == 1.0:
        return TF.linear(fn(gate) * up, p["down_weight"], p.get("down_bias"))
    return TF.linear(up * fn(gate * gate_multiplier), p["down_weight"], p.get("down_bias")) * down_multiplier


def _assert_same_function(p, ours_fn, want_fn, what: str) -> None:
    names = list(p)
    out, want = ours_fn(), want_fn()
    assert_close(out, want, f"{what} y")
    dy = randn(*out.shape, dtype=out.dtype, device=DEV)
    want_grads = torch.autograd.grad(want, [p[n] for n in names], dy)
    got = torch.autograd.grad(out, [p[n] for n in names], dy)
    for n, g, e in zip(names, got, want_grads):
        assert_close(g, e, f"{what} d{n}")


@pytest.mark.parametrize("packed", [False, True], ids=["split", "packed"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_backends_compute_the_reference(backend: str, bias: bool, packed: bool) -> None:
    p = _params(bias=bias, packed=packed)
    _assert_same_function(p, lambda: _ours(p, "gelu_tanh", backend), lambda: _reference(p, "gelu_tanh"), backend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["split", "packed"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_block_function_matches_reference_and_hf_eager(eager_path, bias: bool, packed: bool, dtype) -> None:
    """bf16 against the reference (fp32 math, each Linear rounded once); against HF's eager composition in
    fp32, where its GEMMs' roundings are below the table (in bf16 they are not, on CPU, for eager itself)."""
    p = _params(dtype, bias=bias, packed=packed)
    _assert_same_function(p, lambda: _ours(p), lambda: _reference(p), "vs reference")
    if dtype == torch.float32:
        _assert_same_function(p, lambda: _ours(p), lambda: _hf_eager(p), "vs HF eager")


FALCON_H1 = {"gate_multiplier": 0.7, "down_multiplier": 1.9}


@pytest.mark.parametrize("path", ["block", "op", "reference", "composed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("packed", [False, True], ids=["split", "packed"])
def test_multipliers_on_every_path(monkeypatch: pytest.MonkeyPatch, path: str, dtype, packed: bool) -> None:
    """Falcon-H1's multipliers through the whole-block function (interpreter), the gated_down op, the
    reference backend and the composed block (autocast's path): output and every gradient against the
    reference; fp32 also against FalconH1MLP's eager forward written out."""
    if path in ("block", "op"):  # each path forced: on CUDA "auto" in eager takes the block, on CPU the op
        forced = "eager" if path == "block" else "op"
        for module in (mlp_mod, activation):
            monkeypatch.setattr(module, "_resolve", lambda backend, op, x, compiling, f=forced: f)
    if path == "composed":
        monkeypatch.setattr(dispatch_mod, "_autocast_on", lambda device_type: True)
    calls = []
    monkeypatch.setattr(mlp_mod._GatedMLPBlock, "apply", lambda *a, f=mlp_mod._GatedMLPBlock.apply: calls.append(a)
                        or f(*a))
    backend = "reference" if path == "reference" else "auto"
    p = _params(dtype, bias=True, packed=packed)
    ours = lambda: _ours(p, "silu", backend, **FALCON_H1)  # noqa: E731
    if dtype == torch.float32:
        _assert_same_function(p, ours, lambda: _reference(p, "silu", **FALCON_H1), f"{path} vs reference")
        _assert_same_function(p, ours, lambda: _hf_eager(p, "silu", **FALCON_H1), f"{path} vs FalconH1MLP")
    else:
        _assert_within_fp64_budget(p, ours, FALCON_H1, path)
    assert bool(calls) == (path == "block")


def _assert_within_fp64_budget(p, ours_fn, multipliers: dict, what: str) -> None:
    """Output and every gradient within the fp64 budget of the reference in p's dtype: the weight
    gradients sum rows with cancellation, and under the interpreter every extra rounding the multipliers
    bring (gate * m, y * m, dy * m) is a truncation where the GPU rounds to nearest as the reference does."""
    names = list(p)
    wide = {n: t.detach().double().requires_grad_() for n, t in p.items()}
    out, want, want64 = ours_fn(), _reference(p, "silu", **multipliers), _reference(wide, "silu", **multipliers)
    assert_budget(out, want, want64, f"{what} y")
    dy = randn(*out.shape, dtype=out.dtype, device=DEV)
    grads = zip(names, torch.autograd.grad(out, [p[n] for n in names], dy),
                torch.autograd.grad(want, [p[n] for n in names], dy),
                torch.autograd.grad(want64, [wide[n] for n in names], dy.double()))
    for n, g, e, e64 in grads:
        assert_budget(g, e, e64, f"{what} d{n}")


def test_multipliers_keep_what_the_fused_paths_save(eager_path) -> None:
    """The whole-block function and the gated_down op keep x and gate/up alone with multipliers too."""
    for p, widths in ((_params(packed=True), [(N, H), (N, 2 * I)]), (_params(), [(N, H), (N, I), (N, I)])):
        assert _saved_activations(lambda p=p: _ours(p, **FALCON_H1)) == widths


def test_op_path_with_multipliers_saves_x_gate_up_not_h() -> None:
    split = _params(bias=True)
    assert _saved_activations(lambda: _ours(split, **FALCON_H1)) == [(N, H), (N, I), (N, I)]


@pytest.mark.parametrize("align", [8, 16], ids=["even", "uneven"])
@pytest.mark.parametrize("packed", [False, True], ids=["split", "packed"])
def test_block_backward_in_dh_column_chunks(eager_path, packed: bool, align: int) -> None:
    """dh made in column chunks (spans of 8 or 16 of I = 24 columns, the last one short) gives the
    reference's output and every gradient, bias and frozen W_down (no h recomputed) included."""
    with tuning.changed("mlp", dh_chunk_bytes=N * 8 * 2, dh_chunk_align=align):
        spans = mlp_mod.dh_column_spans(N, I, 2)
        assert len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == I
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and all((b - a) % align == 0 for a, b in spans[:-1])
        p = _params(torch.bfloat16, bias=True, packed=packed)
        _assert_same_function(p, lambda: _ours(p), lambda: _reference(p), "chunked")
        p32 = _params(bias=True, packed=packed)  # the multipliers in every chunk: fp32, by the table
        _assert_same_function(p32, lambda: _ours(p32, **FALCON_H1), lambda: _reference(p32, **FALCON_H1),
                              "chunked, multipliers")
        # frozen W_down: the bf16 weight gradients sum rows with cancellation, so they are judged by the fp64
        # budget (the GPU's GEMMs sum in another order than the reference's)
        p["down_weight"].requires_grad_(False)
        frozen = [n for n in p if n != "down_weight"]
        wide = {n: t.detach().double().requires_grad_(n != "down_weight") for n, t in p.items()}
        out, want, want64 = _ours(p), _reference(p), _reference(wide)
        dy = randn(*out.shape, dtype=out.dtype, device=DEV)
        got = torch.autograd.grad(out, [p[n] for n in frozen], dy)
        eager = torch.autograd.grad(want, [p[n] for n in frozen], dy)
        exact = torch.autograd.grad(want64, [wide[n] for n in frozen], dy.double())
        for n, g, e, e64 in zip(frozen, got, eager, exact):
            assert_budget(g, e, e64, f"chunked, frozen W_down: d{n}")


def test_dh_column_spans_at_llama_3_8b() -> None:
    """16384 tokens x 14336 in bf16 (448 MiB of dh): four chunks of 3584 columns; a small dh is one."""
    assert mlp_mod.dh_column_spans(16384, 14336, 2) == [(0, 3584), (3584, 7168), (7168, 10752), (10752, 14336)]
    assert mlp_mod.dh_column_spans(8192, 5632, 2) == [(0, 5632)]


def _saved_activations(fn) -> list[tuple[int, ...]]:
    """Shapes of the tensors with N token rows that autograd keeps from the forward for the backward."""
    shapes = []

    def pack(t):
        if t.dim() >= 2 and t.numel() // t.shape[-1] == N:
            shapes.append(tuple(t.reshape(-1, t.shape[-1]).shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sorted(shapes)


def test_block_saves_x_and_the_gate_up_outputs_only(eager_path) -> None:
    p = _params(packed=True)
    assert _saved_activations(lambda: _ours(p)) == [(N, H), (N, 2 * I)]
    split = _params()
    assert _saved_activations(lambda: _ours(split)) == [(N, H), (N, I), (N, I)]
    # HF's eager MLP keeps more: x (twice, once per projection), gate, up, act(gate), h
    assert len(_saved_activations(lambda: _hf_eager(split))) > 3


def test_compiled_calls_take_the_gated_down_op_and_exports_do_not() -> None:
    """Under torch.compile the op path keeps gated_down (torch.compiler.is_exporting() reads True
    inside Dynamo before torch 2.14, so it cannot tell compile from export); export composes."""
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 8))

    def flags(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tensor([float(mlp_mod._exporting()), float(mlp_mod._recompute_h(x, (w, None)))]) + 0 * x.sum()

    assert torch.compile(flags, fullgraph=True)(x, w).tolist() == [0.0, 1.0]

    class Flags(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = w

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return flags(x, self.w)

    assert torch.export.export(Flags(), (x,), strict=False).module()(x).tolist() == [1.0, 0.0]


@pytest.mark.parametrize("act", ["silu", "gelu", "relu"])
def test_op_path_saves_x_gate_up_not_h(act: str) -> None:
    """The registered-op path (CPU here, compile anywhere): gated_down recomputes h in the backward,
    so autograd keeps x (once: the split projections are one function, functional/linears.py) and gate,
    up (gate_up), never h; output and every gradient are the reference's."""
    split, packed = _params(bias=True), _params(packed=True)
    assert _saved_activations(lambda: _ours(split, act)) == [(N, H), (N, I), (N, I)]
    assert _saved_activations(lambda: _ours(packed, act)) == [(N, H), (N, 2 * I)]
    for p in (split, packed):
        _assert_same_function(p, lambda p=p: _ours(p, act), lambda p=p: _reference(p, act), f"op path {act}")
    with torch.no_grad():  # inference composes the block: nothing to save
        assert_close(_ours(split, act), _reference(split, act), "no_grad")


def test_frozen_parameters_get_no_gradient(eager_path) -> None:
    p = _params(bias=True, packed=True)
    for name in ("gate_up_weight", "down_bias"):
        p[name].requires_grad_(False)
    out = _ours(p)
    names = [n for n in p if p[n].requires_grad]
    got = torch.autograd.grad(out, [p[n] for n in names], torch.ones_like(out))
    want = torch.autograd.grad(_reference(p), [p[n] for n in names], torch.ones_like(out))
    for n, g, e in zip(names, got, want):
        assert_close(g, e, f"d{n}")


def test_a_second_backward_raises(eager_path) -> None:
    p = _params()
    out = _ours(p)
    torch.autograd.grad(out.sum(), [p["x"]], retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out.sum(), [p["x"]])


def test_other_eager_calls_compose_the_block(eager_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inference, mixed dtypes and autocast take the composed path: same function, no block."""
    calls = []
    monkeypatch.setattr(mlp_mod._GatedMLPBlock, "apply", lambda *a: calls.append(a))
    p = _params()
    with torch.no_grad():
        assert_close(_ours(p), _reference(p), "no_grad")
    mixed = dict(p, down_weight=p["down_weight"].detach().double().requires_grad_())
    assert not mlp_mod._block(mixed["x"], (mixed["down_weight"],))
    monkeypatch.setattr(dispatch_mod, "_autocast_on", lambda device_type: True)
    _assert_same_function(p, lambda: _ours(p), lambda: _reference(p), "autocast flag")
    assert not calls


def test_mlp_matches_the_reference(eager_path) -> None:
    x = randn(2, 3, H, device=DEV).requires_grad_()
    w1, b1 = randn(I, H, device=DEV, scale=H ** -0.5).requires_grad_(), randn(I, device=DEV).requires_grad_()
    w2, b2 = randn(H, I, device=DEV, scale=I ** -0.5).requires_grad_(), randn(H, device=DEV).requires_grad_()
    p = {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    _assert_same_function(p, lambda: F.bias_act_mlp(x, w1, b1, w2, b2, "gelu"),
                          lambda: R.mlp(x, w1, b1, w2, b2, "gelu"), "mlp")
    p.pop("b1")
    _assert_same_function(p, lambda: F.bias_act_mlp(x, w1, None, w2, b2, "relu"),
                          lambda: R.mlp(x, w1, None, w2, b2, "relu"), "mlp without fc1 bias")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"][:, :3], p["up_weight"], p["down_weight"]), ValueError,
         r"gate_weight must have shape \(out_features, 16\)"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"][:5], p["down_weight"]), ValueError,
         "up_weight must have gate_weight's shape"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"][:, :5]), ValueError,
         r"down_weight must have shape \(out_features, 24\)"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"], gate_bias=randn(3)),
         ValueError, r"gate_bias must have shape \(24,\)"),
        (lambda p: F.gated_mlp_packed(p["x"], p["gate_weight"][:7], p["down_weight"]), ValueError,
         "even number"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"], "tanh"), ValueError,
         "activation must be one of"),
        (lambda p: F.bias_act_mlp(p["x"], p["gate_weight"], None, p["down_weight"].to("meta"), None, "gelu"),
         ValueError, "fc2_weight is on meta"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"],
                               gate_multiplier=float("nan")), ValueError, "gate_multiplier must be finite"),
        (lambda p: F.gated_mlp_packed(p["x"], torch.cat([p["gate_weight"], p["up_weight"]]), p["down_weight"],
                                      down_multiplier=float("-inf")), ValueError, "down_multiplier must be finite"),
        (lambda p: F.gated_mlp(p["x"], p["gate_weight"], p["up_weight"], p["down_weight"],
                               down_multiplier=torch.tensor(2.0)), TypeError, "down_multiplier must be a real number"),
    ],
)
def test_errors_name_the_argument(call, error, match) -> None:
    p = {k: v.detach() for k, v in _params().items()}
    with pytest.raises(error, match=match):
        call(p)
