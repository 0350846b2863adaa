"""`kernel-pytorch export FACTORY --out DIR [--aoti]`: what it writes and prints, and its exit codes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kernel_pytorch.cli.main import main
from kernel_pytorch.deploy import load_program, our_ops

FACTORY = textwrap.dedent('''
    import torch
    from torch import nn


    class Model(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.norm = nn.RMSNorm(dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            return self.proj(self.norm(x))


    def make():
        return Model(), (torch.randn(2, 5, 16),)
''')


@pytest.fixture()
def factory(tmp_path: Path) -> str:
    path = tmp_path / "model.py"
    path.write_text(FACTORY)
    return f"{path}:make"


def test_writes_the_program(factory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["export", factory, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'model.pt2'}" in printed and "kernel_pytorch::rms_norm_fwd" in printed
    program = load_program(out / "model.pt2")
    assert our_ops(program) == ["kernel_pytorch::rms_norm_fwd"]
    x = torch.randn(3, 7, 16)  # dynamic batch and sequence
    assert program.module()(x).shape == (3, 7, 16)
    assert not (out / "model_aoti.pt2").exists()


def test_bad_factory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "missing.py"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_aoti_flag_writes_the_package(factory: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # the compile itself is tested in tests/deploy/test_export.py (~15 s on CPU); here only the wiring
    calls = []

    def fake_package(program: object, inputs: object, path: Path) -> Path:
        calls.append(program)
        path.write_bytes(b"")
        return path

    monkeypatch.setattr("kernel_pytorch.cli.export.aoti_package", fake_package)
    out = tmp_path / "out"
    assert main(["export", factory, "--out", str(out), "--aoti", "--dynamic", "static"]) == 0
    assert len(calls) == 1 and f"wrote {out / 'model_aoti.pt2'}" in capsys.readouterr().out
