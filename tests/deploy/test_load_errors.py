"""Every way a load fails says what and where, and leaves the model as it was (bitwise)."""

from __future__ import annotations

import hashlib
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


def test_unknown_compile_option_is_named(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    data["compile"]["options"] = {"bakend": "eager"}
    _edit_manifest(saved, compile=data["compile"])
    _fails(saved, Small(), r"compile options: unknown option\(s\) 'bakend'; CompileOptions fields: backend")


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


def _flip_data_byte(weights: Path) -> None:
    """One bit of the tensor data (past the 8-byte length and the JSON header), the size unchanged."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start + (len(data) - start) // 2] ^= 0x10
    weights.write_bytes(bytes(data))


def test_a_flipped_data_byte_fails_the_checksum(saved: Path) -> None:
    clean = snapshot(kernel_pytorch.load(saved, Small()))
    _flip_data_byte(saved / "model.safetensors")
    _fails(saved, Small(), r"weight file .*model\.safetensors has sha256 [0-9a-f]{16}\.\.\., the manifest records")
    # verify=False skips the checksum (size and header are still checked): the flipped byte loads silently
    assert not unchanged(kernel_pytorch.load(saved, Small(), verify=False), clean)


def test_a_flipped_byte_in_one_shard_names_that_shard(tmp_path: Path) -> None:
    model, report = optimized_small()
    files = kernel_pytorch.save(model, tmp_path, report=report, max_shard_size=600)
    shards = sorted(p for p in files if p.name.startswith("model-"))
    assert len(shards) >= 2
    _flip_data_byte(shards[-1])
    _fails(tmp_path, Small(), rf"weight file .*{shards[-1].name} has sha256")


def test_checksums_are_recorded_and_a_manifest_without_them_still_loads(saved: Path) -> None:
    data = json.loads((saved / "kernel_pytorch.json").read_text())
    weights = (saved / "model.safetensors").read_bytes()
    assert data["sha256"] == {"model.safetensors": hashlib.sha256(weights).hexdigest()}
    del data["sha256"]  # as written before checksums were recorded: checked by size and header only
    (saved / "kernel_pytorch.json").write_text(json.dumps(data))
    kernel_pytorch.load(saved, Small())


def test_a_checksum_of_the_wrong_form_or_missing_for_a_file(saved: Path) -> None:
    _edit_manifest(saved, sha256={"model.safetensors": "abc"})
    _fails(saved, Small(), r"sha256 of 'model\.safetensors' as 'abc', not 64 hex digits")
    _edit_manifest(saved, sha256={"other.safetensors": "0" * 64})
    _fails(saved, Small(), r"records no sha256 for model\.safetensors")


@pytest.mark.parametrize("entry, match", [
    ({"path": "norm"}, r"malformed swap \(entry 0 of \"swaps\""),
    ("norm", r"malformed swap \(entry 0"),
    ({"path": "norm", "rule": None, "before": "RMSNorm", "after": "RMSNorm"}, r"needs path, rule, before, after"),
    ({"path": ["norm"], "rule": "torch_rms_norm", "before": "RMSNorm", "after": "RMSNorm"}, r"malformed swap"),
])
def test_a_malformed_swap_entry(saved: Path, entry: object, match: str) -> None:
    _edit_manifest(saved, swaps=[entry])
    _fails(saved, Small(), match)


@pytest.mark.parametrize("field, value, match", [
    ("tensors", {"proj.weight": {"dtype": "float32", "file": "model.safetensors"}}, r"malformed entry for tensor"),
    ("tensors", {"proj.weight": [16, 16]}, r"malformed entry for tensor 'proj\.weight'"),
    ("files", {"model.safetensors": "big"}, r"size of 'model\.safetensors' as 'big'"),
    ("aliases", {"a": 3}, r"malformed \"aliases\""),
    ("compile", {"compiled": "layers.0"}, r"malformed \"compile\""),
    ("swaps", {"path": "norm"}, r"malformed \"swaps\" \(want a JSON array, got dict\)"),
])
def test_other_malformed_entries(saved: Path, field: str, value: object, match: str) -> None:
    _edit_manifest(saved, **{field: value})
    _fails(saved, Small(), match)
