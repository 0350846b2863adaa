"""The RMSNorm reference's casting modes against the modules they name, on CPU: "torch" bitwise against
torch.nn.RMSNorm / F.rms_norm, "llama" against transformers' LlamaRMSNorm, "gemma" against GemmaRMSNorm
(forward bitwise, gradients bitwise where the module's autograd sums in fp32 as the reference does)."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.reference.rms_norm import CASTINGS, rms_norm_rstd, rounds_normed
from tests.grid import DTYPES, ROW_SHAPES, randn
from tests.ops.norm_helpers import assert_close

EPS = 1e-6
# ROW_SHAPES plus one wide row, where the mean square is a long fp32 sum
SHAPES = (*ROW_SHAPES, ((3,), 4096))


def _inputs(lead: tuple[int, ...], cols: int, dtype: torch.dtype, w_dtype: torch.dtype):
    x = randn(*lead, cols, dtype=dtype, scale=3.0)
    w = randn(cols, dtype=w_dtype, scale=0.5, offset=1.0)
    dy = randn(*lead, cols, dtype=dtype)
    return x, w, dy


def _grads(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor):
    return torch.autograd.grad(y, (x, w), dy)


def _ours(x, w, dy, casting: str, offset: float = 0.0, eps: float = EPS):
    """Our forward and backward (the reference's own backward, as the CPU kernels use it)."""
    y = R.rms_norm(x, w, eps, offset, casting)
    dx, dw = R.rms_norm_backward(dy, x, w, rms_norm_rstd(x, eps), offset, casting)
    return y, dx, dw


# torch warns (once) that mixed dtypes take its composite rather than its fused kernel
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("w_dtype", ["x", torch.float32], ids=["w=x.dtype", "w=fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", SHAPES)
def test_torch_casting_is_torch_rms_norm_bitwise(lead, cols, dtype, w_dtype) -> None:
    """Forward and dweight bitwise those of F.rms_norm (also with fp32 weights, which torch runs
    through its composite); dx by the tolerance table (the two formulas order their sums apart)."""
    x, w, dy = _inputs(lead, cols, dtype, dtype if w_dtype == "x" else w_dtype)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    y_torch = torch.nn.functional.rms_norm(xg, (cols,), wg, EPS)
    dx_torch, dw_torch = _grads(y_torch, xg, wg, dy)
    y, dx, dw = _ours(x, w, dy, "torch")
    assert y.dtype == y_torch.dtype and torch.equal(y, y_torch)
    assert torch.equal(dw, dw_torch)
    assert_close(dx, dx_torch, "dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_casting_is_the_torch_module_with_default_eps(dtype: torch.dtype) -> None:
    """torch.nn.RMSNorm(eps=None) adds the machine epsilon of its fp32 computation, for bf16/fp16 x too."""
    m = torch.nn.RMSNorm(64).to(dtype)
    with torch.no_grad():
        m.weight.copy_(randn(64, scale=0.5, offset=1.0))
    x = randn(5, 64, dtype=dtype, scale=1e-3)  # small, so that eps matters
    y = R.rms_norm(x, m.weight.detach(), torch.finfo(torch.float32).eps, casting="torch")
    assert torch.equal(y, m(x).detach())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", SHAPES)
def test_llama_casting_is_hf_llama_rms_norm(lead, cols, dtype) -> None:
    """Forward bitwise that of transformers' LlamaRMSNorm with a weight of x's dtype; gradients by the
    tolerance table (HF's autograd forms dy * weight and dy * x_hat in x's dtype, ours in fp32)."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    x, w, dy = _inputs(lead, cols, dtype, dtype)
    m = llama.LlamaRMSNorm(cols, eps=EPS).to(dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    xg = x.clone().requires_grad_()
    y_hf = m(xg)
    dx_hf, dw_hf = _grads(y_hf, xg, m.weight, dy)
    y, dx, dw = _ours(x, w, dy, "llama")
    assert torch.equal(y, y_hf)
    assert_close(dx, dx_hf, "dx")
    assert_close(dw, dw_hf, "dweight")


@pytest.mark.parametrize("w_dtype", ["x", torch.float32], ids=["w=x.dtype", "w=fp32"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", SHAPES)
def test_gemma_casting_is_hf_gemma_rms_norm(lead, cols, dtype, w_dtype) -> None:
    """offset=1.0: forward and dweight bitwise those of transformers' GemmaRMSNorm, (1 + weight) formed
    in fp32; dx by the tolerance table."""
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    x, w, dy = _inputs(lead, cols, dtype, dtype if w_dtype == "x" else w_dtype)
    w = (w - 1.0).to(w.dtype)  # Gemma's weight is the scale less one
    m = gemma.GemmaRMSNorm(cols, eps=EPS).to(w.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    xg = x.clone().requires_grad_()
    y_hf = m(xg)
    dx_hf, dw_hf = _grads(y_hf, xg, m.weight, dy)
    y, dx, dw = _ours(x, w, dy, "gemma", offset=1.0)
    assert torch.equal(y, y_hf)
    assert torch.equal(dw, dw_hf)
    assert_close(dx, dx_hf, "dx")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_modes_differ_only_in_where_they_round(dtype: torch.dtype) -> None:
    """gemma and torch are one computation; llama differs in low precision, and not at all in fp32."""
    x, w, dy = _inputs((16,), 256, dtype, dtype)
    outs = {c: _ours(x, w, dy, c, offset=0.5) for c in CASTINGS}
    for a, b in zip(outs["gemma"], outs["torch"]):
        assert torch.equal(a, b)
    y_llama, dx_llama, dw_llama = outs["llama"]
    y_torch, dx_torch, dw_torch = outs["torch"]
    assert not torch.equal(y_llama, y_torch) and not torch.equal(dw_llama, dw_torch)
    assert torch.equal(dx_llama, dx_torch)  # dx treats the rounding as the identity in every mode
    x32, w32, dy32 = x.float(), w.float(), dy.float()
    for a, b in zip(_ours(x32, w32, dy32, "llama"), _ours(x32, w32, dy32, "torch")):
        assert torch.equal(a, b)


def test_torch_casting_is_closer_to_fp64_in_bf16() -> None:
    """The issue behind the modes: in bf16, Llama's two roundings land further from fp64 than torch's
    one (worst error ~1.8x here); "torch" errs exactly as torch.nn.RMSNorm does."""
    x, w, _ = _inputs((64,), 1024, torch.bfloat16, torch.bfloat16)
    y64 = R.rms_norm(x.double(), w.double(), EPS)
    err = {c: (R.rms_norm(x, w, EPS, casting=c).double() - y64).abs().max().item() for c in ("llama", "torch")}
    torch_err = (torch.nn.functional.rms_norm(x, (1024,), w, EPS).double() - y64).abs().max().item()
    assert err["torch"] == torch_err
    assert err["llama"] > 1.5 * err["torch"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_none_casting_is_the_math_in_the_input_dtype(dtype: torch.dtype) -> None:
    """casting="none" (Liger's casting_mode="none"): the fp32 statistic, then every product in x's dtype,
    bit for bit as torch computes it on low-precision tensors; the least accurate of the modes."""
    x, w = randn(8, 96, dtype=dtype, scale=3.0), randn(96, dtype=dtype, scale=0.5, offset=1.0)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    in_dtype = x * rstd.to(dtype) * (w.float() + 1.0).to(dtype)
    y = R.rms_norm(x, w, EPS, 1.0, "none")
    assert y.dtype == dtype and torch.equal(y, in_dtype)
    y64 = R.rms_norm(x.double(), w.double(), EPS, 1.0)
    err = {c: (R.rms_norm(x, w, EPS, 1.0, c).double() - y64).abs().max().item() for c in ("none", "torch")}
    assert err["none"] > err["torch"]
    for exact in (torch.float32, torch.float64):  # no rounding to differ in: one computation
        xe, we = x.to(exact), w.to(exact)
        torch.testing.assert_close(R.rms_norm(xe, we, EPS, 1.0, "none"), R.rms_norm(xe, we, EPS, 1.0, "torch"))


@pytest.mark.parametrize("casting", CASTINGS)
def test_backward_is_the_gradient_in_fp64(casting: str) -> None:
    x = randn(6, 40, dtype=torch.float64).requires_grad_()
    w = randn(40, dtype=torch.float64, offset=1.0).requires_grad_()
    dy = randn(6, 40, dtype=torch.float64)
    gx, gw = _grads(R.rms_norm(x, w, EPS, 0.5, casting), x, w, dy)
    dx, dw = R.rms_norm_backward(dy, x.detach(), w.detach(), rms_norm_rstd(x.detach(), EPS), 0.5, casting)
    torch.testing.assert_close(dx, gx)
    torch.testing.assert_close(dw, gw)


@pytest.mark.parametrize("casting", CASTINGS)
def test_add_rms_norm_passes_the_casting_on(casting: str) -> None:
    x, r, w = randn(4, 32, dtype=torch.bfloat16), randn(4, 32, dtype=torch.bfloat16), randn(32, offset=1.0)
    y, h = R.add_rms_norm(x, r, w, EPS, 0.0, casting)
    assert torch.equal(h, (x.float() + r.float()).bfloat16())
    assert torch.equal(y, R.rms_norm(h, w, EPS, 0.0, casting))
    dy, dh = randn(4, 32, dtype=torch.bfloat16), randn(4, 32, dtype=torch.bfloat16)
    d_sum, dw = R.add_rms_norm_backward(dy, dh, h, w, rms_norm_rstd(h, EPS), 0.0, casting)
    dx_norm, dw_norm = R.rms_norm_backward(dy, h, w, rms_norm_rstd(h, EPS), 0.0, casting)
    assert torch.equal(dw, dw_norm)
    assert torch.equal(d_sum, (dx_norm.float() + dh.float()).bfloat16())


def test_unknown_casting_is_refused() -> None:
    assert rounds_normed("llama") and not any(rounds_normed(c) for c in ("gemma", "torch", "none"))
    x, w = randn(2, 8), randn(8)
    with pytest.raises(ValueError, match=r"casting must be one of \('llama', 'gemma', 'torch', 'none'\)"):
        R.rms_norm(x, w, casting="fp32")
