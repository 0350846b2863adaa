"""kernel_pytorch.functional.attention: every backend computes the reference (reference/attention.py)
for each mask and score option, GQA ratios 1/4/8, fp32 and bf16, forward and gradients; HF masks;
"auto" says why it leaves SDPA; the errors name the argument; compiled with zero graph breaks."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.tolerances import tolerance_for
from tests.grid import randn


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = tolerance_for(expected.dtype)
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol)


def _qkv(b=2, hq=4, hk=2, q_len=24, kv_len=24, d=16, dtype=torch.float32, grad=False):
    q = randn(b, hq, q_len, d, dtype=dtype).requires_grad_(grad)
    k = randn(b, hk, kv_len, d, dtype=dtype).requires_grad_(grad)
    v = randn(b, hk, kv_len, d, dtype=dtype).requires_grad_(grad)
    return q, k, v


def _options(b: int, hq: int, q_len: int, kv_len: int) -> dict[str, dict]:
    pad = torch.ones(b, kv_len)
    pad[-1, :3] = 0  # left padding in the last row
    docs = torch.tensor([0] * (kv_len // 3) + [1] * (kv_len - 2 * (kv_len // 3)) + [2] * (kv_len // 3))
    return {
        "none": {},
        "causal": {"is_causal": True},
        "window": {"window": 5},
        "documents": {"seq_ids": docs[None].expand(b, -1), "is_causal": True},
        "alibi": {"alibi_slopes": R.alibi_slopes(hq), "is_causal": True},
        "padding": {"mask": F.prepare_mask(pad, q_len, kv_len), "is_causal": True},
        "additive": {"mask": randn(b, 1, q_len, kv_len)},
        "scale": {"scale": 0.3, "is_causal": True},
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("groups", [1, 4, 8])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "auto"])
def test_backends_match_the_reference(backend: str, groups: int, dtype: torch.dtype) -> None:
    hk = 1 if groups == 8 else 2
    hq = hk * groups
    for opts in _options(2, hq, 24, 24).values():
        q, k, v = _qkv(hq=hq, hk=hk, dtype=dtype, grad=True)
        out = F.attention(q, k, v, backend=backend, **opts)
        want = R.attention(q, k, v, **opts)
        _assert_close(out, want)
        if dtype == torch.float32:  # gradients through torch's autograd on both sides
            dy = randn(*out.shape)
            got = torch.autograd.grad(out, (q, k, v), dy)
            exp = torch.autograd.grad(want, (q, k, v), dy)
            for g, e in zip(got, exp):
                _assert_close(g, e)


@pytest.mark.parametrize("backend", ["sdpa", "flex", "eager"])
def test_decoding_queries_are_end_aligned(backend: str) -> None:
    q, k, v = _qkv(q_len=3, kv_len=20)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's unfused-eager warning
        _assert_close(F.attention(q, k, v, window=4, backend=backend), R.attention(q, k, v, window=4))
        if backend != "flex":  # one flex call is enough (each costs ~1 s on CPU)
            one = q[:, :, -1:]  # a single decoding step sees every cached key
            _assert_close(F.attention(one, k, v, is_causal=True, backend=backend), R.attention(one, k, v))


def test_flex_on_cpu_forward() -> None:
    """torch 2.13 runs FlexAttention on CPU forward-only (unfused in eager; compiled it takes ~1 min)."""
    b, hq, hk, t = 2, 8, 2, 40
    q, k, v = _qkv(b, hq, hk, t, t)
    opts = _options(b, hq, t, t)
    cu = torch.tensor([0, 10, 25, 40])
    cases = [
        opts["padding"], {"cu_seqlens": cu, "is_causal": True},
        {"softcap": 4.0, "alibi_slopes": R.alibi_slopes(hq), "is_causal": True},
    ]
    with warnings.catch_warnings():  # the unfused-eager warning
        warnings.simplefilter("ignore")
        for opts_ in cases:
            want_opts = dict(opts_)
            if "cu_seqlens" in want_opts:
                want_opts["seq_ids"] = F.seq_ids_from_cu_seqlens(want_opts.pop("cu_seqlens"), t).expand(b, -1)
            _assert_close(F.attention(q, k, v, backend="flex", **opts_), R.attention(q, k, v, **want_opts))


def test_cu_seqlens_are_document_ids() -> None:
    ids = F.seq_ids_from_cu_seqlens(torch.tensor([0, 2, 5, 6]), 8)
    assert ids.tolist() == [[0, 0, 1, 1, 1, 2, 3, 3]]


def test_prepare_mask_converts_hf_masks() -> None:
    pad = torch.tensor([[0, 1, 1], [1, 1, 1]])
    m = F.prepare_mask(pad, 2, 3)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 3) and m[0, 0, 0].tolist() == [False, True, True]
    additive = torch.zeros(2, 1, 2, 3)
    assert F.prepare_mask(additive, 2, 3) is additive
    assert F.prepare_mask(None, 2, 3) is None
    with pytest.raises(ValueError, match="attention_mask must be"):
        F.prepare_mask(torch.zeros(2, 1, 3), 2, 3)
    with pytest.raises(ValueError, match="must cover the 4 keys"):
        F.prepare_mask(pad, 2, 4)


def test_auto_says_once_why_it_leaves_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    from kernel_pytorch._env import log_once

    log_once.cache_clear()
    q, k, v = _qkv(grad=True)
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        for _ in range(2):
            out = F.attention(q, k, v, softcap=3.0, is_causal=True)
    _assert_close(out, R.attention(q, k, v, softcap=3.0, is_causal=True))
    lines = [r.getMessage() for r in caplog.records if "kernel_pytorch.attention" in r.getMessage()]
    assert lines == [
        "kernel_pytorch.attention: soft-capping is a score mod SDPA cannot express, and FlexAttention has no "
        "backward on CPU; using the eager reference"
    ]


def test_errors_name_the_argument() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="backend must be one of"):
        F.attention(q, k, v, backend="flash")
    with pytest.raises(ValueError, match="backend='sdpa' cannot apply softcap"):
        F.attention(q, k, v, softcap=2.0, backend="sdpa")
    with pytest.raises(ValueError, match="multiple of k's 3 heads"):
        F.attention(q, randn(2, 3, 24, 16), randn(2, 3, 24, 16))
    with pytest.raises(ValueError, match=r"q must be \(B, H, T, D\)"):
        F.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"alibi_slopes must be \(4,\)"):
        F.attention(q, k, v, alibi_slopes=torch.ones(3))
    with pytest.raises(TypeError, match="k must be a floating-point"):
        F.attention(q, k.long(), v)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no backward on CPU"):
            F.attention(q.requires_grad_(), k, v, backend="flex")


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
def test_compiles_with_zero_graph_breaks(backend: str) -> None:
    """fullgraph=True raises at the first graph break. Flex is traced by Dynamo only here: Inductor's CPU
    code for it takes about a minute (the CUDA test compiles it for real)."""
    import torch._dynamo

    q, k, v = _qkv(hq=4, hk=1)
    docs = torch.tensor([[0] * 10 + [1] * 14])
    opts = {"is_causal": True, "alibi_slopes": R.alibi_slopes(4), "seq_ids": docs}
    if backend == "flex":
        opts["softcap"] = 5.0

    def fn(q, k, v):
        return F.attention(q, k, v, backend=backend, **opts)

    torch._dynamo.reset()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, fullgraph=True, backend="eager" if backend == "flex" else "aot_eager")(q, k, v)
    _assert_close(out, R.attention(q, k, v, **opts))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_backends_and_pinned_kernels(dtype: torch.dtype) -> None:
    from torch.nn.attention import SDPBackend

    q, k, v = (t.cuda() for t in _qkv(hq=8, hk=2, q_len=256, kv_len=256, d=64, dtype=dtype))
    want = R.attention(q, k, v, is_causal=True)
    _assert_close(F.attention(q, k, v, is_causal=True, sdpa_kernel=SDPBackend.FLASH_ATTENTION, backend="sdpa"), want)
    # the other kernels without GQA (which of them take enable_gqa differs between torch versions)
    kf, vf = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    for kernel in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            out = F.attention(q, kf, vf, is_causal=True, sdpa_kernel=kernel, backend="sdpa")
        except RuntimeError as err:  # cuDNN attention is not in every build / on every GPU
            assert kernel == SDPBackend.CUDNN_ATTENTION, err
            continue
        _assert_close(out, want)
    for name, opts in _options(2, 8, 256, 256).items():
        opts = {key: val.cuda() if isinstance(val, torch.Tensor) else val for key, val in opts.items()}
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.attention(qg, kg, vg, backend="flex", **opts)
        _assert_close(out, R.attention(q, k, v, **opts))
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (qg, kg, vg)), name


def test_compiles_in_one_graph_with_dynamic_lengths() -> None:
    """With symbolic lengths `q_len == kv_len` is a SymBool, which SDPA's is_causal refuses: the causal
    flag is decided by a branch, so fullgraph compilation with dynamic shapes holds, at two lengths."""
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: F.attention(q, k, v, is_causal=True, backend="sdpa"), fullgraph=True,
                       dynamic=True, backend="eager")
    for t in (8, 12):
        q, k, v = randn(1, 4, t, 16), randn(1, 2, t, 16), randn(1, 2, t, 16)
        torch.testing.assert_close(fn(q, k, v), F.attention(q, k, v, is_causal=True, backend="sdpa"))
