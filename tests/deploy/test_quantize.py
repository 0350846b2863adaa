"""`deploy.quantize`: weight-only int8/fp8 (int4 where this torchao has the kernels) after optimize(),
validated by the scheme's tolerance, and the determinism report: quantize, export and run twice."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import sys

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.deploy.quantize import (
    INSTALL_HINT,
    SCHEMES,
    available_schemes,
    expected_rtol,
    quant_determinism,
    quant_rtol,
    quantize,
    quantized_linears,
    rounding_variance,
    tensors_of,
    validate_quantized,
)
from kernel_pytorch.models import MODELS, build_model


def test_without_torchao_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # None in sys.modules: the import raises
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ImportError, match=r"kernel-pytorch\[quant\]"):
        quantize(nn.Linear(4, 4), "int8")
    with pytest.raises(ImportError, match=INSTALL_HINT.replace("[", r"\[").replace("]", r"\]")):
        available_schemes()


# torchao is in the dev extra (CI has it); elsewhere (the GPU machine) these skip
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao (the [quant] extra) is not installed")


@pytest.fixture(scope="module")
def supported() -> dict[str, str]:
    return available_schemes()


@pytest.fixture(scope="module")
def optimized() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """llama-tiny with one layer, bf16, after optimize(): our RMSNorm and GatedMLP around nn.Linears."""
    config = dataclasses.replace(MODELS["llama-tiny"].config, n_layers=1)
    model, inputs = build_model("llama-tiny", dtype=torch.bfloat16, config=config)
    model, report = kp.optimize(model, inputs, seeds=(0,))
    assert report.passed
    return model, inputs


@needs_torchao
@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_model_validates_within_its_scheme_tolerance(optimized, supported, scheme: str) -> None:
    if supported[scheme]:
        pytest.skip(f"{scheme} does not run with this torchao here: {supported[scheme]}")
    model, inputs = optimized
    quantized = quantize(copy.deepcopy(model), scheme)
    kinds = {type(m.weight).__name__ for m in quantized.modules() if isinstance(m, nn.Linear)}
    assert kinds.isdisjoint({"Parameter", "Tensor"}), kinds  # every Linear, ours included, quantized
    check = validate_quantized(model, quantized, inputs, scheme)
    assert check.passed, check.summary()
    assert check.result.determinism is not None and check.result.determinism.deterministic
    # the tolerance is not vacuous: the quantized output does differ from the unquantized one
    assert max(c.max_abs_err for c in check.checks) > 0


@needs_torchao
def test_a_wrong_model_fails_validation(optimized) -> None:
    model, inputs = optimized
    other = quantize(build_model("llama-tiny", dtype=torch.bfloat16, seed=1, config=dataclasses.replace(
        MODELS["llama-tiny"].config, n_layers=1))[0], "int8")
    assert not validate_quantized(model, other, inputs, "int8").passed


@needs_torchao
def test_quantize_export_and_run_twice_are_bitwise(optimized) -> None:
    model, inputs = optimized
    report = quant_determinism(model, inputs, "int8")
    assert report.deterministic, report.summary()
    assert [s.name.split(":")[0] for s in report.steps] == ["quantize twice", "export twice", "run twice", "run twice"]
    assert "kernel_pytorch::rms_norm_fwd" in report.steps[1].detail  # our ops survive in the quantized export
    parts = tensors_of(quantize(copy.deepcopy(model), "int8").state_dict())
    assert any(k.endswith(".qdata") for k in parts) and any(k.endswith(".scale") for k in parts)


class Noisy(nn.Module):
    """A model whose forward draws random numbers: the run step differs, quantize and export do not."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + 1e-3 * torch.rand_like(x)


@needs_torchao
def test_the_report_names_the_step_that_is_not_bitwise() -> None:
    report = quant_determinism(Noisy(), (torch.randn(2, 16),), "int8")
    verdicts = {s.name: s.identical for s in report.steps}
    assert verdicts["quantize twice: quantized tensors and scales"]
    assert verdicts["run twice: the quantized model's outputs"] is False
    assert not report.deterministic and "DIFFERS" in report.summary()


@needs_torchao
@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_rounding_model_matches_torchaos_rounding(scheme: str) -> None:
    """rounding_variance predicts the mean squared error torchao's own quantization leaves in a weight
    matrix (quantized, then dequantized through the layer): within 15% on 256 x 1024 Gaussian weights
    with outliers in a few rows."""
    torch.manual_seed(0)
    layer = nn.Linear(1024, 256, bias=False)
    with torch.no_grad():
        layer.weight.mul_(torch.rand(256, 1) + 0.5)
        layer.weight[:4, :3] *= 8
    w = layer.weight.detach().clone()
    quantize(layer, scheme)
    eye = torch.eye(1024)
    with torch.no_grad():
        dequant = layer(eye).t()  # column j of W_q: W_q @ e_j
    measured = float((dequant.double() - w.double()).pow(2).mean())
    predicted = float(rounding_variance(w, scheme).mean())
    assert measured == pytest.approx(predicted, rel=0.15), (measured, predicted)


def test_rounding_variance_int4_groups_and_unknown_scheme() -> None:
    w = torch.zeros(2, 64)
    w[0, :32] = torch.linspace(0, 15, 32)  # one group spanning 15: step 1, variance 1/12
    var = rounding_variance(w, "int4")
    assert torch.allclose(var[0, :32], torch.full((32,), 1 / 12, dtype=torch.float64))
    assert torch.equal(var[1], torch.zeros(64, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown scheme"):
        rounding_variance(w, "int3")


def test_expected_rtol_adds_layers_in_quadrature() -> None:
    """Four identical layers expect twice the relative error of one."""
    torch.manual_seed(0)
    one = nn.Sequential(nn.Linear(64, 64))
    four = nn.Sequential(*[copy.deepcopy(one[0]) for _ in range(4)])
    r1, n1 = expected_rtol(one, "int8")
    r4, n4 = expected_rtol(four, "int8")
    assert (n1, n4) == (1, 4) and r4 == pytest.approx(2 * r1, rel=1e-9) and 0 < r1 < 0.02


@needs_torchao
def test_quant_rtol_uses_the_original_weights_of_the_quantized_layers(optimized) -> None:
    model, inputs = optimized
    quantized = quantize(copy.deepcopy(model), "int8")
    names = quantized_linears(quantized)
    assert names and all(isinstance(dict(model.named_modules())[n], nn.Linear) for n in names)
    assert quant_rtol(model, quantized, "int8") == expected_rtol(model, "int8", names)
    check = validate_quantized(model, quantized, inputs, "int8")
    assert check.layers == len(names) and "quant_rtol" in check.summary()
    # nothing quantized: said, not passed
    unchanged = validate_quantized(model, copy.deepcopy(model), inputs, "int8")
    assert not unchanged.passed and "no quantized linear layer" in unchanged.summary()


@needs_torchao
@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_quantized_model_runs_with_grad_enabled(optimized, scheme: str) -> None:
    """Outside no_grad (a forward that records a graph, as a quantized model's first use often is) our
    fused MLP paths would hand the quantized weight to our kernels; they step aside and the output is
    the no_grad one's."""
    model, inputs = optimized
    quantized = quantize(copy.deepcopy(model), scheme)
    with torch.no_grad():
        expected = quantized(*inputs)
    with torch.enable_grad():
        got = quantized(*inputs)
    expected = expected if isinstance(expected, torch.Tensor) else expected[0]
    got = got if isinstance(got, torch.Tensor) else got[0]
    assert torch.equal(got.detach(), expected)


def test_expected_rtol_reads_weights_in_row_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row blocks (3 rows here, the last one short) give the whole matrix's answer."""
    q = importlib.import_module("kernel_pytorch.deploy.quantize")  # the package's `quantize` is the function
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(64, 10))
    whole = [expected_rtol(layer, s)[0] for s in ("int8", "fp8", "int4")]
    monkeypatch.setattr(q, "RTOL_ROWS", 3)
    assert [expected_rtol(layer, s)[0] for s in ("int8", "fp8", "int4")] == pytest.approx(whole, rel=1e-12)
