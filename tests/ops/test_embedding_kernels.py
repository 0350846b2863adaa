"""Deterministic embedding backward against the reference: both modes, padding and frequency scaling,
column blocks and row groups cut short, a hot row summed over many steps, fp64-derived budget on long
runs; on the GPU the benchmark shape and run-to-run bitwise equality (torch's, for comparison)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.embedding import embedding_grad
from kernel_pytorch.reference.embedding import embedding_backward
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
MODES = ["rows", "segments"]


@pytest.fixture
def small_blocks() -> Iterator[None]:
    """Several column blocks (the last one short) and row groups on small shapes."""
    with tuning.changed("embedding", block_cols=16, tokens_per_step=4, vocab_rows_per_program=3):
        yield


def _indices(n: int, vocab: int, hot: int = 3, hot_count: int = 9) -> torch.Tensor:
    """Random ids with one hot row (a run over several steps) and some rows never hit."""
    idx = torch.randint(0, vocab, (n,), device=DEV)
    idx[torch.randperm(n, device=DEV)[:hot_count]] = hot
    return idx


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_match_reference(mode: str, dtype: torch.dtype, small_blocks) -> None:
    vocab, h = 11, 40
    idx = _indices(23, vocab).reshape(1, 23)
    dy = randn(1, 23, h, dtype=dtype, device=DEV)
    with Poisoned():
        dw = embedding_grad(dy, idx, vocab, mode=mode)
    assert dw.shape == (vocab, h) and dw.dtype == dtype
    assert_close(dw, embedding_backward(dy, idx, vocab), "dweight")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding_idx", [3, -2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_padding_and_frequency_scaling(mode: str, padding_idx: int, scale_grad_by_freq: bool) -> None:
    vocab, h = 9, 24
    idx = _indices(17, vocab, hot=3)
    dy = randn(17, h, dtype=torch.bfloat16, device=DEV)
    with Poisoned():
        dw = embedding_grad(dy, idx, vocab, padding_idx, scale_grad_by_freq, mode=mode)
    expected = embedding_backward(dy, idx, vocab, padding_idx, scale_grad_by_freq)
    assert torch.equal(dw[padding_idx], torch.zeros_like(dw[padding_idx]))
    assert_close(dw, expected, "dweight")


@pytest.mark.parametrize("mode", MODES)
def test_fp32_gradient_from_bf16_and_strided_rows(mode: str) -> None:
    """An fp32 master gradient from bf16 upstream rows that are a strided view."""
    vocab, h = 6, 16
    idx = _indices(10, vocab)
    dy = randn(10, h + 3, dtype=torch.bfloat16, device=DEV)[:, :h]
    dw = embedding_grad(dy, idx, vocab, out_dtype=torch.float32, mode=mode)
    assert dw.dtype == torch.float32
    assert_close(dw, embedding_backward(dy, idx, vocab, out_dtype=torch.float32), "dweight")


def test_long_run_within_fp64_budget_of_torch() -> None:
    """One row hit by every token: our fp32 sum vs fp64, at most 2x the error of torch's own bf16
    embedding backward."""
    idx = torch.full((64,), 2, device=DEV)
    dy = randn(64, 8, dtype=torch.bfloat16, device=DEV, scale=2.0)
    dw = embedding_grad(dy, idx, 4)
    torch_bf16 = torch.ops.aten.embedding_dense_backward(dy, idx, 4, -1, False)
    assert_budget(dw, torch_bf16, embedding_backward(dy.double(), idx, 4), "dweight")


def test_no_tokens() -> None:
    dy, idx = randn(0, 8, device=DEV), torch.zeros(0, dtype=torch.long, device=DEV)
    for mode in MODES:
        assert torch.equal(embedding_grad(dy, idx, 5, mode=mode), torch.zeros(5, 8, device=DEV))


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode must be"):
        embedding_grad(randn(2, 4, device=DEV), torch.zeros(2, dtype=torch.long, device=DEV), 3, mode="atomic")


@pytest.mark.cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "zipf"])
def test_cuda_benchmark_shape_and_bitwise_reruns(mode: str, skewed: bool) -> None:
    """Vocab 128256 x hidden 4096, 16384 tokens, bf16: matches the reference within the table and two
    runs are bitwise equal."""
    vocab, h, n = 128256, 4096, 16384
    if skewed:  # a Zipf-like stream: a few ids take most tokens (long runs)
        ranks = torch.arange(1, vocab + 1, device="cuda", dtype=torch.float64)
        idx = torch.multinomial((1.0 / ranks).float(), n, replacement=True)
    else:
        idx = torch.randint(0, vocab, (n,), device="cuda")
    dy = randn(n, h, dtype=torch.bfloat16, device="cuda")
    a = embedding_grad(dy, idx, vocab, mode=mode)
    b = embedding_grad(dy, idx, vocab, mode=mode)
    assert torch.equal(a, b)
    expected = torch.ops.aten.embedding_dense_backward(dy.float(), idx, vocab, -1, False).bfloat16()
    assert_close(a, expected, "dweight")
