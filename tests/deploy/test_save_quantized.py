"""save/load of a model quantized with `deploy.quantize` (int8, fp8 weight-only): the quantized weights
go to safetensors as plain parts (torchao's safetensors support), the manifest records the scheme, and
load quantizes the rebuilt model the same way: bitwise the same outputs."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.deploy import LoadError, quantize
from kernel_pytorch.models import MODELS, build_model
from tests.deploy.models import TiedHead, snapshot, unchanged

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao (the [quant] extra) is not installed")
CONFIG = dataclasses.replace(MODELS["llama-tiny"].config, n_layers=1)


def _llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return build_model("llama-tiny", dtype=torch.bfloat16, config=CONFIG)


def _factory() -> nn.Module:
    return _llama()[0]


def _kinds(model: nn.Module) -> set[str]:
    return {type(m.weight).__name__ for m in model.modules() if isinstance(m, nn.Linear)}


@pytest.fixture(scope="module", params=["int8", "fp8"])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(scheme, directory, the quantized model, inputs): llama-tiny optimized, quantized, saved in shards."""
    model, inputs = _llama()
    model, report = kp.optimize(model, inputs, validate=False, compile=False)
    quantize(model, request.param)
    path = tmp_path_factory.mktemp("q") / request.param
    kp.save(model, path, report=report, max_shard_size="20KB")  # parts of one weight may span files
    return request.param, path, model, inputs


def _manifest(path: Path) -> dict:
    return json.loads((path / "kernel_pytorch.json").read_text())


@needs_torchao
def test_round_trip_bitwise(saved) -> None:
    scheme, path, model, inputs = saved
    manifest = _manifest(path)
    quant = manifest["quantization"]
    assert quant["scheme"] == scheme and quant["torchao"] == importlib.metadata.version("torchao")
    assert manifest["format_version"] == 2 and len(manifest["files"]) > 1
    assert set(quant["tensors"]) == {k for k, v in model.state_dict().items() if type(v) is not torch.Tensor}
    for built in (kp.load(path, _factory), _factory()):
        loaded = kp.load(path, built)  # from a factory, and in place
        assert _kinds(loaded) == _kinds(model) == {"Int8Tensor" if scheme == "int8" else "Float8Tensor"}
        assert {type(m).__name__ for m in loaded.modules()} == {type(m).__name__ for m in model.modules()}
        with torch.no_grad():
            assert torch.equal(loaded(*inputs), model(*inputs))


@needs_torchao
def test_tied_head_is_quantized_on_its_own(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = quantize(TiedHead().to(torch.bfloat16), "int8")
    assert model.head.weight is not model.embed.weight  # torchao gives the Linear its own weight
    kp.save(model, tmp_path / "tied")
    loaded = kp.load(tmp_path / "tied", lambda: TiedHead().to(torch.bfloat16))
    ids = torch.randint(0, 32, (2, 5))
    assert torch.equal(loaded(ids), model(ids)) and type(loaded.embed.weight) is nn.Parameter


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a  # one module under two names: its quantized weight is written once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@needs_torchao
def test_shared_quantized_module_written_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = quantize(_Shared(), "int8")
    kp.save(model, tmp_path / "shared")
    manifest = _manifest(tmp_path / "shared")
    assert manifest["aliases"] == {"b.weight": "a.weight", "b.bias": "a.bias"}
    assert not [k for k in manifest["tensors"] if k.startswith("b.")]
    loaded = kp.load(tmp_path / "shared", _Shared)
    x = torch.randn(2, 8)
    assert torch.equal(loaded(x), model(x)) and loaded.a is loaded.b


def _rewrite(path: Path, edit) -> None:
    """Apply `edit(tensors, manifest)` to the single weight file and the manifest, keeping them consistent."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    file = path / "model.safetensors"
    with safe_open(str(file), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    manifest = _manifest(path)
    edit(tensors, manifest)
    save_file(tensors, str(file), metadata=meta)
    manifest["files"]["model.safetensors"] = file.stat().st_size
    manifest["sha256"]["model.safetensors"] = hashlib.sha256(file.read_bytes()).hexdigest()
    manifest["tensors"] = {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                               "file": "model.safetensors"} for k, t in tensors.items()}
    (path / "kernel_pytorch.json").write_text(json.dumps(manifest))


@pytest.fixture()
def small_saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = quantize(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)), "int8")
    kp.save(model, tmp_path / "small")
    return tmp_path / "small"


def _fails(path: Path, match: str) -> None:
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    before = snapshot(model)
    with pytest.raises(LoadError, match=match):
        kp.load(path, model)
    assert unchanged(model, before)  # not quantized, not loaded


@needs_torchao
def test_missing_part_is_named(small_saved: Path) -> None:
    _rewrite(small_saved, lambda tensors, manifest: tensors.pop("2._weight_scale"))
    _fails(small_saved, r"quantized tensor '2\.weight': its part 'scale' \('2\._weight_scale'\) is not in the saved")


@needs_torchao
def test_part_of_another_shape_is_named(small_saved: Path) -> None:
    def edit(tensors: dict, manifest: dict) -> None:
        tensors["0._weight_qdata"] = tensors["0._weight_qdata"][:, :15].contiguous()
        manifest["quantization"]["tensors"]["0.weight"]["shape"] = [8, 16]  # the outer shape still fits

    _rewrite(small_saved, edit)
    _fails(small_saved, r"0\.weight part qdata: saved int8 \[8, 15\], quantizing again gives int8 \[8, 16\]")


@needs_torchao
def test_another_torchao_version_is_reported(small_saved: Path) -> None:
    manifest = _manifest(small_saved)
    manifest["quantization"]["torchao"] = "0.0.1"
    (small_saved / "kernel_pytorch.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match=r"torchao: saved with 0\.0\.1, installed "):
        kp.load(small_saved, nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)))
    with pytest.raises(LoadError, match="torchao: saved with 0.0.1"):
        kp.load(small_saved, nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)), strict_versions=True)


@needs_torchao
def test_corrupted_part_file_is_named(small_saved: Path) -> None:
    file = small_saved / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-3])
    _fails(small_saved, r"model\.safetensors is \d+ bytes, the manifest says \d+: the file is truncated")


@needs_torchao
def test_without_torchao_a_quantized_save_or_load_says_how_to_install(
        small_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    quantized = quantize(nn.Linear(8, 4), "int8")
    monkeypatch.setitem(sys.modules, "torchao", None)  # None in sys.modules: the import raises
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ImportError, match=r"quantization needs torchao: pip install 'kernel-pytorch\[quant\]'"):
        kp.save(quantized, tmp_path / "q")
    assert not (tmp_path / "q").exists()
    _fails_import = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(ImportError, match=r"kernel-pytorch\[quant\]"):
        kp.load(small_saved, _fails_import)
    plain = nn.Linear(8, 4)  # an unquantized model saves and loads without torchao
    kp.save(plain, tmp_path / "plain")
    assert torch.equal(kp.load(tmp_path / "plain", nn.Linear(8, 4)).weight, plain.weight)
