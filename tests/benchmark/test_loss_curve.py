"""benchmarks/bench_loss_curve.py on CPU: 50 AdamW steps of the built-in Llama with the fused linear
cross-entropy track the unfused loss's curve, and the curve files are written."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_loss_curve.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_loss_curve", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fused_loss_tracks_the_unfused_curve(tmp_path: Path) -> None:
    mod = _module()
    result = mod.run(50, torch.device("cpu"), torch.float32)
    unfused, fused = result["unfused"], result["fused"]
    assert len(unfused) == len(fused) == 50
    assert unfused[-1] < 0.9 * unfused[0], "the batches are learnable: the loss must fall"
    assert abs(fused[0] - unfused[0]) <= 1e-5 * unfused[0]  # same weights, same batch: the same loss
    assert result["max_relative_gap"] < 1e-3, result["max_relative_gap"]
    mod.write(result, tmp_path)
    assert json.loads((tmp_path / "loss_curve.json").read_text())["fused"] == fused
    assert "largest relative gap" in (tmp_path / "loss_curve.md").read_text()
