"""The norm suite: byte counts, the correctness gate, and a quick CPU run end to end."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference
from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.results import OK
from kernel_pytorch.benchmark.suites import gate as G
from kernel_pytorch.benchmark.suites import get_suite, suite_names
from kernel_pytorch.benchmark.suites import norm as N
from kernel_pytorch.tolerances import TOLERANCES
from tests.grid import randn

STATUSES = {OK, "failed", "error", "not installed", "not available"}


def _fake_ceilings() -> Ceilings:
    # the suite measures its own; the unit tests use fixed ones to stay fast and exact
    return Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                    matmul_dtype="float32", torch_version=torch.__version__, measured_at="now")


def test_registry() -> None:
    assert "norm" in suite_names() and get_suite("norm") is N and get_suite("norms") is N  # the former name
    with pytest.raises(ValueError, match="known: norm"):
        get_suite("nope")


def test_minimum_bytes() -> None:
    r, c, s = 16384, 4096, 2
    e = r * c
    assert N.min_bytes("rms_norm", r, c, s, "fwd") == (2 * e + c) * s
    assert N.min_bytes("rms_norm", r, c, s, "fwd+bwd") == (2 * e + c + 3 * e + 2 * c) * s
    assert N.min_bytes("add_rms_norm", r, c, s, "fwd") == (4 * e + c) * s
    assert N.min_bytes("add_rms_norm", r, c, s, "fwd+bwd (cuda graph)") == (8 * e + 3 * c) * s
    assert N.min_bytes("layer_norm", r, c, s, "fwd+bwd") == (5 * e + 5 * c) * s


def test_shapes_are_labelled_with_model_configs() -> None:
    assert [(s.rows, s.cols) for s in N.CUDA_SHAPES] == [(16384, 4096), (2048, 16384), (4096, 1024), (256, 262144)]
    assert all(s.config for s in N.CUDA_SHAPES + N.CPU_SHAPES)


def test_the_old_shape_constructor_still_works() -> None:
    with pytest.warns(DeprecationWarning, match="rows_cols"):
        old = N.Shape(4096, 1024, "Qwen3-0.6B")
    assert old == N.rows_cols(4096, 1024, "Qwen3-0.6B")
    assert (old.rows, old.cols, old.sizes) == (4096, 1024, [4096, 1024])


def test_hf_eager_code_matches_the_reference_in_fp32() -> None:
    x, w, r = randn(8, 64), 1 + 0.1 * randn(64), randn(8, 64)
    tol = TOLERANCES[torch.float32]
    torch.testing.assert_close(N.hf_rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5), atol=tol.atol,
                               rtol=tol.rtol)
    y, h = N.hf_add_rms_norm(x, r, w, 1e-5)
    y_ref, h_ref = reference.add_rms_norm(x, r, w, 1e-5)
    torch.testing.assert_close(h, h_ref, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(y, y_ref, atol=tol.atol, rtol=tol.rtol)


def test_the_gate_rejects_a_wrong_provider() -> None:
    dev = torch.device("cpu")
    eager = N.RMS_NORM.eager
    _, eager_result = N.gate("rms_norm", "eager", eager, (16, 64), torch.bfloat16, dev, None)
    checks, _ = N.gate("rms_norm", "eager", eager, (16, 64), torch.bfloat16, dev, eager_result)
    assert all(c.passed for c in checks), [c.message() for c in checks if not c.passed]
    wrong_eps = lambda x, weight: N.hf_rms_norm(x, weight, 0.5)  # noqa: E731
    checks, _ = N.gate("rms_norm", "eager", wrong_eps, (16, 64), torch.bfloat16, dev, eager_result)
    failed = {c.name for c in checks if not c.passed}
    assert "rms_norm y" in failed and "rms_norm dx" in failed


def test_quick_cpu_run() -> None:
    seen: list[tuple[int, int, str]] = []
    r = N.run(device="cpu", providers=("ours", "ours-auto", "eager", "liger"), ops=("rms_norm", "add_rms_norm"),
              quick=True,
              ceilings=_fake_ceilings(), progress=lambda d, t, w: seen.append((d, t, w)))
    assert seen[-1][0] == seen[-1][1] and seen[-1][2] == "done"
    assert {row.status for row in r.rows} <= STATUSES
    shape = [N.QUICK_SHAPES["cpu"].rows, N.QUICK_SHAPES["cpu"].cols]
    for op in ("rms_norm", "add_rms_norm"):
        for p in N.PASSES:
            eager = r.find(op=op, provider="eager", pass_name=p)
            assert len(eager) == 1 and eager[0].ok and eager[0].shape == shape, eager
            row = eager[0]
            assert row.bytes == N.min_bytes(op, *shape, 2, p)
            assert row.gbps == pytest.approx(row.bytes / (row.median_ms * 1e-3) / 1e9)
            assert row.pct_of_copy == pytest.approx(100 * row.gbps / 10.0)
            assert row.peak_mem_bytes is not None and "cpu" in row.peak_mem_method
    ours = r.find(op="rms_norm", provider="ours", pass_name="fwd")[0]
    assert ours.ok, ours.note
    assert not r.find(provider="ours-auto")  # on CPU it runs exactly what "ours" runs: no rows
    liger = r.find(provider="liger")
    assert liger and all(x.status in ("not installed", "not available") for x in liger)
    assert "CPU run" in " ".join(r.notes)
    with pytest.raises(ValueError, match="unknown provider"):
        N.run(device="cpu", providers=("nope",), ceilings=_fake_ceilings())


@pytest.mark.cuda
def test_cuda_small_shape_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path))
    shape = N.rows_cols(4096, 1024, "Qwen3-0.6B")
    r = N.run(device="cuda", providers=("ours", "eager"), ops=("rms_norm",), shapes=(shape,))
    assert r.ceilings is not None and r.ceilings.source == "measured"
    rows = {(row.provider, row.pass_name): row for row in r.rows}
    graph_rows = [("ours", "fwd (cuda graph)"), ("ours", "fwd+bwd (cuda graph)"), ("eager", "fwd (cuda graph)")]
    for key in [("ours", "fwd"), ("ours", "fwd+bwd"), ("eager", "fwd"), *graph_rows]:
        assert rows[key].ok, rows[key].note
        assert 0 < rows[key].pct_of_copy < 110
    assert rows[("ours", "fwd")].peak_mem_bytes >= shape.rows * shape.cols * 2
    assert rows[("ours", "fwd (cuda graph)")].median_ms <= rows[("ours", "fwd")].median_ms * 1.5


class _LigerLikeRMSNorm(torch.nn.Module):
    """Stands in for LigerRMSNorm's interface (Liger itself needs CUDA)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, in_place: bool = True) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps, self.in_place = eps, in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return N.hf_rms_norm(x, self.weight, self.eps)


class _LigerLikeFusedAdd(_LigerLikeRMSNorm):
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return N.hf_add_rms_norm(x, residual, self.weight, self.eps)


@pytest.mark.parametrize("op, cls", [("rms_norm", _LigerLikeRMSNorm), ("add_rms_norm", _LigerLikeFusedAdd)])
def test_module_providers_get_the_benchmark_weights(op: str, cls: type) -> None:
    assert N.liger_kwargs(cls, op) == ({"in_place": False} if op == "rms_norm" else {})
    dev = torch.device("cpu")
    _, eager_result = N.gate(op, "eager", N.SPECS[op].eager, (16, 64), torch.bfloat16, dev, None)
    checks, _ = N.gate(op, "liger", cls, (16, 64), torch.bfloat16, dev, eager_result)
    assert all(c.passed for c in checks), [c.message() for c in checks if not c.passed]
    assert {c.name for c in checks} >= {f"{op} dweight", f"{op} dx"}


def test_gate_samples_rows_of_big_shapes_and_reports_full_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    for shape in N.CUDA_SHAPES:
        rows = N.gate_rows(shape.rows, shape.cols)
        if shape.rows * shape.cols <= N.GATE_MAX_ELEMENTS:
            assert rows is None
            continue
        assert rows is not None and rows[0] == 0 and rows[-1] == shape.rows - 1
        assert len(rows) * shape.cols <= max(N.GATE_MAX_ELEMENTS, N.GATE_MIN_ROWS * shape.cols)
        assert rows == sorted(set(rows))
    assert N.gate_rows(16, 64) is None
    # a provider wrong in one late row only: the sample must include it, and the index must be the full one
    monkeypatch.setattr(G, "GATE_MAX_ELEMENTS", 16 * 64)  # small shapes, same sampling
    rows, cols = 256, 64
    sample = N.gate_rows(rows, cols)
    bad_row = sample[-2]

    def wrong(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = N.hf_rms_norm(x, weight, N.RMS_EPS)
        bump = torch.zeros_like(y)
        bump[bad_row] = 1.0
        return y + bump

    dev = torch.device("cpu")
    checks, _ = N.gate("rms_norm", "ours", wrong, (rows, cols), torch.bfloat16, dev, None)
    y = next(c for c in checks if c.name == "rms_norm y")
    assert not y.passed and y.worst_index[0] == bad_row and y.shape == (rows, cols)
    assert f"{len(sample)} of {rows} rows" in y.note
