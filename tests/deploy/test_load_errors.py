"""Every way a load fails says what and where, and leaves the model as it was (bitwise)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch
from kernel_pytorch.deploy import LoadError, Manifest, PickleRefusedError, describe_differences
from tests.deploy.models import DIM, Small, optimized_small, snapshot, unchanged


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    model, report = optimized_small()
    kernel_pytorch.save(model, tmp_path / "saved", report=report)
    return tmp_path / "saved"


def _fails(path: Path, model: nn.Module, match: str, error: type[Exception] = LoadError) -> None:
    before = snapshot(model)
    with pytest.raises(error, match=match):
        kernel_pytorch.load(path, model)
    assert unchanged(model, before)


def _edit_manifest(path: Path, **changes: object) -> None:
    file = path / "kernel_pytorch.json"
    data = json.loads(file.read_text())
    data.update(changes)
    file.write_text(json.dumps(data))


@pytest.mark.parametrize("name", ["model.pt", "pytorch_model.bin", "weights.pth", "weights.safetensors"])
def test_pickle_checkpoints_are_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / name  # the last one is a pickle under a safetensors name: refused by its bytes
    torch.save(Small().state_dict(), path)
    _fails(path, Small(), r"pickle-based checkpoint.*never unpickles.*kernel-pytorch convert", PickleRefusedError)
    _fails(tmp_path, Small(), "kernel-pytorch convert", PickleRefusedError)  # a directory of pickles


def test_truncated_file(saved: Path) -> None:
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7])
    _fails(saved, Small(), r"model\.safetensors is \d+ bytes, the manifest says \d+: the file is truncated")


def test_corrupted_header(saved: Path) -> None:
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[12:20] = b"\xff" * 8  # inside the JSON header; the size stays as recorded
    weights.write_bytes(bytes(data))
    _fails(saved, Small(), r"model\.safetensors is corrupted or not safetensors")


def test_pickle_inside_a_saved_directory(saved: Path) -> None:
    torch.save(Small().state_dict(), saved / "model.safetensors")
    _fails(saved, Small(), r"model\.safetensors is a pickle-based checkpoint", PickleRefusedError)


def test_missing_file(saved: Path) -> None:
    (saved / "model.safetensors").unlink()
    _fails(saved, Small(), r"model\.safetensors is missing")


def test_missing_key(saved: Path) -> None:
    _fails(saved, Small(extra=True), r"missing from the saved model: head\.bias, head\.weight")


def test_unexpected_key(tmp_path: Path) -> None:
    model, report = optimized_small(extra=True)
    kernel_pytorch.save(model, tmp_path, report=report)
    _fails(tmp_path, Small(), r"saved but not in the model: head\.bias, head\.weight")


def test_wrong_shape_and_dtype(saved: Path) -> None:
    _fails(saved, Small(dim=DIM * 2), r"proj\.weight: saved float32 \[16, 16\], model has float32 \[32, 32\]")
    _fails(saved, Small().half(), r"model\.to\(torch\.bfloat16\)\): norm\.weight: saved float32 \[16\], "
                                  r"model has float16")


def test_header_disagrees_with_manifest(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    data["tensors"]["proj.weight"]["shape"] = [4, 64]
    (saved / "kernel_pytorch.json").write_text(json.dumps(data))
    _fails(saved, Small(), r"tensor 'proj\.weight' in .*model\.safetensors is float32 \[16, 16\], the manifest says")


def test_weight_file_outside_the_directory(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    _edit_manifest(saved, files={"../model.safetensors": data["files"]["model.safetensors"]})
    _fails(saved, Small(), r"weight file '\.\./model\.safetensors', which is not a file name")


def test_unknown_rule(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    data["swaps"][0]["rule"] = "no_such_rule"
    _edit_manifest(saved, swaps=data["swaps"])
    _fails(saved, Small(), r"rules this kernel_pytorch does not have: no_such_rule")


def test_swapped_path_absent(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    data["swaps"][0]["path"] = "nowhere"
    _edit_manifest(saved, swaps=data["swaps"])
    _fails(saved, Small(), r"swapped 'nowhere'")


def test_no_manifest_or_newer_format(saved: Path) -> None:
    _edit_manifest(saved, format_version=99)
    _fails(saved, Small(), r"format version 99.*upgrade kernel_pytorch")
    (saved / "kernel_pytorch.json").unlink()
    _fails(saved, Small(), r"no kernel_pytorch\.json")


def test_factory_model_is_checked_before_use(saved: Path) -> None:
    with pytest.raises(TypeError, match="not an nn.Module"):
        kernel_pytorch.load(saved, lambda: 3)


def test_version_mismatch_is_named(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    _edit_manifest(saved, versions={**data["versions"], "torch": "0.0.1", "triton": None})
    message = describe_differences(Manifest.read(saved))
    assert f"torch: saved with 0.0.1, installed {torch.__version__}" in message
    with pytest.warns(UserWarning, match=r"torch: saved with 0\.0\.1, installed"):
        kernel_pytorch.load(saved, Small())  # a warning: the weights still load
    model = Small()
    before = snapshot(model)
    with pytest.raises(LoadError, match="saved with 0.0.1"):
        kernel_pytorch.load(saved, model, strict_versions=True)
    assert unchanged(model, before)
