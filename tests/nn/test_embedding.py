"""Embedding drop-in (torch's constructor, state dict, repr; same output and gradient) and the position
modules (sinusoidal, learned with an offset, ALiBi's bias and score_mod)."""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch import reference as R
from tests.ops.norm_helpers import assert_close


@pytest.mark.parametrize("kwargs", [{}, {"padding_idx": 1}, {"scale_grad_by_freq": True}, {"max_norm": 1.0}])
def test_embedding_drop_in_matches_torch(kwargs: dict) -> None:
    a, b = kp.nn.Embedding(11, 8, **kwargs), torch.nn.Embedding(11, 8, **kwargs)
    assert isinstance(a, torch.nn.Embedding) and repr(a) == repr(b)
    assert list(a.state_dict()) == list(b.state_dict())
    b.load_state_dict(a.state_dict())
    idx = torch.tensor([[1, 4, 4, 10], [0, 1, 3, 4]])
    dy = torch.randn(2, 4, 8)
    ya, yb = a(idx), b(idx)
    assert torch.equal(ya, yb)
    ya.backward(dy), yb.backward(dy)
    assert_close(a.weight.grad, b.weight.grad, "dweight")


def test_position_modules() -> None:
    sin = kp.nn.SinusoidalPositionalEmbedding(16, 6)
    pos = torch.tensor([[0, 3, 15]])
    assert torch.equal(sin(pos), R.sinusoidal_positions(16, 6)[pos])
    assert list(sin.state_dict()) == []
    learned = kp.nn.LearnedPositionalEmbedding(16, 6, offset=2)
    assert learned.weight.shape == (18, 6)
    assert torch.equal(learned(pos), learned.weight.detach()[pos + 2])
    alibi = kp.nn.ALiBi(6)
    bias = alibi(3, 5)
    assert torch.equal(bias, R.alibi_bias(R.alibi_slopes(6), 3, 5))
    mod = alibi.score_mod(offset=2)
    h, q_idx, kv_idx = torch.tensor(4), torch.tensor(1), torch.tensor(0)
    assert torch.equal(mod(torch.tensor(0.0), torch.tensor(0), h, q_idx, kv_idx), bias[4, 1, 0])
