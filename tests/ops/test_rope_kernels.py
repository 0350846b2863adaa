"""Rotary embedding kernels against the reference: both conventions, both layouts, partial rotary, GQA,
rows and position-id tables, fused-QKV views in place, tiles cut short, bad positions, transformers'
eager rounding; every pair method of the tile kernel, the per-token kernel and the flat kernel (with
its fallback for strides it does not take); on the GPU the benchmark
shapes, bitwise parity with transformers and determinism."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.rope import FlatConfig, RopeConfig, TileConfig, TokenConfig, flat, rope_bwd, rope_fwd, token
from kernel_pytorch.ops.rope.call import Flags, Operands
from kernel_pytorch.ops.rope.tile import tile_shape
from kernel_pytorch.reference.rope import rope, rope_backward
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.norm_helpers import assert_close
from tests.ops.rope_helpers import RopeCase, make_heads, make_rows, rotation_rows, rotation_table

DEV = device_under_test()

# Every kernel and pair method: the schedule, the tile kernel's pair methods, the flat kernel's partner
# load and cos/sin eviction policy
VARIANTS = {
    "tile": RopeConfig(schedule="tile"),
    "tile-split-partner": RopeConfig(schedule="tile", tile=TileConfig(pairs_rotate_half="split",
                                                                      pairs_interleaved="partner")),
    "tile-halves": RopeConfig(schedule="tile", tile=TileConfig(pairs_rotate_half="halves")),
    "token": RopeConfig(schedule="token"),
    "flat": RopeConfig(schedule="flat"),  # dense q/k only: other strides run the fallback
    "flat-halves": RopeConfig(schedule="flat", flat=FlatConfig(partner="halves", evict_tables="evict_last")),
}


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test on each kernel variant (RopeConfig's schedule, TileConfig's pair methods, FlatConfig's
    partner load and eviction policy)."""
    with tuning.override(rope=VARIANTS[request.param]):
        yield request.param


CASES = (
    RopeCase(1, 1, 1, 1, 2, 2, "bhtd", "2d"),  # every size 1, the smallest head
    RopeCase(1, 3, 2, 1, 8, 8, "bthd", "1"),  # GQA, full rotary
    RopeCase(2, 1, 3, 3, 12, 6, "bthd_as_bhtd", "b"),  # partial: 3 pairs (not a power of two), 6 pass
)


def _check(q, k, cos, sin, pos, interleaved, unsqueeze_dim, hf_rounding=False, inplace=False) -> None:
    """Forward and backward of the kernels against the reference, same upstream gradient for both."""
    kw = dict(interleaved=interleaved, unsqueeze_dim=unsqueeze_dim, hf_rounding=hf_rounding)
    dq, dk = randn(*q.shape, dtype=q.dtype, device=DEV), randn(*k.shape, dtype=k.dtype, device=DEV)
    ref_q, ref_k = rope(q, k, cos, sin, pos, **kw)
    ref_dq, ref_dk = rope_backward(dq, dk, cos, sin, pos, **kw)
    with Poisoned():
        qo, ko = rope_fwd(q.clone() if inplace else q, k.clone() if inplace else k, cos, sin, pos,
                          inplace=inplace, **kw)
        gq, gk = rope_bwd(dq, dk, cos, sin, pos, **kw)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == q.dtype
    for name, a, b in (("q", qo, ref_q), ("k", ko, ref_k), ("dq", gq, ref_dq), ("dk", gk, ref_dk)):
        assert_close(a, b, name)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_match_reference(case: RopeCase, interleaved: bool, dtype: torch.dtype, variant: str) -> None:
    q, k = make_heads(case, case.hq, dtype, DEV), make_heads(case, case.hk, dtype, DEV)
    cos, sin = make_rows(case, dtype, DEV)
    _check(q, k, cos, sin, None, interleaved, case.unsqueeze_dim)


@pytest.mark.parametrize(
    "pos_kind", ["batch_offsets", "shared_1d", "shared_2d_int32"], ids=str
)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_position_ids_index_the_table(pos_kind: str, interleaved: bool, variant: str) -> None:
    """Packed/left-padded/decoding position ids: any rows of an fp32 table for bf16 q and k."""
    case = RopeCase(2, 2, 2, 1, 10, 8, "bthd")
    q, k = make_heads(case, 2, torch.bfloat16, DEV), make_heads(case, 1, torch.bfloat16, DEV)
    cos, sin = rotation_table(40, case.r, torch.float32, DEV, interleaved)
    pos = {
        "batch_offsets": torch.tensor([[0, 1], [38, 39]], device=DEV),  # a decode offset
        "shared_1d": torch.tensor([5, 0], device=DEV),  # out of order
        "shared_2d_int32": torch.tensor([[1, 1]], device=DEV, dtype=torch.int32),  # repeated
    }[pos_kind]
    _check(q, k, cos, sin, pos, interleaved, case.unsqueeze_dim)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_fused_qkv_views_in_place(interleaved: bool, variant: str) -> None:
    """q and k as views of one (B, T, Hq + 2 Hk, D) projection, rotated in place: no copy, v untouched,
    the same values as the reference; the backward in place too."""
    b, t, hq, hk, d = 1, 3, 2, 1, 8
    qkv = randn(b, t, hq + 2 * hk, d, dtype=torch.bfloat16, device=DEV)
    before = qkv.clone()
    q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    cos, sin = rotation_rows(torch.arange(t, device=DEV)[None], d, torch.bfloat16, interleaved)
    ref_q, ref_k = rope(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=2)
    qo, ko = rope_fwd(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=2, inplace=True)
    assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
    assert torch.equal(v, before[:, :, hq + hk:])
    assert_close(q, ref_q, "q in place")
    assert_close(k, ref_k, "k in place")
    dq, dk = randn(*q.shape, dtype=q.dtype, device=DEV), randn(*k.shape, dtype=k.dtype, device=DEV)
    ref_dq, ref_dk = rope_backward(dq, dk, cos, sin, interleaved=interleaved, unsqueeze_dim=2)
    gq, gk = rope_bwd(dq, dk, cos, sin, interleaved=interleaved, unsqueeze_dim=2, inplace=True)
    assert gq is dq and gk is dk
    assert_close(dq, ref_dq, "dq in place")
    assert_close(dk, ref_dk, "dk in place")


@pytest.mark.parametrize("schedule", ["flat", "tile", "token"])
def test_in_place_leaves_the_pass_through_features(schedule: str) -> None:
    case = RopeCase(1, 2, 2, 1, 12, 4, "bhtd")
    q, k = make_heads(case, 2, torch.float16, DEV), make_heads(case, 1, torch.float16, DEV)
    cos, sin = make_rows(case, torch.float16, DEV)
    with tuning.changed("rope", schedule=schedule):
        _check(q, k, cos, sin, None, False, 1, inplace=True)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_tiles_cut_short(layout: str, interleaved: bool, variant: str) -> None:
    """Small tiles on a small shape: several token blocks (the last one short) and head blocks (the last
    one short) for the tile kernel; a loop over head tiles, the last one short, for the per-token one;
    two rows a program for the flat one, the last q and k programs short."""
    base = tuning.current("rope")
    small = dataclasses.replace(
        base, tile=dataclasses.replace(base.tile, elements=32, tokens=2),
        token=TokenConfig(elements=16), flat=dataclasses.replace(base.flat, elements=16),
    )
    case = RopeCase(2, 5, 5, 3, 8, 8, layout)
    bt, bhq, bhk = tile_shape(case.t, case.hq, case.hk, 8, layout == "bthd", small.tile)
    assert (case.t % bt, case.hq % bhq, case.hk % bhk) != (0, 0, 0) and bt < case.t and bhq < case.hq
    assert token.heads_per_tile(case.hq, case.r // 2, small.token) == 2
    q, k = make_heads(case, 5, torch.float32, DEV), make_heads(case, 3, torch.float32, DEV)
    cos, sin = make_rows(case, torch.float32, DEV)
    with tuning.override(rope=small):
        _check(q, k, cos, sin, None, interleaved, case.unsqueeze_dim)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_flat_takes_dense_layouts_and_falls_back(interleaved: bool) -> None:
    """The flat kernel plans for q/k dense in (B, H, T, D) or (B, T, H, D) order (also seen through a
    transpose), and nothing for views of a fused QKV projection or a sliced q, which then run the
    config's fallback and still give the reference's values."""
    flags = Flags(interleaved=interleaved, has_pos=False, copy_pass=False, backward=False, hf_rounding=False)

    def planned_for(q: torch.Tensor, k: torch.Tensor, qo: torch.Tensor, ko: torch.Tensor, unsqueeze_dim: int,
                    half: int) -> tuple | None:
        return flat.plan(Operands(q, k, qo, ko, q, q, None), unsqueeze_dim, half, (0,) * 6, 0, flags, FlatConfig())
    for layout in ("bhtd", "bthd", "bthd_as_bhtd"):
        case = RopeCase(2, 3, 2, 1, 8, 8, layout)
        q, k = make_heads(case, 2, torch.float32, DEV), make_heads(case, 1, torch.float32, DEV)
        planned = planned_for(q, k, torch.empty_like(q), torch.empty_like(k), case.unsqueeze_dim, 4)
        assert planned is not None, layout
    b, t, hq, hk, d = 2, 3, 2, 1, 8
    qkv = randn(b, t, hq + 2 * hk, d, dtype=torch.bfloat16, device=DEV)
    q, k = qkv[:, :, :hq], qkv[:, :, hq:hq + hk]
    sliced = randn(b, t, hq, d + 4, dtype=torch.bfloat16, device=DEV)[..., :d]  # rows not contiguous
    dense_k = randn(b, t, hk, d, dtype=torch.bfloat16, device=DEV)
    assert flat.row_divisor(q, 2) is None and flat.row_divisor(k, 2) is None
    assert flat.row_divisor(sliced, 2) is None and flat.row_divisor(dense_k, 2) == hk
    cos, sin = rotation_rows(torch.arange(t, device=DEV)[None], d, torch.bfloat16, interleaved)
    assert tuning.current("rope").schedule == "flat"
    for qq, kk in ((q, k), (sliced, dense_k)):
        assert planned_for(qq, kk, qq, kk, 2, d // 2) is None
        _check(qq, kk, cos, sin, None, interleaved, 2)  # in place: test_fused_qkv_views_in_place[flat-*]


def test_tile_shape_follows_the_layout() -> None:
    """(B, H, T, D): tokens first, TileConfig.tokens of them; (B, T, H, D): a token's heads first; one
    token (decoding): every head it can hold; about TileConfig.elements elements either way."""
    config = TileConfig()
    assert tile_shape(4096, 32, 8, 128, False, config) == (8, 4, 4)
    assert tile_shape(4096, 32, 8, 128, True, config) == (1, 32, 8)
    assert tile_shape(1, 32, 8, 128, False, config) == (1, 32, 8)
    assert tile_shape(4096, 1, 1, 64, False, config) == (64, 1, 1)  # one head: all tokens
    assert tile_shape(3, 2, 1, 128, True, config) == (4, 2, 1)


def test_default_config_follows_the_probes() -> None:
    """The flat kernel wherever q/k are dense, the tile (rotate-half) or per-token (interleaved) kernel
    elsewhere (config.py names the measurements); "rope" is registered with that default."""
    config = RopeConfig()
    assert tuning.default("rope") == config and tuning.current("rope") == config
    assert config.schedule == "flat" and (config.fallback(False), config.fallback(True)) == ("tile", "token")
    assert (config.tile, config.token, config.flat) == (
        TileConfig(4096, 8, 4, "partner", "split"), TokenConfig(4096, 4), FlatConfig(1024, 4, "wrap", ""))
    assert hash(config) == hash(RopeConfig())  # the plan cache's key


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="no pair method 'halves' for interleaved"):
        TileConfig(pairs_interleaved="halves")
    with pytest.raises(ValueError, match="schedule must be one of"):
        RopeConfig(schedule="flatt")
    with pytest.raises(ValueError, match="fallback_interleaved must be 'tile' or 'token'"):
        RopeConfig(fallback_interleaved="flat")
    with pytest.raises(ValueError, match="partner must be"):
        FlatConfig(partner="mod")
    with pytest.raises(ValueError, match="elements must be a positive int"):
        TokenConfig(elements=0)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hf_rounding(interleaved: bool, dtype: torch.dtype, variant: str) -> None:
    """transformers' eager rounding (each product rounded to the dtype, then the sum) against the
    reference's: bitwise for fp32 and fp16. Triton's CPU interpreter truncates fp32 -> bf16 rather than
    rounding to nearest, so bf16 is held to the table here (bitwise on the GPU: test_cuda_hf_rounding...)."""
    case = RopeCase(1, 3, 2, 1, 12, 8, "bthd")
    q, k = make_heads(case, 2, dtype, DEV, 3.0), make_heads(case, 1, dtype, DEV, 3.0)
    cos, sin = rotation_rows(torch.arange(3, device=DEV)[None] + 100, case.r, torch.float32, interleaved)
    kw = dict(interleaved=interleaved, unsqueeze_dim=2, hf_rounding=True)
    if dtype == torch.bfloat16:
        _check(q, k, cos, sin, None, interleaved, 2, hf_rounding=True)
        return
    outs = (*rope_fwd(q, k, cos, sin, **kw), *rope_bwd(q, k, cos, sin, **kw))
    expected = (*rope(q, k, cos, sin, **kw), *rope_backward(q, k, cos, sin, **kw))
    for a, b in zip(outs, expected):
        assert torch.equal(a, b)


def test_backward_inverts_forward() -> None:
    """With true rotations the backward is the inverse rotation: bwd(fwd(x)) == x."""
    case = RopeCase(2, 2, 2, 2, 16, 12, "bthd")
    q, k = make_heads(case, 2, torch.float32, DEV), make_heads(case, 2, torch.float32, DEV)
    for interleaved in (False, True):
        cos, sin = rotation_table(64, case.r, torch.float32, DEV, interleaved)
        pos = torch.tensor([[3, 60], [0, 63]], device=DEV)
        qo, ko = rope_fwd(q, k, cos, sin, pos, interleaved=interleaved, unsqueeze_dim=2)
        qb, kb = rope_bwd(qo, ko, cos, sin, pos, interleaved=interleaved, unsqueeze_dim=2)
        assert_close(qb, q, "q back")
        assert_close(kb, k, "k back")


def test_positions_outside_the_table_give_nan_rows() -> None:
    case = RopeCase(2, 2, 2, 1, 8, 8, "bhtd")
    q, k = make_heads(case, 2, torch.float32, DEV), make_heads(case, 1, torch.float32, DEV)
    cos, sin = rotation_table(10, case.r, torch.float32, DEV)
    pos = torch.tensor([[0, 10], [-1, 9]], device=DEV)
    qo, ko = rope_fwd(q, k, cos, sin, pos)
    bad = torch.tensor([[False, True], [True, False]], device=DEV)
    for out in (qo, ko):
        nan_tokens = out.isnan().any(-1).any(1)  # (B, T)
        assert torch.equal(nan_tokens, bad) and out.isnan().all(-1).any(1).equal(bad)


def test_empty_batch() -> None:
    q, k = torch.empty(0, 2, 3, 8, device=DEV), torch.empty(0, 1, 3, 8, device=DEV)
    cos, sin = randn(1, 3, 8, device=DEV), randn(1, 3, 8, device=DEV)
    qo, ko = rope_fwd(q, k, cos, sin)
    assert qo.shape == q.shape and ko.shape == k.shape


def test_matches_transformers_within_the_tolerance_table() -> None:
    """The default (fp32, one rounding) against transformers' own bf16 apply_rotary_pos_emb with its
    rotary module's cos/sin, unit-scale activations (tests/reference/test_rope.py: larger scales)."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q = randn(1, 2, 3, 16, dtype=torch.bfloat16, device=DEV)
    k = randn(1, 1, 3, 16, dtype=torch.bfloat16, device=DEV)
    cos, sin = rotation_rows(torch.tensor([[7, 8, 2000]], device=DEV), 16, torch.bfloat16)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    qo, ko = rope_fwd(q, k, cos, sin)
    assert_close(qo, hq, "q vs transformers")
    assert_close(ko, hk, "k vs transformers")


# --- GPU only: the benchmark shapes, bitwise claims -------------------------------------------------

# (B, T, Hq, Hk, D): a training step (the benchmark's batch 4 cut to 2: the checks copy to the host),
# a decode step
BENCH = ((2, 4096, 32, 8, 128), (32, 1, 32, 8, 128))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", BENCH, ids=["train", "decode"])
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_cuda_benchmark_shapes(shape, layout: str, interleaved: bool) -> None:
    b, t, hq, hk, d = shape
    case = RopeCase(b, t, hq, hk, d, d, layout)
    q, k = make_heads(case, hq, torch.bfloat16, "cuda"), make_heads(case, hk, torch.bfloat16, "cuda")
    pos = torch.arange(t, device="cuda")[None] + torch.arange(b, device="cuda")[:, None] * 7
    cos, sin = rotation_rows(pos, d, torch.bfloat16, interleaved)
    _check(q, k, cos, sin, None, interleaved, case.unsqueeze_dim)  # DEV is "cuda" wherever this runs
    # the table form gives the same rows
    tc, ts = rotation_table(int(pos.max()) + 1, d, torch.bfloat16, "cuda", interleaved)
    a = rope_fwd(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=case.unsqueeze_dim)
    c = rope_fwd(q, k, tc, ts, pos, interleaved=interleaved, unsqueeze_dim=case.unsqueeze_dim)
    assert torch.equal(a[0], c[0]) and torch.equal(a[1], c[1])
    # no reductions: two runs are bitwise equal
    again = rope_fwd(q, k, cos, sin, interleaved=interleaved, unsqueeze_dim=case.unsqueeze_dim)
    assert torch.equal(a[0], again[0]) and torch.equal(a[1], again[1])


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_cuda_variants_agree_at_the_train_shape(layout: str, interleaved: bool) -> None:
    """Every kernel variant gives the default's values at the benchmark's train shape (the products may
    round differently where one variant fuses an FMA another does not: the table, not bitwise)."""
    b, t, hq, hk, d = BENCH[0]
    case = RopeCase(b, t, hq, hk, d, d, layout)
    q, k = make_heads(case, hq, torch.bfloat16, "cuda"), make_heads(case, hk, torch.bfloat16, "cuda")
    cos, sin = rotation_rows(torch.arange(t, device="cuda")[None], d, torch.bfloat16, interleaved)
    kw = dict(interleaved=interleaved, unsqueeze_dim=case.unsqueeze_dim)
    expected = (*rope_fwd(q, k, cos, sin, **kw), *rope_bwd(q, k, cos, sin, **kw))
    for name, chosen in VARIANTS.items():
        with tuning.override(rope=chosen):
            got = (*rope_fwd(q, k, cos, sin, **kw), *rope_bwd(q, k, cos, sin, **kw))
        for a, e in zip(got, expected):
            assert_close(a, e, name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_hf_rounding_is_bitwise_transformers(dtype: torch.dtype, variant: str) -> None:
    """hf_rounding=True: bitwise transformers' eager forward and autograd backward on the GPU, fp32
    included (no product fused into an FMA; see ops/rope/math.py's _products)."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q = randn(2, 8, 256, 128, dtype=dtype, device="cuda", scale=3.0).requires_grad_()
    k = randn(2, 2, 256, 128, dtype=dtype, device="cuda", scale=3.0).requires_grad_()
    pos = torch.arange(256, device="cuda")[None] + torch.tensor([[0], [3000]], device="cuda")
    cos, sin = rotation_rows(pos, 128, dtype)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    dq, dk = torch.randn_like(hq), torch.randn_like(hk)
    gq, gk = torch.autograd.grad((hq, hk), (q, k), (dq, dk))
    qo, ko = rope_fwd(q.detach(), k.detach(), cos, sin, hf_rounding=True)
    bq, bk = rope_bwd(dq, dk, cos, sin, hf_rounding=True)
    assert torch.equal(qo, hq) and torch.equal(ko, hk) and torch.equal(bq, gq) and torch.equal(bk, gk)
