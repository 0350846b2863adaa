"""The embedding reference against torch: forward, and the backward against autograd (padding_idx,
scale_grad_by_freq) and torch's own backward op; the sorted segments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_pytorch.reference.embedding import embedding, embedding_backward, segments
from tests.grid import randn


@pytest.mark.parametrize("padding_idx", [None, 2, -1])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_backward_is_the_autograd_gradient(padding_idx, scale_grad_by_freq: bool) -> None:
    weight = randn(7, 5, dtype=torch.float64).requires_grad_()
    idx = torch.tensor([[2, 6, 2, 0], [6, 6, 1, 2]])
    dy = randn(2, 4, 5, dtype=torch.float64)
    y = F.embedding(idx, weight, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq)
    (expected,) = torch.autograd.grad(y, weight, dy)
    ours = embedding_backward(dy, idx, 7, padding_idx, scale_grad_by_freq)
    torch.testing.assert_close(ours, expected)
    assert torch.equal(embedding(idx, weight), y)


def test_low_precision_rounds_once_like_torch() -> None:
    """bf16: summed in fp32, rounded once; torch's backward op in fp32 then rounded gives the same."""
    idx = torch.randint(0, 9, (300,))
    dy = randn(300, 16, dtype=torch.bfloat16)
    ours = embedding_backward(dy, idx, 9)
    torch_fp32 = torch.ops.aten.embedding_dense_backward(dy.float(), idx, 9, -1, False)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, torch_fp32.bfloat16())
    assert embedding_backward(dy, idx, 9, out_dtype=torch.float32).dtype == torch.float32


def test_segments_cover_each_row_in_token_order() -> None:
    idx = torch.tensor([3, 1, 3, 0, 3, 1])
    order, bounds = segments(idx, 5)
    assert bounds.tolist() == [0, 1, 3, 3, 6, 6]
    assert order.tolist() == [3, 1, 5, 0, 2, 4]  # stable: equal ids keep their token order
