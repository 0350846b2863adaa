"""`kernel-pytorch --version` and `doctor`: kernel_pytorch names its own version."""

from __future__ import annotations

import json

import pytest

import kernel_pytorch
from kernel_pytorch.cli.main import main


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"kernel-pytorch {kernel_pytorch.__version__}"


def test_doctor_shows_kernel_pytorch_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split()
    assert first == ["kernel_pytorch", kernel_pytorch.__version__]
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel_pytorch"] == kernel_pytorch.__version__
