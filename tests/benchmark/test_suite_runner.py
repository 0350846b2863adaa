"""The runner on a toy family: this file is a whole suite (one spec + SUITE), registered, run end to end.

A scaled multiply on attention-shaped (batch, heads, tokens, head_dim) tensors with a pure-torch
"ours": shapes are not (rows, cols), the gate samples rows of a 4-d tensor, an extra provider and a
missing Liger counterpart give their rows, and a wrong provider is failed and not timed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.module import PASSES
from kernel_pytorch.benchmark.suites import SUITES, get_suite, run_suite, runner
from kernel_pytorch.benchmark.suites import gate as G
from kernel_pytorch.benchmark.suites.providers import Impl, load_peer, resolve
from kernel_pytorch.benchmark.suites.spec import ExtraProvider, ModulePeer, OpBench, Shape, Suite, generator
from kernel_pytorch.benchmark.timer import summarize

# ---- the suite: what a new family's file holds ---------------------------------------------------


def _inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    draw = generator(device, seed)
    t = {"x": draw(shape.batch, shape.heads, shape.tokens, shape.head_dim), "scale": 1.0 + 0.1 * draw(shape.head_dim)}
    return {k: v.to(dtype) for k, v in t.items()}


def _reference(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 math, fp64 when given fp64
    return (x.to(acc) * scale.to(acc)).to(x.dtype)


def _elements(s: Shape) -> int:
    return s.batch * s.heads * s.tokens * s.head_dim


QUICK = Shape.of("toy: 2 sequences, 4 heads, 8 tokens, head_dim 16", batch=2, heads=4, tokens=8, head_dim=16)
SCALED_MUL = OpBench(
    name="scaled_mul", make_inputs=_inputs,
    arg_names=("x", "scale"), grad_names=("x", "scale"), param_names=("scale",), out_names=("y",),
    reference=_reference,
    eager=lambda x, scale: x * scale,
    ours=lambda x, scale, *, backend: _reference(x, scale),
    liger=None,
    min_bytes=lambda s, es: ((2 * _elements(s) + s.head_dim) * es, (3 * _elements(s) + 2 * s.head_dim) * es),
    flops=lambda s: (_elements(s), 2 * _elements(s)),
    cuda_shapes=(QUICK,), cpu_shapes=(QUICK,), quick_shapes={"cuda": QUICK, "cpu": QUICK},
    extras=(ExtraProvider("ours-mul", lambda dev: (lambda x, scale: torch.mul(x, scale), "torch.mul")),),
)
SUITE = Suite("toy", (SCALED_MUL,))

# ---- the tests -----------------------------------------------------------------------------------

CEILINGS = Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                    matmul_dtype="float32", torch_version=torch.__version__, measured_at="now")


def test_shape_has_named_dims() -> None:
    assert QUICK.sizes == [2, 4, 8, 16] and QUICK.label == "2x4x8x16"
    assert QUICK.heads == QUICK["heads"] == 4 and QUICK.names == ("batch", "heads", "tokens", "head_dim")
    with pytest.raises(AttributeError):
        _ = QUICK.vocab
    with pytest.raises(KeyError, match="head_dim"):
        _ = QUICK["vocab"]
    assert dataclasses.replace(QUICK, config="other").tokens == 8 and hash(QUICK) == hash(Shape.of(
        QUICK.config, batch=2, heads=4, tokens=8, head_dim=16))
    assert SUITE.providers == ("ours", "ours-mul", "eager", "compile", "liger")
    with pytest.raises(ValueError, match="grad_names"):
        dataclasses.replace(SCALED_MUL, grad_names=("x", "nope"))


def test_a_registered_toy_suite_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SUITES, "toy", __name__)
    assert get_suite("toy").SUITE is SUITE
    seen: list[str] = []
    out = run_suite("toy", tmp_path, device="cpu", quick=True, ceilings=CEILINGS,
                    progress=lambda d, t, w: seen.append(w))
    r = out.results
    assert {p.name for p in out.files} == {"toy.json", "toy.md", "toy_scaled_mul.png", "toy_roofline.png"}
    assert r.smoke and r.name == "toy" and seen[-1] == "done" and "scaled_mul 2x4x8x16 ours" in seen
    e = _elements(QUICK)
    for provider in ("ours", "ours-mul", "eager"):
        for p in PASSES:
            (row,) = r.find(provider=provider, pass_name=p)
            assert row.ok, row.note
            assert row.shape == [2, 4, 8, 16] and row.config == QUICK.config
            assert row.bytes == (2 * e + 16) * 2 + ((3 * e + 32) * 2 if p == "fwd+bwd" else 0)
            assert row.flops == (3 * e if p == "fwd+bwd" else e) and row.median_ms > 0
    assert r.find(provider="ours-mul")[0].note == "torch.mul"
    assert {x.status for x in r.find(provider="liger")} == {"not available"}
    assert not r.find(provider="compile")  # not asked for on CPU


def test_a_provider_writing_into_its_inputs_is_gated_on_the_inputs_as_drawn() -> None:
    """Liger's cross-entropy writes its gradient over its input: the reference must not see that."""

    def clobbering(x, scale, *, backend):
        y = _reference(x, scale)
        x.data.fill_(7.0)
        return y

    r = runner.run(Suite("toy", (dataclasses.replace(SCALED_MUL, ours=clobbering),)), device="cpu",
                   providers=("ours",), quick=True, ceilings=CEILINGS)
    assert all(x.ok for x in r.find(provider="ours")), [x.note for x in r.find(provider="ours")]


def test_a_wrong_provider_is_failed_and_not_timed() -> None:
    wrong = dataclasses.replace(SCALED_MUL, ours=lambda x, scale, *, backend: x * scale * 1.5)
    r = runner.run(Suite("toy", (wrong,)), device="cpu", providers=("ours", "eager"), quick=True,
                   ceilings=CEILINGS)
    ours = r.find(provider="ours")
    assert [x.status for x in ours] == ["failed", "failed"] and all(x.median_ms is None for x in ours)
    assert "correctness: scaled_mul y: MISMATCH" in ours[0].note
    assert all(x.ok for x in r.find(provider="eager"))
    with pytest.raises(ValueError, match="unknown op"):
        runner.run(SUITE, device="cpu", ops=("nope",), ceilings=CEILINGS)


def test_the_gate_samples_rows_of_4d_tensors_and_reports_full_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(G, "GATE_MAX_ELEMENTS", 8 * 16)  # 8 rows of head_dim at a time
    shape = Shape.of("toy", batch=2, heads=4, tokens=32, head_dim=16)
    sample = G.tensor_rows(torch.empty(2, 4, 32, 16))
    assert sample is not None and len(sample) == 8 and sample[0] == 0 and sample[-1] == 2 * 4 * 32 - 1
    bad = sample[-2]  # a flat row of the (batch, heads, tokens) grid
    where = (bad // 128, bad // 32 % 4, bad % 32)

    def wrong(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        bump = torch.zeros_like(x)
        bump[where + (3,)] = 1.0
        return x * scale + bump

    checks, _ = G.gate(SCALED_MUL, wrong, shape, torch.float32, torch.device("cpu"), None)
    y = next(c for c in checks if c.name == "scaled_mul y")
    assert not y.passed and y.worst_index == (*where, 3) and y.shape == (2, 4, 32, 16)
    assert "8 of 256 rows checked" in y.note
    dscale = next(c for c in checks if c.name == "scaled_mul dscale")
    assert dscale.passed and "rows checked" not in dscale.note  # 1-d: checked whole


def test_module_peers_load_by_target_and_liger_runs_only_on_cuda() -> None:
    assert load_peer("torch.nn:Linear") == (torch.nn.Linear, "ok")
    cls, status = load_peer("torch.nn:NoSuchModule")
    assert cls is None and status.startswith("not available: ImportError")
    assert load_peer("no_such_package_kp.sub:Thing") == (None, "not installed")
    assert resolve(SCALED_MUL, "liger", torch.device("cpu"))[1:] == ("not available", "Liger-Kernel has no counterpart")
    # a provider of another op of the suite: nothing to run here, no rows
    assert resolve(SCALED_MUL, "ours-auto", torch.device("cpu")) == (None, "same", "")


def test_a_peer_function_that_writes_its_inputs_passes_the_gate() -> None:
    """A peer given as a function (Liger's liger_rotary_pos_emb) is called with the `call` inputs; one
    that overwrites its inputs (Liger's rope, in place) is still judged against the inputs as drawn."""

    def overwrites(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        y = _reference(x.clone(), scale)
        x.data.fill_(7.0)
        return y

    peer = ModulePeer(target="toy:overwrites", init_args=lambda t: (), call=("x", "scale"))
    checks, _ = G.gate(SCALED_MUL, Impl(overwrites, peer), QUICK, torch.float32, torch.device("cpu"), None)
    assert all(c.passed for c in checks), [c.message() for c in checks if not c.passed]


def test_cuda_graph_rows_replay_rotated_input_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    # the CUDA-only steps stubbed, so the graph-row logic runs here: one replay per pass over every copy
    replayed: list[list] = []

    def fake_graph(fns, device, call_ms):
        assert call_ms > 0  # the eager timing just taken sizes the graph (graph_timer.graph_plan)
        replayed.append([f() for f in fns])
        return summarize([0.01] * 5, "cuda graph replay (stub)")

    monkeypatch.setattr(runner, "time_cuda_graph", fake_graph)
    monkeypatch.setattr(runner, "rotation_copies", lambda nbytes, dev: 3)
    rows, gated = runner.measure(SCALED_MUL, "ours", Impl(SCALED_MUL.eager), "ok", "a note", QUICK, torch.float32,
                                 torch.device("cpu"), CEILINGS, None, {"cpu_min_run_time": 0.01}, timed=True,
                                 graph=True)
    assert [r.pass_name for r in rows] == ["fwd", "fwd (cuda graph)", "fwd+bwd", "fwd+bwd (cuda graph)"]
    assert all(r.ok for r in rows) and gated is not None
    main, graph = rows[0], rows[1]
    assert main.note == "a note" and graph.note == runner.GRAPH_NOTE
    assert graph.bytes == main.bytes and graph.flops == main.flops and graph.median_ms == pytest.approx(0.01)
    assert graph.pct_of_copy == pytest.approx(100 * graph.bytes / 0.01e-3 / 1e9 / 10.0)
    fwd, fwd_bwd = replayed
    assert len(fwd) == len(fwd_bwd) == 3
    assert not torch.equal(fwd[0], fwd[1]) and not torch.equal(fwd[1], fwd[2])  # each copy its own inputs
    assert all(len(g) == 2 for g in fwd_bwd)  # dx, dscale from every copy


def test_a_large_shape_is_gated_at_the_spec_s_gate_shape() -> None:
    """The gate runs where `gate_shape` says; the rows (full shape, timed) say so, and a wrong provider
    still fails there."""
    seen: list[Shape] = []

    def small(shape: Shape) -> Shape:
        seen.append(shape)
        return Shape.of("gate", batch=1, heads=2, tokens=shape.tokens, head_dim=shape.head_dim)

    spec = dataclasses.replace(SCALED_MUL, gate_shape=small)
    r = runner.run(Suite("toy", (spec,)), device="cpu", providers=("ours", "eager"), quick=True, ceilings=CEILINGS)
    rows = r.find(provider="ours")
    assert rows and all(x.ok and x.shape == QUICK.sizes for x in rows)
    assert all(f"correctness gated at 1x2x8x16 ({runner.GATED_SMALLER})" in x.note for x in rows)
    assert seen and all(s_ == QUICK for s_ in seen)
    wrong = dataclasses.replace(spec, ours=lambda x, scale, *, backend: x * scale * 1.5)
    r = runner.run(Suite("toy", (wrong,)), device="cpu", providers=("ours",), quick=True, ceilings=CEILINGS)
    assert all(x.status == "failed" and x.note.startswith("correctness at 1x2x8x16: ") for x in r.find(provider="ours"))


def test_a_forward_only_op_is_gated_and_timed_forward_only() -> None:
    spec = dataclasses.replace(SCALED_MUL, grad_names=(), param_names=(), passes=("fwd",))
    r = runner.run(Suite("toy", (spec,)), device="cpu", providers=("ours", "eager"), quick=True, ceilings=CEILINGS)
    assert [x.pass_name for x in r.find(provider="ours")] == ["fwd"] and all(x.ok for x in r.rows)
    with pytest.raises(ValueError, match="backward pass needs grad_names"):
        dataclasses.replace(SCALED_MUL, grad_names=(), param_names=())


def test_each_pass_releases_its_memory_before_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """With graph rows (CUDA), every pass ends by freeing the device memory it held, and the gate's
    outputs of a provider other than eager are not kept."""
    freed: list[bool] = []
    monkeypatch.setattr(runner, "free_device_memory", lambda dev, collect=True: freed.append(collect))
    monkeypatch.setattr(runner, "time_cuda_graph", lambda fns, device, call_ms: summarize([0.01], "stub"))
    monkeypatch.setattr(runner, "rotation_copies", lambda nbytes, dev: 2)
    rows, gated = runner.measure(SCALED_MUL, "ours", Impl(SCALED_MUL.eager), "ok", "", QUICK, torch.float32,
                                 torch.device("cpu"), CEILINGS, None, {"cpu_min_run_time": 0.01}, timed=True,
                                 graph=True, keep_gate=False)
    assert len(rows) == 4 and all(r.ok for r in rows) and gated is None
    assert freed == [False, False]  # one per pass; no collection where nothing failed
    freed.clear()
    monkeypatch.setattr(runner, "time_cuda_graph", lambda fns, device, call_ms: 1 / 0)  # a failed capture
    rows, _ = runner.measure(SCALED_MUL, "ours", Impl(SCALED_MUL.eager), "ok", "", QUICK, torch.float32,
                             torch.device("cpu"), CEILINGS, None, {"cpu_min_run_time": 0.01}, timed=True,
                             graph=True)
    assert [r.status for r in rows] == ["ok", "error"] * 2 and freed == [True, True]


def test_an_interrupted_run_keeps_its_finished_rows_and_says_partial() -> None:
    """SIGINT (Ctrl-C, `timeout -s INT`) mid-run: the rows measured so far come back, marked PARTIAL."""
    seen = []

    def progress(done: int, total: int, what: str) -> None:
        seen.append(what)
        if what.endswith(" ours"):  # eager has been measured; stop before ours
            raise KeyboardInterrupt

    r = runner.run(Suite("toy", (SCALED_MUL,)), device="cpu", providers=("ours", "eager"), quick=True,
                   ceilings=CEILINGS, progress=progress)
    assert r.find(provider="eager") and all(x.ok for x in r.find(provider="eager"))
    assert not r.find(provider="ours")
    assert any(n.startswith("PARTIAL: interrupted after 1 ") for n in r.notes), r.notes
