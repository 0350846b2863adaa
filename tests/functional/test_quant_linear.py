"""functional.quant_linear: every backend gives the reference's output, the argument errors name the
argument, fp64 runs the reference, and torch.compile(fullgraph=True) and torch.export keep the op."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.functional import quant_linear
from kernel_pytorch.reference import quant_matmul as R
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.quant_helpers import assert_matmul_close, magnitude, quantized, reference

DEV = device_under_test()
N, K, GROUP = 12, 64, 32


def _kw(scheme: str, parts: dict) -> dict:
    extra = {"zero": parts["zero"], "group_size": GROUP} if scheme == "int4" else {}
    return {"scheme": scheme, **extra}


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_backends_agree_with_the_reference(scheme: str) -> None:
    parts = quantized(scheme, N, K, GROUP, DEV)
    x = randn(2, 3, K, dtype=torch.bfloat16, device=DEV)
    bias = randn(N, dtype=torch.bfloat16, device=DEV)
    expected = reference(scheme, x, parts, GROUP, bias)
    mag = magnitude(scheme, x, parts, GROUP, bias)
    for backend in ("auto", "reference") + (("triton",) if DEV == "cuda" else ()):
        y = quant_linear(x, parts["qweight"], parts["scale"], bias, backend=backend, **_kw(scheme, parts))
        assert_matmul_close(y, expected, mag, K, backend)
    y64 = quant_linear(x.double(), parts["qweight"], parts["scale"], None, **_kw(scheme, parts))
    assert y64.dtype == torch.float64


def test_triton_backend_off_cuda_says_why() -> None:
    if DEV == "cuda":
        pytest.skip("the Triton path runs here")
    parts = quantized("int8", N, K, device=DEV)
    with pytest.raises(ValueError, match="backend='triton' cannot run quant_linear"):
        quant_linear(randn(2, K, device=DEV), parts["qweight"], parts["scale"], scheme="int8", backend="triton")


def test_argument_errors_name_the_argument() -> None:
    p8 = quantized("int8", N, K, device=DEV)
    p4 = quantized("int4", N, K, GROUP, DEV)
    x = randn(3, K, device=DEV)
    cases = [
        (lambda: quant_linear(x, p8["qweight"], p8["scale"], scheme="int2"), ValueError, "scheme must be one of"),
        (lambda: quant_linear(x, p8["qweight"].float(), p8["scale"], scheme="int8"), TypeError, "qweight of scheme"),
        (lambda: quant_linear(x[:, :32], p8["qweight"], p8["scale"], scheme="int8"), ValueError, "qweight must have"),
        (lambda: quant_linear(x, p8["qweight"], p8["scale"][:3], scheme="int8"), ValueError, "scale must have"),
        (lambda: quant_linear(x, p8["qweight"], p8["scale"], randn(N, dtype=torch.float16, device=DEV),
                              scheme="int8"), TypeError, "bias must have x's dtype"),
        (lambda: quant_linear(x, p8["qweight"], p8["scale"], scheme="int8", group_size=32), ValueError,
         "zero and group_size are int4's"),
        (lambda: quant_linear(x, p4["qweight"], p4["scale"], scheme="int4", zero=p4["zero"], group_size=48),
         ValueError, "group_size must be one of"),
        (lambda: quant_linear(x, p4["qweight"], p4["scale"], scheme="int4", zero=None, group_size=GROUP),
         TypeError, "zero must be a uint8"),
        (lambda: quant_linear(x, p4["qweight"], p4["scale"][:, :1], scheme="int4", zero=p4["zero"],
                              group_size=GROUP), ValueError, "scale must have"),
        (lambda: quant_linear(x.int(), p8["qweight"], p8["scale"], scheme="int8"), TypeError, "x must be a floating"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_compile_and_export_keep_the_op(scheme: str) -> None:
    parts = quantized(scheme, N, K, GROUP, DEV)
    x = randn(4, K, dtype=torch.bfloat16, device=DEV)

    def f(x: torch.Tensor) -> torch.Tensor:
        return quant_linear(x, parts["qweight"], parts["scale"], **_kw(scheme, parts)) + 1

    compiled, breaks = compile_and_count_breaks(f, x)
    assert breaks == 0
    assert_matmul_close(compiled, f(x), magnitude(scheme, x, parts, GROUP, None) + 1, K, "compiled")

    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return f(x)

    program = torch.export.export(Layer(), (x,))
    assert f"quant_matmul_{scheme}_fwd" in str(program.graph)
