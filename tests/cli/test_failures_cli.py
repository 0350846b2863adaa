"""A factory that raises, or a model that cannot be placed: `optimize` and `validate` exit 2 with one
line on stderr naming the factory and the error, as `analyze` does, never a traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernel_pytorch.cli.main import main

BROKEN = '''
import torch
from torch import nn


def broken():
    raise RuntimeError("no weights at /data/w.bin\\nsecond line of the message")


def fine():
    return nn.Linear(8, 8), (torch.randn(2, 8),)


def both_broken():
    raise KeyError("hidden_size")


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        raise ValueError(f"dim {dim} is odd")


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return [7]
'''


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent(BROKEN))
    return path


def _one_line(capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["optimize", "{p}:broken"],
    ["optimize", "{p}:broken", "--no-validate", "--compile", "off"],
    ["validate", "{p}:broken", "{p}:fine"],
    ["validate", "{p}:fine", "{p}:broken"],
])
def test_a_factory_that_raises_exits_2_with_one_line(broken: Path, argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main([a.format(p=broken) for a in argv]) == 2
    line = _one_line(capsys, f"{broken}:broken raised RuntimeError: no weights at /data/w.bin")
    assert line.startswith("error: ") and "second line" not in line


def test_a_lone_factory_that_raises(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", f"{broken}:both_broken"]) == 2
    _one_line(capsys, "both_broken raised KeyError: 'hidden_size'")


@pytest.mark.parametrize("command", ["optimize", "validate"])
def test_a_model_class_that_raises(broken: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the file defines the Model / get_inputs / get_init_inputs trio, and Model(7) raises
    assert main([command, str(broken)]) == 2
    _one_line(capsys, "Model(...) raised ValueError: dim 7 is odd")


@pytest.mark.parametrize("command, specs", [("optimize", ["{p}:fine"]), ("validate", ["{p}:fine", "{p}:fine"])])
def test_an_unusable_device_exits_2_with_one_line(broken: Path, command: str, specs: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, *(s.format(p=broken) for s in specs), "--device", "nosuchdevice"]) == 2
    _one_line(capsys, "--device", "nosuchdevice")
