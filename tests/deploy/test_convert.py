"""`kernel-pytorch convert IN OUT` and `deploy.convert`: trusted torch.save checkpoints to safetensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernel_pytorch
from kernel_pytorch.cli.main import main
from kernel_pytorch.deploy import Manifest, convert
from tests.deploy.models import Small


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_cli_converts_a_state_dict_and_says_it_unpickles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = Small()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    assert main(["convert", str(tmp_path / "model.pt"), str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "unpickles" in err and "weights_only=True" in err and "trust" in err
    assert _equal(kernel_pytorch.load(tmp_path / "out", Small()), model)
    assert Manifest.read(tmp_path / "out").metadata == {"converted_from": "model.pt",
                                                       "unpickled_with": "weights_only"}


def test_nested_state_dict_and_ties(tmp_path: Path) -> None:
    model = Small()
    state = model.state_dict()
    state["tied.weight"] = state["proj.weight"]  # torch.save keeps the sharing; written once
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "ckpt.pth")
    convert(tmp_path / "ckpt.pth", tmp_path / "out", max_shard_size=600)
    manifest = Manifest.read(tmp_path / "out")
    assert manifest.aliases == {"tied.weight": "proj.weight"} and len(manifest.files) > 1


def test_pickled_module_needs_the_unsafe_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = Small()
    torch.save(model, tmp_path / "whole.pt")  # a pickled module: weights_only refuses its class
    assert main(["convert", str(tmp_path / "whole.pt"), str(tmp_path / "out")]) == 2
    assert "--unsafe-full-pickle" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert main(["convert", str(tmp_path / "whole.pt"), str(tmp_path / "out"), "--unsafe-full-pickle"]) == 0
    assert "weights_only=False" in capsys.readouterr().err
    assert _equal(kernel_pytorch.load(tmp_path / "out", Small()), model)


def test_not_a_state_dict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"lr": 0.1, "steps": 3}, tmp_path / "opt.pt")
    assert main(["convert", str(tmp_path / "opt.pt"), str(tmp_path / "out")]) == 2
    assert "not a state dict: entries lr, steps are not tensors" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.pt"), str(tmp_path / "out")]) == 2
