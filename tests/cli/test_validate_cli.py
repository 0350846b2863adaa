"""`kernel-pytorch validate` and the factory loader it shares with `analyze`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernel_pytorch
from kernel_pytorch.cli._factory import FactoryError, load_factory
from kernel_pytorch.cli.main import main

MODELS = '''
import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class FusedNorm(Norm):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class WrongNorm(Norm):
    def forward(self, x):
        return super().forward(x) * 1.01


def original():
    return Norm(), (torch.randn(4, 32),)


def fused():
    return FusedNorm(), (torch.randn(4, 32),)


def wrong():
    return WrongNorm(), {"x": torch.randn(4, 32)}


def both():
    a = Norm()
    b = FusedNorm()
    b.load_state_dict(a.state_dict())
    return a, b, (torch.randn(4, 32),)


def not_a_model():
    return 3, ()
'''

TRIO = '''
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.lin(x))


class ModelNew(Model):
    def forward(self, x):
        return self.lin(x).clamp_min(0)


def get_inputs():
    return [torch.randn(3, 16)]


def get_init_inputs():
    return [16]
'''

FAST = ["--no-perf", "--backend", "eager"]


@pytest.fixture
def models(tmp_path: Path) -> Path:
    p = tmp_path / "models.py"
    p.write_text(textwrap.dedent(MODELS))
    return p


def test_right_pair_exits_0_and_prints_the_four_parts(models: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["validate", f"{models}:original", f"{models}:fused", "--backend", "eager",
                 "--cpu-min-run-time", "0.01"])
    out = capsys.readouterr().out
    assert code == 0, out
    for part in ("correctness_check: PASS", "performance_improvement", "memory_efficiency",
                 "compilation_success: yes", "determinism"):
        assert part in out


def test_wrong_pair_exits_1_with_the_mismatch(models: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["validate", f"{models}:original", f"{models}:wrong", *FAST])
    out = capsys.readouterr().out
    assert code == 1
    assert "correctness_check: FAIL" in out and "output: MISMATCH" in out and "worst at index (" in out


def test_single_factory_returning_both_and_json(models: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", f"{models}:both", *FAST, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["passed"] and data["correctness_check"]["passed"]
    assert data["performance_improvement"] is None


def test_model_and_model_new_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = tmp_path / "kb.py"
    p.write_text(textwrap.dedent(TRIO))
    assert main(["validate", str(p), *FAST, "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "Model vs ModelNew" in out and "(2/2 seeds" in out


def test_load_errors_exit_2(models: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", f"{models}:original", f"{models}:missing"]) == 2
    assert "defines no 'missing'" in capsys.readouterr().err
    assert main(["validate", f"{models}:original"]) == 2
    assert "(original, optimized, example_inputs)" in capsys.readouterr().err
    assert main(["validate", f"{models}:original", f"{models}:not_a_model"]) == 2
    assert main(["validate", str(models.parent / "absent.py:f"), f"{models}:original"]) == 2


def test_plot_is_written(models: Path, tmp_path: Path) -> None:
    png = tmp_path / "ba.png"
    assert main(["validate", f"{models}:original", f"{models}:fused", "--backend", "eager", "--no-grad",
                 "--cpu-min-run-time", "0.01", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_stderr_stays_clean_when_memory_is_measured(models: Path) -> None:
    """CPU peak memory runs torch's profiler, whose kineto prints "USDT: ... profiler_start" lines unless
    its log level is raised before its first use in the process: so a fresh process, as users run it."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(kernel_pytorch.__file__).parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_pytorch.cli.main", "validate", f"{models}:original", f"{models}:fused",
         "--no-compile", "--no-determinism", "--no-grad", "--seeds", "1", "--cpu-min-run-time", "0.01"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "memory_efficiency: (cpu" in proc.stdout
    assert "USDT" not in proc.stderr and "profiler_start" not in proc.stderr, proc.stderr


def test_load_factory_forms(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = load_factory(f"{models}:wrong")()
    assert isinstance(inputs, dict) and set(inputs) == {"x"}
    model, inputs = load_factory(f"{models}:original")()
    assert isinstance(inputs, tuple) and torch.is_tensor(inputs[0])
    trio = tmp_path / "trio.py"
    trio.write_text(textwrap.dedent(TRIO))
    model, inputs = load_factory(str(trio))()
    assert type(model).__name__ == "Model" and model.lin.in_features == 16
    assert isinstance(inputs, tuple) and inputs[0].shape == (3, 16)
    # an importable module name works as well as a file path
    monkeypatch.syspath_prepend(str(models.parent))
    model, _ = load_factory("models:fused")()
    assert type(model).__name__ == "FusedNorm"
    with pytest.raises(FactoryError, match="as the model"):
        load_factory(f"{models}:not_a_model")()
    with pytest.raises(FactoryError, match="no factory"):
        load_factory(str(models))
