"""`deploy.quantize(..., backend="kernel_pytorch")`: every nn.Linear swapped for nn.QuantizedLinear after
optimize(), validated within the scheme's own tolerance, deterministic through quantize, export and runs;
save/load through safetensors and the manifest (the parts as plain tensors, scheme, group size and
packing recorded), bitwise; shared layers written once; load errors raised before the model changes.
No torchao needed."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.deploy import LoadError
from kernel_pytorch.deploy.quantize import (
    available_schemes,
    expected_rtol,
    quant_determinism,
    quant_rtol,
    quantize,
    quantized_linears,
    rounding_variance,
    validate_quantized,
)
from kernel_pytorch.models import MODELS, build_model
from kernel_pytorch.nn import QuantizedLinear
from kernel_pytorch.reference.quant_matmul import INT4_PACKING
from tests.deploy.models import TiedHead, snapshot, unchanged

CONFIG = dataclasses.replace(MODELS["llama-tiny"].config, n_layers=1)
OURS = {"backend": "kernel_pytorch"}


def _llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return build_model("llama-tiny", dtype=torch.bfloat16, config=CONFIG)


def _factory() -> nn.Module:
    return _llama()[0]


@pytest.fixture(scope="module")
def optimized() -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    model, inputs = _llama()
    model, report = kp.optimize(model, inputs, validate=False, compile=False)
    return model, inputs, report


@pytest.mark.parametrize("scheme,group", [("int8", None), ("fp8", None), ("int4", 32)])
def test_validates_within_its_scheme_tolerance(optimized, scheme: str, group: int | None) -> None:
    model, inputs, _ = optimized
    quantized = quantize(copy.deepcopy(model), scheme, group_size=group, **OURS)
    layers = [m for m in quantized.modules() if isinstance(m, QuantizedLinear)]
    assert layers and not [m for m in quantized.modules() if isinstance(m, nn.Linear)]  # every Linear, ours too
    assert {m.scheme for m in layers} == {scheme} and quantized_linears(quantized)
    check = validate_quantized(model, quantized, inputs, scheme)
    assert check.passed, check.summary()
    assert max(c.max_abs_err for c in check.checks) > 0
    names = quantized_linears(quantized)
    assert quant_rtol(model, quantized, scheme) == expected_rtol(model, scheme, names, group_size=group, **OURS)


def test_rounding_variance_is_our_quantizers(optimized) -> None:
    """Our int4 (zero in every group's range, groups of 128 by default) differs from torchao's formula."""
    w = torch.randn(8, 256)
    ours = rounding_variance(w, "int4", **OURS)
    assert ours.shape == w.shape and not torch.equal(ours, rounding_variance(w, "int4"))
    assert torch.equal(rounding_variance(w, "int4", group_size=128, **OURS), ours)
    with pytest.raises(ValueError, match="backend must be one of"):
        rounding_variance(w, "int8", backend="bitsandbytes")
    with pytest.raises(ValueError, match="group_size is the kernel_pytorch backend's"):
        quantize(nn.Linear(4, 4), "int4", group_size=64)


def test_available_everywhere_the_reference_runs() -> None:
    assert available_schemes(**OURS) == {"int8": "", "fp8": "", "int4": ""}
    layer = quantize(nn.Linear(64, 8), "int8", **OURS)  # a bare Linear: the new layer is returned
    assert isinstance(layer, QuantizedLinear)


def test_quantize_export_and_run_twice_are_bitwise(optimized) -> None:
    model, inputs, _ = optimized
    report = quant_determinism(model, inputs, "int4", group_size=32, **OURS)
    assert report.deterministic, report.summary()
    assert "kernel_pytorch::quant_matmul_int4_fwd" in report.steps[1].detail


def _manifest(path: Path) -> dict:
    return json.loads((path / "kernel_pytorch.json").read_text())


@pytest.mark.parametrize("scheme,group", [("int8", None), ("int4", 64)])
def test_save_load_round_trip_bitwise(optimized, tmp_path: Path, scheme: str, group: int | None) -> None:
    model, inputs, report = optimized
    quantized = quantize(copy.deepcopy(model), scheme, group_size=group, **OURS)
    kp.save(quantized, tmp_path / scheme, report=report, max_shard_size="20KB")
    manifest = _manifest(tmp_path / scheme)
    quant = manifest["quantization"]
    assert manifest["format_version"] == 2 and len(manifest["files"]) > 1
    assert (quant["backend"], quant["scheme"], quant["group_size"]) == ("kernel_pytorch", scheme, group)
    assert quant["packing"] == (INT4_PACKING if scheme == "int4" else None)
    entry = quant["tensors"]["lm_head.weight"]
    assert entry["type"] == "QuantizedLinear" and entry["dtype"] == "bfloat16"
    assert set(entry["parts"]) == ({"qweight", "scale", "zero"} if scheme == "int4" else {"qweight", "scale"})
    assert all(manifest["tensors"][k]["dtype"] in ("int8", "uint8", "float32", "bfloat16")
               for k in entry["parts"].values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no version difference is reported (no torchao version recorded)
        loaded = [kp.load(tmp_path / scheme, _factory), kp.load(tmp_path / scheme, _factory())]
    for model_back in loaded:
        kinds = {type(m).__name__ for m in model_back.modules()}
        assert kinds == {type(m).__name__ for m in quantized.modules()} and "QuantizedLinear" in kinds
        with torch.no_grad():
            assert torch.equal(model_back(*inputs), quantized(*inputs))


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_shared_layer_written_once_and_loaded_shared(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = quantize(_Shared(), "int4", group_size=32, **OURS)
    assert model.a is model.b and isinstance(model.a, QuantizedLinear)
    kp.save(model, tmp_path / "shared")
    manifest = _manifest(tmp_path / "shared")
    assert set(manifest["quantization"]["tensors"]) == {"a.weight"}
    assert manifest["aliases"] == {"b.qweight": "a.qweight", "b.scale": "a.scale", "b.zero": "a.zero",
                                   "b.bias": "a.bias"}
    loaded = kp.load(tmp_path / "shared", _Shared)
    x = torch.randn(2, 32)
    assert loaded.a is loaded.b and torch.equal(loaded(x), model(x))


def test_tied_head_is_quantized_on_its_own(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = quantize(TiedHead(), "fp8", **OURS)
    kp.save(model, tmp_path / "tied")
    loaded = kp.load(tmp_path / "tied", TiedHead)
    ids = torch.randint(0, 32, (2, 5))
    assert torch.equal(loaded(ids), model(ids)) and type(loaded.embed.weight) is nn.Parameter


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.fixture()
def small_saved(tmp_path: Path) -> Path:
    kp.save(quantize(_small(), "int4", group_size=32, **OURS), tmp_path / "small")
    return tmp_path / "small"


def test_a_model_that_does_not_fit_is_refused_unchanged(small_saved: Path) -> None:
    other = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 6))
    before = snapshot(other)
    with pytest.raises(LoadError, match="2.weight"):
        kp.load(small_saved, other)
    assert unchanged(other, before)


def test_parts_that_do_not_fit_the_recorded_scheme_are_refused(small_saved: Path) -> None:
    """The manifest says int8 for int4's parts (uint8 (8, 8) and a zero point): refused, model untouched."""
    path = small_saved / "kernel_pytorch.json"
    manifest = json.loads(path.read_text())
    manifest["quantization"]["tensors"]["0.weight"]["scheme"] = "int8"
    path.write_text(json.dumps(manifest))
    model = _small()
    before = snapshot(model)
    with pytest.raises(LoadError, match="quantized tensor '0.weight'"):
        kp.load(small_saved, model)
    assert unchanged(model, before)


@pytest.mark.cuda
def test_aoti_package_on_the_gpu_carries_our_quantized_kernels(tmp_path: Path) -> None:
    """optimize, quantize (int4, our kernels), export with dynamic dims and package with AOTInductor: the
    package launches our Triton kernel and matches the model at another batch and length."""
    import zipfile

    from kernel_pytorch.deploy import aoti_package, export, load_package
    from kernel_pytorch.tolerances import compare_reordered

    model, inputs = build_model("llama-tiny", device="cuda", dtype=torch.bfloat16)
    model, _ = kp.optimize(model, inputs, seeds=(0,), validate=False, compile=False)
    quantize(model, "int4", group_size=32, **OURS)
    model.eval()
    path = aoti_package(export(model, inputs), inputs, tmp_path / "llama_int4.pt2")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        text = "".join(z.read(n).decode(errors="ignore") for n in names if n.endswith((".cpp", ".json", ".h")))
    assert "quant_matmul_kernel" in text or any("quant_matmul_kernel" in n for n in names)
    runner = load_package(path)
    ids = torch.randint(0, 512, (3, 17), device="cuda")
    with torch.no_grad():
        assert compare_reordered(runner(ids), model(ids)).passed
