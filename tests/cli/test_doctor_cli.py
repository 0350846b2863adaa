"""`kernel-pytorch --version` and `doctor`: kernel_pytorch names its own version."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_doctor_measure_measures_now_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path))
    for _ in range(2):  # the second run measures again rather than printing the first one's figures
        assert main(["doctor", "--measure", "--json"]) == 0
        ceilings = json.loads(capsys.readouterr().out)["ceilings"]
        assert ceilings["source"] == "measured" and ceilings["origin"] == ""
    assert (tmp_path / "ceilings.json").is_file()
