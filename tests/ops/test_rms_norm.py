"""RMSNorm: kernels vs the reference (both paths, strided rows, every dtype, every casting), the
reference's backward vs autograd, registration (opcheck, compile, export), the calls from before the
casting argument, determinism, and a hypothesis fuzz."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_pytorch import reference as R
from kernel_pytorch.ops.rms_norm import rms_norm_bwd, rms_norm_eager, rms_norm_fwd
from kernel_pytorch.reference.rms_norm import CASTINGS, rms_norm_from_rstd, rms_norm_rstd
from tests.grid import (
    DTYPES,
    ROW_SHAPES,
    Poisoned,
    compile_and_count_breaks,
    device_under_test,
    randn,
    strided_rows,
)
from tests.ops.conftest import assert_schedule_covers_tails, many_rows
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
EPS = 1e-6
# (dtype, casting, offset): Llama's rounding with and without an offset in every dtype; torch's and
# Gemma's (1 + weight) in bf16, where they round elsewhere (fp16: test_forward_bitwise_given_rstd;
# in fp32 the modes are one computation), so the interpreter grid stays small. "none" in fp16: its four
# roundings, each a truncation under the interpreter's bf16, leave the table's bf16 budget there (the
# GPU rounds to nearest: test_cuda_forward_bitwise_given_rstd checks its bf16 bit for bit)
DTYPE_CASTINGS = tuple((d, c, o) for d in DTYPES for c, o in (("llama", 0.0), ("llama", 1.0))) + (
    (torch.bfloat16, "torch", 0.0), (torch.bfloat16, "gemma", 1.0), (torch.float16, "none", 1.0),
)


def _assert_backward(dx, dw, dy, x, w, rstd, offset: float = 0.0, dres=None, casting: str = "llama") -> None:
    """dx (plus the residual gradient `dres` where given) against the reference by the tolerance
    table; dweight, a sum over rows, against fp64 with PyTorch's own low-precision sum as yardstick."""
    dx_ref, dw_ref = R.rms_norm_backward(dy, x, w, rstd, offset, casting)
    if dres is not None:
        dx_ref = (dx_ref.float() + dres.float()).to(dx.dtype)
    assert_close(dx, dx_ref, "dx")
    dw64 = R.rms_norm_backward(dy.double(), x.double(), w.double(), rms_norm_rstd(x.double(), EPS), offset)[1]
    assert_budget(dw, dw_ref, dw64, "dweight")


@pytest.mark.parametrize("dtype,casting,offset", DTYPE_CASTINGS, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_kernels_match_reference(lead, cols, dtype, casting, offset, row_path) -> None:
    """Every casting by the tolerance table (the interpreter truncates fp32 -> bf16 where the GPU
    rounds to nearest, so CPU bf16 is not bitwise; test_forward_bitwise_given_rstd is)."""
    x = strided_rows(lead, cols, dtype, DEV)
    w = randn(cols, dtype=dtype, device=DEV, scale=0.5, offset=1.0)
    dy = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        y, rstd, h = rms_norm_fwd(x, w, EPS, offset, casting)
        dx, dw = rms_norm_bwd(dy, x, w, rstd, offset, casting)
    assert h is None
    assert_close(y, R.rms_norm(x, w, EPS, offset, casting), "y")
    assert_close(rstd, rms_norm_rstd(x, EPS), "rstd")
    _assert_backward(dx, dw, dy, x, w, rms_norm_rstd(x, EPS), offset, casting=casting)


# rows near zero (eps is most of mean(x^2) + eps) and a large eps: what tells rsqrt(mean(x^2) + eps) from
# rsqrt(mean(x^2)) + eps or 1 / (sqrt(mean(x^2)) + eps); unit rows with eps 1e-6 cannot
EPS_CASES = pytest.mark.parametrize("scale,eps", [(1e-4, EPS), (1.0, 0.1)], ids=["rows_near_zero", "large_eps"])


@EPS_CASES
def test_eps_inside_the_square_root(scale: float, eps: float, row_path) -> None:
    x = randn(5, 33, device=DEV, scale=scale)
    w = randn(33, device=DEV, scale=0.5, offset=1.0)
    dy = randn(5, 33, device=DEV)
    y, rstd, _ = rms_norm_fwd(x, w, eps, 0.0)
    x64 = x.double()
    assert_close(rstd, (1 / torch.sqrt(x64.pow(2).mean(-1) + eps)).float(), "rstd")
    assert_close(y, R.rms_norm(x, w, eps, 0.0), "y")
    dx, dw = rms_norm_bwd(dy, x, w, rstd, 0.0)
    dx_ref, dw_ref = R.rms_norm_backward(dy, x, w, rms_norm_rstd(x, eps), 0.0)
    assert_close(dx, dx_ref, "dx")
    assert_close(dw, dw_ref, "dweight")


def _assert_forward_bitwise(dtype: torch.dtype, cols: int, casting: str, device: str) -> None:
    """Given the kernel's own rstd, y is the reference's bit for bit: the modes round where the
    reference does, with the same fp32 products (the rstd itself sums in another order)."""
    x = strided_rows((9,), cols, dtype, device)
    w = randn(cols, dtype=dtype, device=device, scale=0.5, offset=1.0)
    for offset in (0.0, 1.0):
        y, rstd, _ = rms_norm_fwd(x, w, EPS, offset, casting)
        assert torch.equal(y, rms_norm_from_rstd(x, w, rstd, offset, casting)), (casting, offset)


@pytest.mark.parametrize("casting", CASTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_forward_bitwise_given_rstd(dtype: torch.dtype, casting: str, row_path) -> None:
    """fp32 and fp16 on every device (the interpreter rounds to fp16 as the GPU does); bf16 in
    test_cuda_forward_bitwise_given_rstd."""
    _assert_forward_bitwise(dtype, 100, casting, DEV)


def test_castings_differ_in_bf16() -> None:
    """The constexprs reach the kernels: in bf16 the llama, none and torch outputs and weight gradients
    differ, gemma's are torch's, and dx is the same in every mode."""
    x = randn(16, 64, dtype=torch.bfloat16, device=DEV, scale=3.0)
    w = randn(64, dtype=torch.bfloat16, device=DEV, scale=0.5, offset=1.0)
    dy = randn(16, 64, dtype=torch.bfloat16, device=DEV)
    out = {}
    for casting in CASTINGS:
        y, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0, casting)
        out[casting] = (y, *rms_norm_bwd(dy, x, w, rstd, 0.0, casting))
    assert all(torch.equal(a, b) for a, b in zip(out["gemma"], out["torch"]))
    (y_l, dx_l, dw_l), (y_t, dx_t, dw_t) = out["llama"], out["torch"]
    assert not torch.equal(y_l, y_t) and not torch.equal(dw_l, dw_t) and torch.equal(dx_l, dx_t)
    y_n, dx_n, dw_n = out["none"]
    assert not torch.equal(y_n, y_t) and not torch.equal(dw_n, dw_t) and torch.equal(dx_n, dx_t)


def test_calls_from_before_casting_round_as_llama() -> None:
    """The op, its eager entry and the launchers without a casting: HF Llama's rounding, as before (each
    against itself with casting="llama": on CPU the op runs the reference, the others the kernels)."""
    x = randn(4, 24, dtype=torch.bfloat16, device=DEV, scale=3.0).requires_grad_()
    w = randn(24, dtype=torch.bfloat16, device=DEV, offset=1.0).requires_grad_()
    dy = randn(4, 24, dtype=torch.bfloat16, device=DEV)
    op = torch.ops.kernel_pytorch.rms_norm_fwd
    pairs = [(op(x, w, EPS, 0.0)[0], op(x, w, EPS, 0.0, "llama")[0]),
             (rms_norm_eager(x, w, EPS, 0.0), rms_norm_eager(x, w, EPS, 0.0, "llama"))]
    for old, llama in pairs:
        assert torch.equal(old, llama) and not torch.equal(old, op(x, w, EPS, 0.0, "torch")[0])
        for g, e in zip(torch.autograd.grad(old, (x, w), dy), torch.autograd.grad(llama, (x, w), dy)):
            assert torch.equal(g, e)
    xd, wd = x.detach(), w.detach()
    y, rstd, _ = rms_norm_fwd(xd, wd, EPS, 0.0)
    assert torch.equal(y, rms_norm_fwd(xd, wd, EPS, 0.0, "llama")[0])
    for a, b in zip(rms_norm_bwd(dy, xd, wd, rstd, 0.0), rms_norm_bwd(dy, xd, wd, rstd, 0.0, "llama")):
        assert torch.equal(a, b)
    _, rstd_op = op(xd, wd, EPS, 0.0)
    bwd = torch.ops.kernel_pytorch.rms_norm_bwd
    for a, b in zip(bwd(dy, xd, wd, rstd_op, 0.0), bwd(dy, xd, wd, rstd_op, 0.0, "llama")):
        assert torch.equal(a, b)


def test_unknown_casting_is_refused() -> None:
    x, w = randn(2, 8, device=DEV), randn(8, device=DEV)
    for call in (lambda: rms_norm_fwd(x, w, EPS, 0.0, "half"),
                 lambda: torch.ops.kernel_pytorch.rms_norm_fwd(x, w, EPS, 0.0, "half"),
                 lambda: rms_norm_bwd(x, x, w, rms_norm_rstd(x, EPS), 0.0, "fp32")):
        with pytest.raises(ValueError, match="casting must be one of"):
            call()


def test_reference_backward_is_the_gradient_of_the_reference() -> None:
    x = randn(6, 40, dtype=torch.float64).requires_grad_()
    w = randn(40, dtype=torch.float64, offset=1.0).requires_grad_()
    dy = randn(6, 40, dtype=torch.float64)
    y = R.rms_norm(x, w, EPS, 0.5)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    dx, dw = R.rms_norm_backward(dy, x.detach(), w.detach(), rms_norm_rstd(x.detach(), EPS), 0.5)
    torch.testing.assert_close(dx, gx)
    torch.testing.assert_close(dw, gw)


@pytest.mark.parametrize("casting", ["llama", "torch"])
def test_bf16_within_fp64_budget_of_torch_eager(casting: str) -> None:
    """Long-row bf16: our error vs fp64 is at most 2x that of PyTorch's own bf16 rms_norm."""
    x = randn(8, 1000, dtype=torch.bfloat16, device=DEV, scale=3.0)
    w = randn(1000, dtype=torch.bfloat16, device=DEV, offset=1.0)
    dy = randn(8, 1000, dtype=torch.bfloat16, device=DEV)
    y, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0, casting)
    dx, _ = rms_norm_bwd(dy, x, w, rstd, 0.0, casting)
    x64 = x.double().requires_grad_()
    y64 = R.rms_norm(x64, w.double(), EPS)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    xe = x.clone().requires_grad_()
    ye = torch.nn.functional.rms_norm(xe, (1000,), w, EPS)
    (dxe,) = torch.autograd.grad(ye, xe, dy)
    assert_budget(y, ye, y64, "y")
    assert_budget(dx, dxe, dx64, "dx")


def test_backward_is_bitwise_deterministic(row_path) -> None:
    x = randn(37, 48, dtype=torch.bfloat16, device=DEV)
    w = randn(48, dtype=torch.bfloat16, device=DEV, offset=1.0)
    dy = randn(37, 48, dtype=torch.bfloat16, device=DEV)
    _, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0)
    a = rms_norm_bwd(dy, x, w, rstd, 0.0)
    b = rms_norm_bwd(dy, x, w, rstd, 0.0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("casting", ["llama", "torch"])
def test_backward_schedules_cover_tails(many_programs: str, casting: str) -> None:
    """Several programs per launch, tiles and row groups cut short, with the residual gradient."""
    rows, cols = many_rows(), 37
    assert_schedule_covers_tails(many_programs, rows, cols, 2)
    x = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    w = randn(cols, dtype=torch.bfloat16, device=DEV, offset=1.0)
    dy = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    dres = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    _, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0, casting)
    with Poisoned():
        dx, dw = rms_norm_bwd(dy, x, w, rstd, 0.0, casting, dres=dres)
    _assert_backward(dx, dw, dy, x, w, rstd, dres=dres, casting=casting)


@pytest.mark.parametrize("block", [1024, 2048, 4096, 8192])
def test_backward_tilings_by_width(block: int) -> None:
    """Each width's tiling in the config's `bwd_tilings` is the one the backward launches for rows of
    that block, and it covers every row: applied to a small row (so the interpreter runs it) on more
    rows than its programs take in one pass, against the reference."""
    from kernel_pytorch.ops import tuning
    from kernel_pytorch.ops._common import rows as _rows

    cfg = tuning.current("norm")
    op = cfg.rms_norm
    tiling = op.tiling(block)
    assert tiling == dict(op.bwd_tilings)[block]
    assert op.tiling(512) == op.tiling(16384) == op.bwd_tiling  # widths not measured
    rows, cols = many_rows() * 2 + 1, 37
    launch = _rows.row_launch(cols, 2, op.bwd_elements_per_thread, cfg.rows)
    plan = _rows.row_schedule(rows, torch.device(DEV), launch, tiling, cfg.rows)
    assert -(-rows // plan.tile) > plan.programs  # programs walk more than one tile each
    x = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    w = randn(cols, dtype=torch.bfloat16, device=DEV, offset=1.0)
    dy = randn(rows, cols, dtype=torch.bfloat16, device=DEV)
    _, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0)
    with tuning.changed("norm", rms_norm=replace(op, bwd_tilings=((launch.block, tiling),))), Poisoned():
        dx, dw = rms_norm_bwd(dy, x, w, rstd, 0.0)
    _assert_backward(dx, dw, dy, x, w, rstd)


def test_empty_rows() -> None:
    x = randn(0, 16, device=DEV)
    w = randn(16, device=DEV)
    y, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0)
    dx, dw = rms_norm_bwd(x, x, w, rstd, 0.0)
    assert y.shape == (0, 16) and dx.shape == (0, 16) and torch.equal(dw, torch.zeros_like(w))


@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 80),
    pad=st.integers(0, 7),
    dtype=st.sampled_from(DTYPES),
    transpose=st.booleans(),
)
@settings(max_examples=25, deadline=None)
def test_fuzz_shapes_and_strides(rows: int, cols: int, pad: int, dtype: torch.dtype, transpose: bool) -> None:
    base = randn(rows, cols + pad, dtype=dtype, device=DEV)
    x = base[:, :cols]
    if transpose:  # column stride != 1: the launcher must make rows contiguous itself
        x = randn(cols, rows, dtype=dtype, device=DEV).t()
    w = randn(cols, dtype=dtype, device=DEV, offset=1.0)
    dy = randn(rows, cols, dtype=dtype, device=DEV)
    y, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0)
    dx, _ = rms_norm_bwd(dy, x, w, rstd, 0.0)
    assert_close(y, R.rms_norm(x, w, EPS), "y")
    assert_close(dx, R.rms_norm_backward(dy, x, w, rms_norm_rstd(x, EPS))[0], "dx")


# --- the registered op (CPU: its reference kernel; CUDA: Triton) ---------------------------------


def _op(x: torch.Tensor, w: torch.Tensor, casting: str = "llama") -> torch.Tensor:
    return torch.ops.kernel_pytorch.rms_norm_fwd(x, w, EPS, 0.0, casting)[0]


@pytest.mark.parametrize("dtype,casting", [*((d, None) for d in DTYPES), (torch.bfloat16, "torch")], ids=str)
def test_opcheck(dtype: torch.dtype, casting: str | None) -> None:
    """casting=None: the call without it (the schema default)."""
    tail = () if casting is None else (casting,)
    x = randn(3, 5, 32, dtype=dtype, device=DEV).requires_grad_()
    w = randn(32, dtype=dtype, device=DEV, offset=1.0).requires_grad_()
    torch.library.opcheck(torch.ops.kernel_pytorch.rms_norm_fwd.default, (x, w, EPS, 0.0, *tail))
    # the backward op is not itself differentiable (no double backward): check it on plain tensors
    x, w = x.detach(), w.detach()
    _, rstd = torch.ops.kernel_pytorch.rms_norm_fwd(x, w, EPS, 0.0, *tail)
    dy = randn(3, 5, 32, dtype=dtype, device=DEV)
    torch.library.opcheck(torch.ops.kernel_pytorch.rms_norm_bwd.default, (dy, x, w, rstd, 0.0, *tail))


def test_compile_fullgraph_no_breaks_same_grads() -> None:
    """With a casting other than the default: it reaches the compiled graph's op."""
    casting = "torch"
    x = randn(4, 24, dtype=torch.bfloat16, device=DEV).requires_grad_()
    w = randn(24, dtype=torch.bfloat16, device=DEV, offset=1.0).requires_grad_()
    dy = randn(4, 24, dtype=torch.bfloat16, device=DEV)

    def f(x, w):
        return _op(x, w, casting) * 2.0

    eager_grads = torch.autograd.grad(f(x, w), (x, w), dy)
    out, breaks = compile_and_count_breaks(f, x, w)
    assert breaks == 0
    compiled_grads = torch.autograd.grad(out, (x, w), dy)
    for a, b in zip(compiled_grads, eager_grads):
        assert_close(a, b, "compiled grad")


def test_export() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(randn(16, offset=1.0))

        def forward(self, x):
            return _op(x, self.w)

    x = randn(2, 16)
    ep = torch.export.export(M(), (x,))
    assert "kernel_pytorch.rms_norm_fwd" in str(ep.graph)
    assert_close(ep.module()(x), R.rms_norm(x, ep.module().w), "exported")


def test_export_keeps_the_casting() -> None:
    class M(torch.nn.Module):
        def forward(self, x, w):
            return _op(x, w, "torch")

    x, w = randn(8, 64, dtype=torch.bfloat16, scale=3.0), randn(64, dtype=torch.bfloat16, offset=1.0)
    ep = torch.export.export(M(), (x, w))
    assert "'torch'" in str(ep.graph_module.code)
    assert torch.equal(ep.module()(x, w), R.rms_norm(x, w, EPS, casting="torch"))


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [4096, 14336, 16385, 262144])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_wide_rows(cols: int, dtype: torch.dtype) -> None:
    rows = 4 if cols > 16384 else 64
    x = strided_rows((rows,), cols, dtype, "cuda")
    w = randn(cols, dtype=dtype, device="cuda", offset=1.0)
    dy = randn(rows, cols, dtype=dtype, device="cuda")
    with Poisoned():
        y, rstd, _ = rms_norm_fwd(x, w, EPS, 0.0)
        dx, dw = rms_norm_bwd(dy, x, w, rstd, 0.0)
    assert_close(y, R.rms_norm(x, w, EPS), "y")
    _assert_backward(dx, dw, dy, x, w, rms_norm_rstd(x, EPS))
    again = rms_norm_bwd(dy, x, w, rstd, 0.0)
    assert torch.equal(again[0], dx) and torch.equal(again[1], dw)


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [100, 4096, 16385])
@pytest.mark.parametrize("casting", CASTINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_forward_bitwise_given_rstd(dtype: torch.dtype, casting: str, cols: int) -> None:
    """On the GPU bf16 too: fp32 -> bf16 rounds to nearest even, as torch's .to() does; 16385 columns
    take the two-pass path."""
    _assert_forward_bitwise(dtype, cols, casting, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_torch_casting_against_torch_rms_norm(dtype: torch.dtype) -> None:
    """Against F.rms_norm on the GPU: not bitwise (torch's CUDA kernel sums the rstd in another order,
    with another rsqrt), but within the table and within 2x torch's own error vs fp64."""
    x = randn(64, 4096, dtype=dtype, device="cuda", scale=3.0)
    w = randn(4096, dtype=dtype, device="cuda", scale=0.5, offset=1.0)
    y, _, _ = rms_norm_fwd(x, w, EPS, 0.0, "torch")
    ye = torch.nn.functional.rms_norm(x, (4096,), w, EPS)
    assert_close(y, ye, "y")
    assert_budget(y, ye, R.rms_norm(x.double(), w.double(), EPS), "y")


@pytest.mark.cuda
def test_cuda_compile_inductor_calls_our_kernel() -> None:
    x = randn(64, 4096, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w = randn(4096, dtype=torch.bfloat16, device="cuda", offset=1.0).requires_grad_()
    out, breaks = compile_and_count_breaks(lambda x, w: _op(x, w) + 1.0, x, w)
    assert breaks == 0
    assert_close(out, R.rms_norm(x, w, EPS) + 1.0, "compiled")
