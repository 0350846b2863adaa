"""The registered quantized-matmul ops (`kernel_pytorch::quant_matmul_{int8,int4,fp8}_fwd` / `_bwd`):
opcheck, the gradients of x and bias through the op and through the eager entry (its launchers run
under the interpreter on CPU), torch.compile(fullgraph=True) without breaks, and torch.export."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import ops
from kernel_pytorch.reference import quant_matmul as R
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.quant_helpers import assert_matmul_close, magnitude, quantized, reference, weight_args

DEV = device_under_test()
OPS = torch.ops.kernel_pytorch
SCHEMES = R.SCHEMES
N, K, GROUP = 12, 64, 32


def _fwd(scheme: str):
    return getattr(OPS, f"quant_matmul_{scheme}_fwd")


def _bwd(scheme: str):
    return getattr(OPS, f"quant_matmul_{scheme}_bwd")


# opcheck's schema test compares the inputs before and after with arithmetic torch does not have for
# float8_e4m3fn on the CPU; the fp8 ops run the other tests (the mutation check is the int8 op's: the
# same launcher)
_NO_FP8_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static",
                  "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_opcheck(scheme: str) -> None:
    parts = quantized(scheme, N, K, GROUP, DEV)
    w = weight_args(scheme, parts, GROUP)
    x = randn(3, K, dtype=torch.bfloat16, device=DEV).requires_grad_()
    bias = randn(N, dtype=torch.bfloat16, device=DEV).requires_grad_()
    dy = randn(3, N, dtype=torch.bfloat16, device=DEV)
    kw = {"test_utils": _NO_FP8_SCHEMA} if scheme == "fp8" else {}
    torch.library.opcheck(_fwd(scheme).default, (x, *w, bias), **kw)
    torch.library.opcheck(_fwd(scheme).default, (x.detach()[None], *w, None), **kw)
    torch.library.opcheck(_bwd(scheme).default, (dy, *w, True), **kw)
    torch.library.opcheck(_bwd(scheme).default, (dy, *w, False), **kw)


@pytest.mark.parametrize("entry", ["op", "eager"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradients_of_x_and_bias(scheme: str, entry: str) -> None:
    """y, dx and dbias through the op or the eager entry, against autograd through the reference; the
    quantized weight gets none."""
    parts = quantized(scheme, N, K, GROUP, DEV)
    w = weight_args(scheme, parts, GROUP)
    x = randn(2, 3, K, device=DEV).requires_grad_()
    bias = randn(N, device=DEV).requires_grad_()
    call = _fwd(scheme) if entry == "op" else getattr(ops, f"{scheme}_matmul_eager")
    y = call(x, *w, bias)
    expected = reference(scheme, x, parts, GROUP, bias)
    assert_matmul_close(y, expected, magnitude(scheme, x, parts, GROUP, bias), K, "y")
    dy = randn(*y.shape, device=DEV)
    got = torch.autograd.grad(y, (x, bias), dy)
    want = torch.autograd.grad(expected, (x, bias), dy)
    deq = R.dequantize(parts, scheme, GROUP, torch.float64)
    assert_matmul_close(got[0], want[0], dy.double().abs() @ deq.abs(), N, "dx")
    assert_matmul_close(got[1], want[1], dy.double().abs().sum((0, 1)), 6, "dbias")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_without_bias_x_alone_gets_a_gradient(scheme: str) -> None:
    parts = quantized(scheme, N, K, GROUP, DEV)
    x = randn(4, K, device=DEV).requires_grad_()
    y = getattr(ops, f"{scheme}_matmul_eager")(x, *weight_args(scheme, parts, GROUP), None)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    assert dx.shape == x.shape


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiles_without_breaks_and_exports(scheme: str) -> None:
    parts = quantized(scheme, N, K, GROUP, DEV)
    w = weight_args(scheme, parts, GROUP)
    x = randn(5, K, dtype=torch.bfloat16, device=DEV)
    bias = randn(N, dtype=torch.bfloat16, device=DEV)
    op = _fwd(scheme)

    def f(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return op(x, *w, bias) * 2

    compiled, breaks = compile_and_count_breaks(f, x, bias)
    assert breaks == 0
    assert_matmul_close(compiled, f(x, bias), 2 * magnitude(scheme, x, parts, GROUP, bias), K, "compiled")

    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return op(x, *w, bias)

    program = torch.export.export(Layer(), (x,))
    assert f"kernel_pytorch.quant_matmul_{scheme}_fwd.default" in str(program.graph)
    assert torch.equal(program.module()(x), op(x, *w, bias))
