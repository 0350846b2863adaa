"""Fused linear + cross-entropy, the chunked algorithm, against the reference: every reduction (the
"none" backward recomputing the chunks), bias, class weights and the other options, a partial last
chunk, fp32 grad_W accumulation, the chunk-size rule; the one-read forward kernel (its cases, its
moving reference, -inf and out-of-range logits); on the GPU, a real head shape and its memory."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.gemm_into import fp32_accumulate_in_place
from kernel_pytorch.ops._common.row_view import contiguous_rows
from kernel_pytorch.ops._common.scale import scale_grad_
from kernel_pytorch.ops.cross_entropy import (
    FusedLinearArgs,
    OnePassLaunch,
    chunk_rows,
    fused_linear_cross_entropy_bwd,
    fused_linear_cross_entropy_fwd,
    one_read,
)
from kernel_pytorch.ops.cross_entropy.launch import RowInputs, RowOutputs
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions as O
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.cross_entropy_helpers import IGNORE, eager_loss, upstream
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
N, H, V, CHUNK = 9, 8, 24, 4  # three chunks, the last of one row

OPTIONS = {
    "mean": {"bias": True, "weighted": True, "label_smoothing": 0.1},
    "sum": {"bias": False, "lse_square_scale": 1e-2, "softcap": 4.0},
    "none": {"bias": True, "weighted": True, "label_smoothing": 0.05, "lse_square_scale": 1e-3, "softcap": 6.0},
}


def _inputs(dtype: torch.dtype, options: dict, device: str = DEV, n: int = N, h: int = H, v: int = V,
            lead: tuple[int, ...] | None = None):
    opts = dict(options)
    x = randn(*(lead or (n,)), h, dtype=dtype, device=device)
    w = randn(v, h, dtype=dtype, device=device, scale=h ** -0.5)
    b = randn(v, dtype=dtype, device=device, scale=0.1) if opts.pop("bias", False) else None
    ce_w = (torch.rand(v, device=device) + 0.5) if opts.pop("weighted", False) else None
    t = torch.randint(0, v, x.shape[:-1], device=device)
    if t.numel():
        t.view(-1)[[1, -1]] = IGNORE
    return x, w, b, t, ce_w, opts


def _grads(x, w, b, t, ce_w, reduction, opts, dloss, **kw):
    """Our (loss, grads) for upstream gradient dloss, the way phase 2's autograd function calls us."""
    o = O(ignore_index=IGNORE, reduction=reduction, **opts)
    args = FusedLinearArgs(w, t, b, ce_w)
    with Poisoned():
        out = fused_linear_cross_entropy_fwd(x, args, o, **kw)
        if reduction == "none":
            assert out.grad_x is None and out.grad_w is None
            grads = fused_linear_cross_entropy_bwd(dloss, x, args, out.lse, o, **kw)
        else:
            grads = tuple(scale_grad_(g, dloss) if g is not None else None for g in out[2:5])
    return out.loss, grads


def _check(x, w, b, t, ce_w, reduction, opts, **kw) -> None:
    dloss = upstream(reduction, t)
    loss, grads = _grads(x, w, b, t, ce_w, reduction, opts, dloss, **kw)
    ref_kw = dict(ce_weight=ce_w, options=O(ignore_index=IGNORE, reduction=reduction, **opts))
    assert_close(loss, R.fused_linear_cross_entropy(x, w, t, b, **ref_kw), "loss")
    ref = R.fused_linear_cross_entropy_backward(dloss, x, w, t, b, **ref_kw)
    names = ("grad_x", "grad_w", "grad_b")
    for name, got, expected in zip(names, grads, ref):
        assert (got is None) == (expected is None), name
        if got is not None:
            assert_close(got, expected, name)
    # fp64-derived budget: PyTorch eager (linear + loss in the inputs' dtype) is the yardstick
    params64 = [p.double().requires_grad_() if p is not None else None for p in (x, w, b)]
    cw64 = ce_w.double() if ce_w is not None else None
    loss64 = R.fused_linear_cross_entropy(*params64[:2], t, params64[2], **{**ref_kw, "ce_weight": cw64})
    params_e = [p.detach().clone().requires_grad_() if p is not None else None for p in (x, w, b)]
    logits_e = torch.nn.functional.linear(*params_e)
    loss_e = eager_loss(logits_e, t, ce_w, reduction, **opts)
    live = [i for i, p in enumerate(params64) if p is not None]
    g64 = torch.autograd.grad(loss64, [params64[i] for i in live], dloss.double())
    ge = torch.autograd.grad(loss_e, [params_e[i] for i in live], dloss.to(loss_e.dtype))
    assert_budget(loss, loss_e, loss64, "loss vs fp64")
    for i, a, e in zip(live, g64, ge):
        assert_budget(grads[i], e, a, f"{names[i]} vs fp64")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", list(OPTIONS))
def test_chunks_match_reference(reduction: str, dtype: torch.dtype) -> None:
    x, w, b, t, ce_w, opts = _inputs(dtype, OPTIONS[reduction])
    _check(x, w, b, t, ce_w, reduction, opts, chunk=CHUNK)


def test_fp32_grad_weight_accumulation_and_leading_dims() -> None:
    x, w, b, t, ce_w, opts = _inputs(torch.bfloat16, OPTIONS["mean"], lead=(3, 3))
    _check(x, w, b, t, ce_w, "mean", opts, chunk=CHUNK, grad_w_fp32=True)


def test_strided_input_and_weight() -> None:
    """x with padded rows, a weight stored transposed (as a tied embedding's view may be)."""
    x = randn(N, H + 3, device=DEV)[:, :H]
    w = randn(H, V, device=DEV, scale=H ** -0.5).t()
    t = torch.randint(0, V, (N,), device=DEV)
    _check(x, w, None, t, None, "sum", {}, chunk=CHUNK)


def test_needs_select_the_gradients() -> None:
    x, w, b, t, ce_w, opts = _inputs(torch.float32, OPTIONS["mean"])
    out = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b), needs=(False, True, False), chunk=CHUNK)
    assert out.grad_x is None and out.grad_b is None and out.grad_w.shape == w.shape
    none = fused_linear_cross_entropy_bwd(torch.ones(N, device=DEV), x, FusedLinearArgs(w, t), out.lse,
                                          O(reduction="none"), needs=(True, False, True), chunk=CHUNK)
    assert none[0].shape == x.shape and none[1] is None and none[2] is None


def test_all_ignored_mean_is_nan_and_gradients_zero() -> None:
    x, w, b, _, _, _ = _inputs(torch.float32, {"bias": True})
    t = torch.full((N,), IGNORE, device=DEV)
    out = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b), chunk=CHUNK)
    assert torch.isnan(out.loss)
    for g in out[2:5]:
        assert torch.equal(g, torch.zeros_like(g))


def test_empty_input() -> None:
    x, w, b, _, _, _ = _inputs(torch.float32, {"bias": True}, n=0)
    t = torch.zeros(0, dtype=torch.long, device=DEV)
    out = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b), O(reduction="sum"))
    assert out.loss == 0 and out.grad_x.shape == (0, H)
    assert torch.equal(out.grad_w, torch.zeros_like(w)) and torch.equal(out.grad_b, torch.zeros_like(b))


# the losses whose gradient the one-read kernel computes (ops/cross_entropy/one_read.py)
ONE_READ = {
    "mean": ("mean", {}),
    "weighted-mean": ("mean", {"weighted": True}),
    "softcap-sum": ("sum", {"softcap": 4.0}),
    "weighted-softcap-sum": ("sum", {"weighted": True, "softcap": 3.0}),
}


@pytest.fixture
def one_read_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the one-read kernel's launches (one per chunk where it applies)."""
    calls: list[int] = []
    launch = one_read.launch_one_read

    def spy(*args, **kwargs):
        calls.append(1)
        return launch(*args, **kwargs)

    monkeypatch.setattr(one_read, "launch_one_read", spy)
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(ONE_READ))
def test_one_read_forward_matches_reference(case: str, dtype: torch.dtype, one_read_calls: list[int]) -> None:
    reduction, options = ONE_READ[case]
    x, w, b, t, ce_w, opts = _inputs(dtype, options)
    _check(x, w, b, t, ce_w, reduction, opts, chunk=CHUNK)
    assert len(one_read_calls) == 3  # every chunk; the two-pass kernel ran nowhere


def test_one_read_only_where_its_algebra_holds(one_read_calls: list[int]) -> None:
    """Smoothing, z-loss and a bias gradient keep the two-pass kernel; a frozen bias does not."""
    x, w, b, t, _, _ = _inputs(torch.float32, {"bias": True})
    for kw in ({"label_smoothing": 0.1}, {"lse_square_scale": 1e-3}, {}):
        fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b), O(**kw), chunk=CHUNK)
    assert not one_read_calls
    fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b), chunk=CHUNK, needs=(True, True, False))
    assert len(one_read_calls) == 3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_read_moves_its_reference(dtype: torch.dtype) -> None:
    """8-column blocks over rows whose later blocks exceed the first block's maximum by far more than
    the config's switch (the written blocks are rescaled), a first block of -inf, a row of -inf, an
    ignored row and an out-of-range target: q s against the reference gradient, loss and lse against
    it too."""
    n, v, h = 6, 29, 5
    logits = randn(n, v, dtype=torch.float32, device=DEV, scale=2.0)
    logits[0, 8:16] += 45.0  # a second block 45 above the first
    logits[0, 24:] += 90.0  # and a partial last block above that
    logits[1, :8] = float("-inf")  # a masked first block
    logits[1, 16:24] += 30.0
    logits[2] = float("-inf")
    logits = logits.to(dtype)
    t = torch.tensor([26, 3, 4, IGNORE, 11, v + 2], device=DEV)
    x = randn(n, h, dtype=dtype, device=DEV)
    q = logits.clone()
    loss_rows, lse, s = (torch.empty(n, device=DEV) for _ in range(3))
    xs = torch.empty(n, h, dtype=dtype, device=DEV)
    launch = OnePassLaunch(block=8, num_warps=1, prefetch=True)
    with tuning.changed("fused_linear_cross_entropy", one_read_launch=launch):
        one_read.launch_one_read(contiguous_rows(q), RowInputs(t, None, None, None), RowOutputs(loss_rows, lse), s, x,
                                 xs, O(IGNORE, "sum"))
    ok = [0, 1, 4]  # valid rows; row 2 (all -inf): lse -inf, loss NaN, as the two-pass kernel; 5: out of range
    ref_lse = torch.logsumexp(logits.double()[ok], -1)
    assert_close(lse[ok], ref_lse.float(), "lse")
    assert_close(loss_rows[ok], (ref_lse - logits.double()[ok, t[ok]]).float(), "loss")
    grad = torch.softmax(logits.double()[ok], -1)
    grad[range(len(ok)), t[ok]] -= 1
    assert_close((q[ok].double() * s[ok, None].double()).to(dtype), grad.to(dtype), "dx = s q")
    assert_close(xs[ok], (x[ok].float() * s[ok, None]).to(dtype), "xs")
    assert lse[2] == float("-inf") and torch.isnan(loss_rows[2])
    assert loss_rows[3] == 0 and lse[3] == 0 and s[3] == 0 and not q[3].any() and not xs[3].any()
    assert torch.isnan(lse[5]) and torch.isnan(loss_rows[5]) and torch.isnan(s[5])


def test_chunk_rows_rule() -> None:
    assert tuning.default("fused_linear_cross_entropy").chunk_bytes == 256 * 2**20
    assert chunk_rows(8192, 128256, 2) == 1024  # 256 MiB of bf16 logits
    assert chunk_rows(8192, 262144, 2) == 1024  # the min_rows floor over the 256 MiB cap's 512
    assert chunk_rows(8192, 128256, 2, max_bytes=64 * 2**20) == 256  # Liger-Kernel's chunk there
    assert chunk_rows(8192, 128256, 2, free_bytes=2**28) == 512  # half the free memory
    assert chunk_rows(8192, 2**20, 4) == 1024  # the floor
    assert chunk_rows(8192, 2**20, 4, free_bytes=2**20) == 128  # never less than one tile
    assert chunk_rows(100, 32000, 2) == 100  # never more than the rows
    assert chunk_rows(0, 32000, 2) == 1


# --- GPU only --------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("grad_w_fp32", [False, True])
@pytest.mark.parametrize("one_read", [False, True])
def test_cuda_real_head(grad_w_fp32: bool, one_read: bool) -> None:
    """A 2048-token Llama-style head (H 4096, V 32000, bf16) in 512-row chunks, within the fp64 budget,
    with label smoothing (the two-pass kernel) or without (the one-read kernel); peak memory above the
    inputs at most the outputs, the chunk buffer, the fp32 accumulator and the one-read kernel's s x."""
    x, w, _, t, _, _ = _inputs(torch.bfloat16, {}, device="cuda", n=2048, h=4096, v=32000)
    opts = {} if one_read else {"label_smoothing": 0.1}
    _check(x, w, None, t, None, "mean", opts, chunk=512, grad_w_fp32=grad_w_fp32)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t), O(**opts), chunk=512, grad_w_fp32=grad_w_fp32)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    outputs = sum(g.numel() * g.element_size() for g in out[2:4])
    fp32_temps = 1 if fp32_accumulate_in_place(x.device) else 2  # the accumulator (and a product)
    allowed = outputs + 512 * 32000 * 2 + (fp32_temps * w.numel() * 4 if grad_w_fp32 else 0) + 2**22 \
        + (512 * 4096 * 2 if one_read else 0)
    assert peak <= allowed, (peak, allowed)


@pytest.mark.cuda
def test_cuda_bitwise_deterministic() -> None:
    x, w, b, t, ce_w, opts = _inputs(torch.bfloat16, OPTIONS["mean"], device="cuda", n=1000, h=512, v=50257)
    a = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b, ce_w), O(**opts), chunk=256)
    c = fused_linear_cross_entropy_fwd(x, FusedLinearArgs(w, t, b, ce_w), O(**opts), chunk=256)
    for u, v in zip(a[:5], c[:5]):
        assert torch.equal(u, v)
