"""deploy.measure: checkpoint size and save/load timing for both formats, the loaded-equals-saved check,
and a forward timed on CPU (no CUDA graph, said why)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kernel_pytorch.deploy import measure


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 8))


def test_both_formats_round_trip_and_are_timed(tmp_path: Path) -> None:
    model = _model()
    for fmt in (measure.safetensors_format(), measure.torch_save_format("cpu")):
        t = measure.time_checkpoint(model, fmt, _fresh, tmp_path / fmt.name, reps=2)
        assert t.equal is True and t.save.reps == t.load.reps == 2 and t.load.median_ms > 0
        assert t.bytes == measure.dir_bytes(tmp_path / fmt.name) > 4 * sum(p.numel() for p in model.parameters())
    assert "page cache warm" in t.load.method and "no fsync" in t.save.method


def _fresh() -> nn.Module:
    torch.manual_seed(1)  # other weights than the saved ones: the load must replace them all
    return nn.Sequential(nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 8))


def test_same_weights_sees_one_changed_element() -> None:
    a, b = _model(), _model()
    assert measure.same_weights(a, b)
    with torch.no_grad():
        b[2].bias[3] += 1
    assert not measure.same_weights(a, b)


def test_forward_on_cpu_has_no_graph_timing() -> None:
    model, x = _model(), torch.randn(4, 16)
    f = measure.time_forward(lambda: model(x), "cpu", cpu_min_run_time=0.01)
    assert f.timing.median_ms > 0 and f.graph is None and "cpu" in f.graph_error
    assert f.memory.method
    out, seconds = measure.timed(lambda: model(x), "cpu")
    assert out.shape == (4, 8) and seconds >= 0
