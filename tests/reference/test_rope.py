"""The rotary-embedding reference against transformers' own functions (Llama, GPT-NeoX partial rotary,
GPT-J and Cohere interleaved), its backward against autograd, and the argument checks."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.reference.rope import rope, rope_backward, rotate_half, rotate_pairs
from kernel_pytorch.reference.rope_checks import check_dtypes, check_position_range, check_rope_args
from kernel_pytorch.reference.rope_tables import cos_sin, default_inv_freq
from kernel_pytorch.tolerances import compare, fp64_budget
from tests.grid import DTYPES, randn

transformers = pytest.importorskip("transformers")
from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb as cohere_apply  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply  # noqa: E402
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply  # noqa: E402
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply  # noqa: E402
from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half  # noqa: E402

POS = torch.tensor([[0, 1, 2, 3, 4, 5], [3000, 3001, 3002, 3003, 3004, 3005]])  # a decoding offset


def _rows(r: int, dtype: torch.dtype, interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return cos_sin(default_inv_freq(10000.0, r), POS, 1.0, dtype, interleaved)


def _qk(dtype: torch.dtype, scale: float = 1.0, layout: str = "bhtd", d: int = 32):
    shape = (lambda h: (2, h, 6, d)) if layout == "bhtd" else (lambda h: (2, 6, h, d))
    return randn(*shape(4), dtype=dtype, scale=scale), randn(*shape(2), dtype=dtype, scale=scale)


def _autograd(fn, q, k, dq, dk):
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    outs = fn(q, k)
    return outs, torch.autograd.grad(outs, (q, k), (dq, dk))


def test_rotations_match_transformers() -> None:
    x = randn(3, 10)
    assert torch.equal(rotate_half(x), hf_rotate_half(x))
    gptj_rot = torch.stack((-x[:, 1::2], x[:, ::2]), dim=-1).flatten(-2)
    assert torch.equal(rotate_pairs(x), gptj_rot)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_hf_rounding_is_bitwise_llama(dtype: torch.dtype, layout: str) -> None:
    """hf_rounding=True: transformers' eager forward and autograd backward, bit for bit."""
    ud = 1 if layout == "bhtd" else 2
    q, k = _qk(dtype, 3.0, layout)
    cos, sin = _rows(32, dtype)
    dq, dk = randn(*q.shape, dtype=dtype), randn(*k.shape, dtype=dtype)
    (hq, hk), (gq, gk) = _autograd(lambda a, b: llama_apply(a, b, cos, sin, unsqueeze_dim=ud), q, k, dq, dk)
    oq, ok = rope(q, k, cos, sin, unsqueeze_dim=ud, hf_rounding=True)
    bq, bk = rope_backward(dq, dk, cos, sin, unsqueeze_dim=ud, hf_rounding=True)
    for a, b in ((oq, hq), (ok, hk), (bq, gq), (bk, gk)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hf_rounding_is_bitwise_partial_and_interleaved(dtype: torch.dtype) -> None:
    """GPT-NeoX (rotate-half on the first 16 of 32 features) and GPT-J (interleaved pairs, first 16,
    its half-width sin/cos repeated pairwise), forward and backward."""
    q, k = _qk(dtype, 2.0)
    dq, dk = randn(*q.shape, dtype=dtype), randn(*k.shape, dtype=dtype)
    cos, sin = _rows(16, dtype)
    (hq, hk), (gq, gk) = _autograd(lambda a, b: neox_apply(a, b, cos, sin), q, k, dq, dk)
    assert torch.equal(rope(q, k, cos, sin, hf_rounding=True)[0], hq)
    assert torch.equal(rope_backward(dq, dk, cos, sin, hf_rounding=True)[1], gk)

    qj, dqj = q.transpose(1, 2).contiguous(), dq.transpose(1, 2).contiguous()  # GPT-J: (B, T, H, D)
    sin_j, cos_j = torch.split(create_sinusoidal_positions(4096, 16)[POS].to(dtype), 8, dim=-1)

    def gptj(a, b):
        return torch.cat([gptj_apply(a[..., :16], sin_j, cos_j), a[..., 16:]], -1), b * 1

    (hj, _), (gj, _) = _autograd(gptj, qj, qj, dqj, dqj)
    ci, si = torch.repeat_interleave(cos_j, 2, -1), torch.repeat_interleave(sin_j, 2, -1)
    kw = dict(interleaved=True, unsqueeze_dim=2, hf_rounding=True)
    assert torch.equal(rope(qj, qj, ci, si, **kw)[0], hj)
    assert torch.equal(rope_backward(dqj, dqj, ci, si, **kw)[0], gj)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_default_rounding_is_cohere(dtype: torch.dtype) -> None:
    """Cohere (interleaved) computes in fp32 and rounds once, as our default does: bitwise equal."""
    q, k = _qk(dtype, 3.0)
    cos, sin = _rows(32, dtype, interleaved=True)
    hq, hk = cohere_apply(q, k, cos, sin)
    oq, ok = rope(q, k, cos, sin, interleaved=True)
    assert torch.equal(oq, hq) and torch.equal(ok, hk)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_rounding_against_transformers_eager(dtype: torch.dtype) -> None:
    """fp32 math rounded once vs transformers' bf16/fp16 eager: within the tolerance table at unit
    scale; at any scale never further from the fp64 result than transformers (budget factor 1)."""
    cos, sin = _rows(32, dtype)
    q, k = _qk(dtype, 1.0)
    hq, _ = llama_apply(q, k, cos, sin)
    oq, _ = rope(q, k, cos, sin)
    assert compare(oq, hq).passed, compare(oq, hq).message("q vs transformers, unit scale")
    q, k = _qk(dtype, 3.0)
    hq, hk = llama_apply(q, k, cos, sin)
    oq, ok = rope(q, k, cos, sin)
    eq, ek = rope(q.double(), k.double(), cos.double(), sin.double())
    for a, h, e, name in ((oq, hq, eq, "q"), (ok, hk, ek, "k")):
        result = fp64_budget(a, h, e, factor=1.0)
        assert result.passed, result.message(name)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("r", [32, 12])
def test_backward_is_the_gradient(interleaved: bool, r: int) -> None:
    """fp64: rope_backward equals autograd of rope, for random (not rotation) cos/sin too."""
    q, k = _qk(torch.float64)
    cos, sin = randn(2, 6, r, dtype=torch.float64), randn(2, 6, r, dtype=torch.float64)
    dq, dk = randn(*q.shape, dtype=torch.float64), randn(*k.shape, dtype=torch.float64)
    _, (gq, gk) = _autograd(lambda a, b: rope(a, b, cos, sin, interleaved=interleaved), q, k, dq, dk)
    bq, bk = rope_backward(dq, dk, cos, sin, interleaved=interleaved)
    torch.testing.assert_close(bq, gq)
    torch.testing.assert_close(bk, gk)


def test_table_rows_equal_transformers_rows() -> None:
    """position_ids into a (P, r) table give the same result as the (B, T, r) rows at those positions."""
    q, k = _qk(torch.bfloat16)
    inv = default_inv_freq(10000.0, 32)
    table = cos_sin(inv, torch.arange(3010), 1.0, torch.bfloat16)
    rows = _rows(32, torch.bfloat16)
    a, b = rope(q, k, *table, POS), rope(q, k, *rows)
    assert_close_pair(a, b)


def assert_close_pair(a, b) -> None:
    for x, y in zip(a, b):
        assert compare(x, y).passed, compare(x, y).message("table vs rows")


# --- argument checks: each error names the argument ------------------------------------------------


def _bad(match: str, **changes) -> None:
    args = dict(q=randn(2, 4, 6, 16), k=randn(2, 2, 6, 16), cos=randn(1, 6, 16), sin=randn(1, 6, 16),
                position_ids=None, unsqueeze_dim=1)
    args.update(changes)
    with pytest.raises((ValueError, TypeError), match=match):
        check_rope_args(**args)


def test_checks_name_the_argument() -> None:
    _bad("head dims differ", k=randn(2, 2, 6, 8))
    _bad("share a dtype", k=randn(2, 2, 6, 16, dtype=torch.bfloat16))
    _bad("must be 4-D", q=randn(4, 6, 16))
    _bad("batch and tokens", k=randn(2, 2, 5, 16))
    _bad("unsqueeze_dim", unsqueeze_dim=3)
    _bad("even", cos=randn(1, 6, 15), sin=randn(1, 6, 15))
    _bad("exceeds the head dim", cos=randn(1, 6, 18), sin=randn(1, 6, 18))
    _bad("cover 5 tokens", cos=randn(1, 5, 16), sin=randn(1, 5, 16))
    _bad("batch 3", cos=randn(3, 6, 16), sin=randn(3, 6, 16))
    _bad("cos and sin shapes differ", sin=randn(1, 6, 8))
    _bad("position_ids must be an integer", position_ids=torch.zeros(6), cos=randn(9, 16), sin=randn(9, 16))
    _bad("position_ids must be", position_ids=torch.zeros(3, 6, dtype=torch.long), cos=randn(9, 16),
         sin=randn(9, 16))
    _bad("tables", position_ids=torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 9\).*\[0, 9\]"):
        check_position_range(torch.tensor([[0, 9]]), 9)
    with pytest.raises(TypeError, match="q has dtype torch.float64"):
        check_dtypes((torch.float32, torch.bfloat16), q=randn(1, dtype=torch.float64))


def test_checks_accept_every_supported_form() -> None:
    q, k = randn(2, 6, 4, 16), randn(2, 6, 2, 16)
    shape = check_rope_args(q, k, randn(6, 12), randn(6, 12), None, 2)
    assert (shape.batch, shape.seq_len, shape.heads_q, shape.heads_k, shape.rotary_dim) == (2, 6, 4, 2, 12)
    pos = torch.arange(6)
    for p in (pos, pos[None], pos[None].expand(2, 6)):
        assert check_rope_args(q, k, randn(9, 16), randn(9, 16), p, 2).n_positions == 9
    check_position_range(pos, 6)
