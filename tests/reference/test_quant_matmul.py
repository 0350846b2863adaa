"""The quantizers of reference/quant_matmul.py: every weight within half a step of its dequantized value,
the mean squared error step^2 / 12, the int4 packing, zero exactly representable, the edge rows, the
argument errors; and the matmul reference's own rounding."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.reference import quant_matmul as R
from tests.grid import device_under_test, randn

DEV = device_under_test()


def _weight(n: int = 64, k: int = 200, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Gaussian rows of different scales, a few outliers."""
    w = randn(n, k, device=DEV) * (torch.rand(n, 1, device=DEV) + 0.25)
    w[:3, :2] *= 10
    return w.to(dtype)


# int4's scale is rounded up to bf16 (at most 2^-8 relative): its steps may be that much wider
SLACK = {"int8": 1.0, "fp8": 1.0, "int4": 1 + 2.0 ** -7}


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_every_weight_within_half_a_step(scheme: str, group: int) -> None:
    w = _weight()
    parts = R.quantize(w, scheme, group)
    err = (R.dequantize(parts, scheme, group, torch.float64) - w.double()).abs()
    step = R.rounding_step(w, scheme, group)
    # plus fp32's own roundings in the quantizer (w / scale) and the dequantization (q x scale)
    assert bool((err <= 0.5 * step * SLACK[scheme] + 2.0 ** -21 * w.double().abs()).all()), float((err / step).max())


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_mean_squared_error_is_step_squared_over_twelve(scheme: str) -> None:
    """Rounding to nearest over many steps: uniform error, variance step^2 / 12 (within 10% over 64 x 512
    Gaussian weights); the variance deploy.quantize's tolerance adds up (expected_rtol)."""
    w = _weight(64, 512, torch.float32)
    parts = R.quantize(w, scheme, 32)
    err = R.dequantize(parts, scheme, 32, torch.float64) - w.double()
    predicted = float((R.rounding_step(w, scheme, 32) ** 2 / 12).mean())
    assert float(err.pow(2).mean()) == pytest.approx(predicted, rel=0.1)


def test_int4_packing_and_layout() -> None:
    q = torch.randint(0, 16, (5, 70), dtype=torch.uint8, device=DEV)
    packed = R.pack_int4(q)
    assert packed.shape == (5, 35) and packed.dtype == torch.uint8
    assert torch.equal(packed[:, 0] & 15, q[:, 0]) and torch.equal(packed[:, 0] >> 4, q[:, 1])  # even k low
    assert torch.equal(R.unpack_int4(packed), q)


def test_int4_parts_zero_and_short_last_group() -> None:
    w = _weight(8, 70, torch.float16)
    qweight, scale, zero = R.quantize_int4(w, 32)
    assert (qweight.shape, scale.shape, zero.shape) == ((8, 35), (8, 3), (8, 3))
    assert scale.dtype == torch.float16 and zero.dtype == torch.uint8 and int(zero.max()) <= 15
    z = torch.zeros(8, 70, device=DEV, dtype=torch.float16)
    z[:, ::3] = w[:, ::3]
    deq = R.dequantize_int4(*R.quantize_int4(z, 32), 32)
    assert torch.equal(deq[:, 1::3], torch.zeros_like(deq[:, 1::3]))  # zero is a grid point of every group
    assert R.quantize_int4(w.float(), 32)[1].dtype == torch.float32


def test_edge_rows() -> None:
    """An all-zero row quantizes to zeros; a row's largest magnitude is represented exactly (int8's
    +-127 steps, fp8's +-448)."""
    w = _weight(4, 64, torch.float32)
    w[1] = 0
    for scheme in R.SCHEMES:
        parts = R.quantize(w, scheme, 32)
        deq = R.dequantize(parts, scheme, 32)
        assert torch.equal(deq[1], torch.zeros_like(deq[1])), scheme
        assert torch.isfinite(deq).all()
        if scheme != "int4":
            top = w.abs().argmax(dim=1)
            rows = torch.arange(4, device=DEV)
            torch.testing.assert_close(deq[rows, top], w[rows, top], rtol=1e-6, atol=0)


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="group_size must be one of"):
        R.quantize_int4(_weight(2, 64), 48)
    with pytest.raises(ValueError, match="K must be even"):
        R.quantize_int4(_weight(2, 63), 32)
    with pytest.raises(ValueError, match="unknown scheme"):
        R.quantize(_weight(2, 64), "int3")
    with pytest.raises(ValueError, match="floating"):
        R.quantize_int8(torch.ones(3, dtype=torch.int32))


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_matmul_rounds_once_to_x_dtype(scheme: str) -> None:
    """The reference is x @ dequant(W).T + bias in fp32, rounded once (fp64 for fp64 x: the yardstick)."""
    parts = R.quantize(_weight(6, 64), scheme, 32)
    args = (parts["qweight"], parts["scale"], parts["zero"], 32) if scheme == "int4" else (parts["qweight"],
                                                                                          parts["scale"])
    fn = getattr(R, f"{scheme}_matmul")
    x, bias = randn(3, 64, dtype=torch.bfloat16, device=DEV), randn(6, device=DEV)
    w = R.dequantize(parts, scheme, 32)
    assert torch.equal(fn(x, *args, bias), (x.float() @ w.t() + bias).to(torch.bfloat16))
    y64 = fn(x.double(), *args, None)
    assert y64.dtype == torch.float64
    torch.testing.assert_close(y64, x.double() @ R.dequantize(parts, scheme, 32, torch.float64).t())
