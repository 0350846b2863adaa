"""Gated activations (SwiGLU, GEGLU): the launchers against the reference (split and packed layouts,
strided and flat operands, every activation and dtype, in-place outputs, a gate multiplier), the
reference against transformers' eager MLP (Falcon-H1's gate multiplier included) and against autograd,
the argument checks; on the GPU, wide rows, bitwise agreement with eager and determinism."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kernel_pytorch import reference as R
from kernel_pytorch.ops import _activations, tuning
from kernel_pytorch.ops.gated_act import (
    gated_act_bwd,
    gated_act_fwd,
    gated_act_packed_bwd,
    gated_act_packed_fwd,
)
from kernel_pytorch.reference import _act_checks as checks
from tests.grid import DTYPES, ROW_SHAPES, Poisoned, device_under_test, randn, strided_rows
from tests.ops.act_helpers import (
    ACTS,
    assert_matches_eager,
    bitwise_fraction,
    gate_input,
    hf_act,
)
from tests.ops.norm_helpers import assert_budget, assert_close

DEV = device_under_test()
BF16 = torch.bfloat16


@pytest.fixture(params=["whole", "small_tiles"])
def tile_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test with the committed tiles and with tiles small enough that the grid's shapes take
    several column blocks per row, several rows per tile and the masked-column choice of wide rows.
    (The interpreter truncates fp32 to bf16 where the GPU rounds to nearest: bf16 is held to the
    tolerance table here, bitwise to eager on the GPU only.)"""
    small = dict(tile_elements=32, max_block_c=16, min_block_c=4) if request.param == "small_tiles" else {}
    with tuning.changed("mlp", **small):
        yield request.param


def _assert_matches_reference(h, grads, dh, gate, up, act: str) -> None:
    """h and (d_gate, d_up[, h recomputed]) against the reference by the tolerance table."""
    h_ref = R.gated_act(gate, up, act)
    assert_close(h, h_ref, "h")
    dg_ref, du_ref = R.gated_act_backward(dh, gate, up, act)
    assert_close(grads[0], dg_ref, "d_gate")
    assert_close(grads[1], du_ref, "d_up")
    if len(grads) > 2 and grads[2] is not None:
        assert torch.equal(grads[2], h), "h recomputed in the backward differs from the forward's"


def _split_case(lead, cols, dtype, act) -> None:
    gate = gate_input(*lead, cols + 3, dtype=dtype, device=DEV)[..., :cols]  # strided rows
    up = strided_rows(lead, cols, dtype, DEV)
    dh = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        h = gated_act_fwd(gate, up, act)
        grads = gated_act_bwd(dh, gate, up, act, with_h=True)
    assert h.shape == gate.shape and h.dtype == dtype
    _assert_matches_reference(h, grads, dh, gate, up, act)


def _packed_case(lead, cols, dtype, act) -> None:
    gate_up = torch.cat([gate_input(*lead, cols, dtype=dtype, device=DEV),
                         randn(*lead, cols, dtype=dtype, device=DEV)], dim=-1)
    dh = randn(*lead, cols, dtype=dtype, device=DEV)
    with Poisoned():
        h = gated_act_packed_fwd(gate_up, act)
        d, h2 = gated_act_packed_bwd(dh, gate_up, act, with_h=True)
    assert h.shape == dh.shape and d.shape == gate_up.shape
    assert_close(h, R.gated_act_packed(gate_up, act), "h")
    assert_close(d, R.gated_act_packed_backward(dh, gate_up, act), "d_gate_up")
    assert torch.equal(h2, h)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_split_strided_matches_reference(lead, cols, dtype) -> None:
    _split_case(lead, cols, dtype, "silu")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_activation_matches_reference(dtype, act) -> None:
    _split_case((5,), 33, dtype, act)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,cols", ROW_SHAPES)
def test_packed_matches_reference(lead, cols, dtype) -> None:
    _packed_case(lead, cols, dtype, "gelu_tanh")


@pytest.mark.parametrize("m", [0.7, 1.9])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_gate_multiplier_matches_reference(dtype, act, m) -> None:
    """Falcon-H1's gate multiplier inside the kernels: act((gate * m).to(dtype)) forward, d_gate scaled
    by m backward, split (strided) and packed, h recomputed in the backward as the forward's. fp32 by the
    table; bf16 by the fp64 budget: the rounding of gate * m to bf16 is the specification's (eager's), and
    an ulp of it moves act(z) by up to |1 + z| ulps in SiLU's tail, so where the interpreter truncates
    that rounding (the GPU rounds to nearest, as the reference) the error is the reference's own kind."""
    gate_up = torch.cat([gate_input(5, 3, 40, dtype=dtype, device=DEV), randn(5, 3, 40, dtype=dtype, device=DEV)], -1)
    gate, up = gate_up.chunk(2, -1)  # strided halves for the split launchers
    dh = randn(5, 3, 40, dtype=dtype, device=DEV)
    with Poisoned():
        h, hp = gated_act_fwd(gate, up, act, m), gated_act_packed_fwd(gate_up, act, m)
        d_gate, d_up, h2 = gated_act_bwd(dh, gate, up, act, m, with_h=True)
        dp, hp2 = gated_act_packed_bwd(dh, gate_up, act, m, with_h=True)
    assert torch.equal(h2, h) and torch.equal(hp2, hp) and torch.equal(hp, h)
    assert torch.equal(dp, torch.cat([d_gate, d_up], -1))
    wide = (dh.double(), gate.double(), up.double())
    refs = {"h": (R.gated_act(gate, up, act, m), R.gated_act(*wide[1:], act, m)),
            "d_gate": (R.gated_act_backward(dh, gate, up, act, m)[0], R.gated_act_backward(*wide, act, m)[0]),
            "d_up": (R.gated_act_backward(dh, gate, up, act, m)[1], R.gated_act_backward(*wide, act, m)[1])}
    for name, got in (("h", h), ("d_gate", d_gate), ("d_up", d_up)):
        if dtype == torch.float32:
            assert_close(got, refs[name][0], name)
        else:
            assert_budget(got, *refs[name], name)


@pytest.mark.parametrize("lead,cols", [((5,), 33), ((2, 3), 128)])
def test_small_tiles(lead, cols, tile_path) -> None:
    """Several column blocks per row and several rows per tile, masked at both edges."""
    _split_case(lead, cols, torch.bfloat16, "silu")
    _packed_case(lead, cols, torch.bfloat16, "gelu")


def test_packed_reads_gate_first() -> None:
    """The first half is the gate, as transformers' Phi3MLP chunks its gate_up_proj output."""
    gate, up = gate_input(4, 24, dtype=torch.float32, device=DEV), randn(4, 24, device=DEV)
    h = gated_act_packed_fwd(torch.cat([gate, up], -1), "silu")
    assert_close(h, torch.nn.functional.silu(gate) * up, "h")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flat_and_column_strided_operands(dtype) -> None:
    """Contiguous operands (streamed as one flat row) and operands with a non-unit column stride
    (transposed) give the reference's values."""
    rows, cols = 6, 37
    gate = gate_input(rows, cols, dtype=dtype, device=DEV)
    up = randn(rows, cols, dtype=dtype, device=DEV)
    dh = randn(rows, cols, dtype=dtype, device=DEV)
    for g, u, d in ((gate, up, dh), (gate.t().contiguous().t(), up.t().contiguous().t(), dh)):
        with Poisoned():
            h = gated_act_fwd(g, u, "gelu")
            grads = gated_act_bwd(d, g, u, "gelu")
        _assert_matches_reference(h, grads, d, g, u, "gelu")


@pytest.mark.parametrize("layout", ["split", "packed"])
def test_in_place_outputs(layout: str) -> None:
    """Gradients written over their inputs (and h over dh) equal the out-of-place results bitwise."""
    dtype, act = torch.bfloat16, "silu"
    gate_up = torch.cat([gate_input(5, 3, 40, dtype=dtype, device=DEV), randn(5, 3, 40, dtype=dtype, device=DEV)], -1)
    dh = randn(5, 3, 40, dtype=dtype, device=DEV)
    if layout == "split":
        gate, up = gate_up[..., :40].clone(), gate_up[..., 40:].clone()
        want = gated_act_bwd(dh, gate, up, act, with_h=True)
        dh_buf = dh.clone()
        got = gated_act_bwd(dh_buf, gate, up, act, d_gate=gate, d_up=up, h=dh_buf, with_h=True)
        assert got[0] is gate and got[1] is up and got[2] is dh_buf
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    else:
        want, want_h = gated_act_packed_bwd(dh, gate_up, act, with_h=True)
        dh_buf = dh.clone()
        got, got_h = gated_act_packed_bwd(dh_buf, gate_up, act, out=gate_up, h=dh_buf, with_h=True)
        assert got is gate_up and got_h is dh_buf
        assert torch.equal(got, want) and torch.equal(got_h, want_h)


def test_out_buffer_that_needs_a_copy_is_refused() -> None:
    gate_up = randn(4, 3, 16, device=DEV).transpose(0, 1)  # leading dims do not collapse
    dh = randn(3, 4, 8, device=DEV)
    with pytest.raises(ValueError, match="out must be viewable"):
        gated_act_packed_bwd(dh, gate_up, "silu", out=gate_up)


@pytest.mark.parametrize("cols", [1, 2, 4096 + 1, 14336])
def test_tile_choice(cols: int) -> None:
    """Whole rows up to the config's max_block_c; wider rows in the widest block that masks the fewest
    columns (14336, Llama-3-8B's intermediate size, in 2048-wide blocks: none masked)."""
    t = _activations.tiles(64, cols)
    assert t.block_c * t.col_tiles >= cols and t.block_r * t.row_tiles >= 64
    assert t.block_r * t.block_c <= tuning.current("mlp").tile_elements
    if cols == 14336:
        assert t.block_c == 2048 and t.col_tiles == 7


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_is_hf_eager_mlp(dtype, act) -> None:
    """The reference's forward is bitwise transformers' act_fn(gate) * up; its backward within the
    tolerance table of eager autograd (which rounds dh * up once more before act')."""
    gate = gate_input(33, 257, dtype=dtype, device="cpu").requires_grad_()
    up = randn(33, 257, dtype=dtype).requires_grad_()
    dh = randn(33, 257, dtype=dtype)
    h = hf_act(act)(gate) * up
    exact = R.gated_act(gate.detach().double(), up.detach().double(), act)
    assert_matches_eager(R.gated_act(gate.detach(), up.detach(), act), h, exact, "h")
    dg, du = torch.autograd.grad(h, (gate, up), dh)
    ref_dg, ref_du = R.gated_act_backward(dh, gate.detach(), up.detach(), act)
    assert_close(ref_dg, dg, "d_gate")
    assert torch.equal(ref_du, du) or dtype == torch.float16  # fp16: one element in 1e5 differs
    assert_close(ref_du, du, "d_up")


@pytest.mark.parametrize("m", [0.7, 1.9])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_reference_with_gate_multiplier_is_falcon_h1_eager(dtype, m) -> None:
    """With a gate multiplier the reference's forward is bitwise FalconH1MLP's
    up_proj(x) * act_fn(gate_proj(x) * gate_multiplier); its backward within the table of eager autograd."""
    gate = gate_input(33, 257, dtype=dtype, device="cpu").requires_grad_()
    up = randn(33, 257, dtype=dtype).requires_grad_()
    dh = randn(33, 257, dtype=dtype)
    h = up * hf_act("silu")(gate * m)
    assert torch.equal(R.gated_act(gate.detach(), up.detach(), "silu", m), h)
    dg, du = torch.autograd.grad(h, (gate, up), dh)
    ref_dg, ref_du = R.gated_act_backward(dh, gate.detach(), up.detach(), "silu", m)
    assert_close(ref_dg, dg, "d_gate")
    assert torch.equal(ref_du, du)


@pytest.mark.parametrize("act", ACTS)
def test_kernels_agree_with_hf_eager(act) -> None:
    """The kernels against transformers' activation directly: within the table in every dtype (wide
    gate values, both tails), and bitwise for nearly every element in fp16 on pre-activation-like
    values (N(0, 1)). fp32 results differ in the last bit wherever exp or erf do; bf16 is checked
    bitwise on the GPU (the interpreter truncates to bf16)."""
    for dtype in DTYPES:
        gate = gate_input(16, 200, dtype=dtype, device=DEV)
        up = randn(16, 200, dtype=dtype, device=DEV)
        assert_close(gated_act_fwd(gate, up, act), hf_act(act)(gate) * up, f"h {dtype}")
    gate, up = randn(16, 200, dtype=torch.float16, device=DEV), randn(16, 200, dtype=torch.float16, device=DEV)
    equal = bitwise_fraction(gated_act_fwd(gate, up, act), hf_act(act)(gate) * up)
    assert equal >= 0.99, f"fp16: {equal:.4f} bitwise equal"


@pytest.mark.parametrize("m", [1.0, 0.7])
@pytest.mark.parametrize("act", ACTS)
def test_reference_backward_is_the_gradient_of_the_reference(act, m) -> None:
    gate = gate_input(6, 40, dtype=torch.float64, device="cpu").requires_grad_()
    up = randn(6, 40, dtype=torch.float64).requires_grad_()
    dh = randn(6, 40, dtype=torch.float64)
    want = torch.autograd.grad(R.gated_act(gate, up, act, m), (gate, up), dh)
    got = R.gated_act_backward(dh, gate.detach(), up.detach(), act, m)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_swiglu_geglu_names() -> None:
    gate, up = gate_input(3, 8, dtype=torch.float32, device="cpu"), randn(3, 8)
    assert torch.equal(R.swiglu(gate, up), R.gated_act(gate, up, "silu"))
    assert torch.equal(R.geglu(gate, up), R.gated_act(gate, up, "gelu"))
    assert torch.equal(R.geglu(gate, up, approximate="tanh"), R.gated_act(gate, up, "gelu_tanh"))
    with pytest.raises(ValueError, match="approximate"):
        R.geglu(gate, up, approximate="erf")


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: checks.check_gated(randn(2, 4), randn(2, 5)), ValueError, "up must have gate's shape"),
        (lambda: checks.check_gated(randn(2, 4), randn(2, 4, dtype=BF16)), TypeError, "up must have gate's dtype"),
        (lambda: checks.check_gated(torch.ones(2, 4, dtype=torch.int32), randn(2, 4)), TypeError, "gate must be a"),
        (lambda: checks.check_gated(randn(2, 4), "up"), TypeError, "up must be a tensor"),
        (lambda: checks.check_gated(torch.tensor(1.0), torch.tensor(1.0)), ValueError, "gate must have at least one"),
        (lambda: checks.check_gated(randn(2, 4), randn(2, 4, device="meta")), ValueError, "up is on meta"),
        (lambda: checks.check_gated_packed(randn(2, 7)), ValueError, "gate_up's last dim .* must be even"),
        (lambda: checks.check_activation("tanh"), ValueError, "activation must be one of"),
        (lambda: checks.check_grad("dh", randn(2, 3), randn(2, 4)), ValueError, "dh must have shape"),
    ],
)
def test_checks_name_the_argument(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_check_activation_accepts_hf_names() -> None:
    assert checks.check_activation("gelu_pytorch_tanh") == "gelu_tanh"
    assert checks.check_activation("swish") == "silu"
    assert checks.check_activation("gelu") == "gelu"


@pytest.mark.cuda
@pytest.mark.parametrize("cols", [1024, 3072, 11008, 14336, 65537])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_wide_rows(cols: int, dtype: torch.dtype) -> None:
    rows = 8 if cols > 16384 else 256
    gate_up = torch.cat([gate_input(rows, cols, dtype=dtype, device="cuda"),
                         randn(rows, cols, dtype=dtype, device="cuda")], -1)
    gate, up = gate_up[:, :cols], gate_up[:, cols:]
    dh = randn(rows, cols, dtype=dtype, device="cuda")
    for act in ACTS:
        with Poisoned():
            h = gated_act_fwd(gate, up, act)
            grads = gated_act_bwd(dh, gate, up, act, with_h=True)
            hp = gated_act_packed_fwd(gate_up, act)
            dp, _ = gated_act_packed_bwd(dh, gate_up, act)
        _assert_matches_reference(h, grads, dh, gate, up, act)
        assert torch.equal(hp, h) and torch.equal(dp, torch.cat(grads[:2], -1))


@pytest.mark.cuda
@pytest.mark.parametrize("m", [1.0, 0.7])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_cuda_bitwise_with_hf_eager(act: str, dtype: torch.dtype, m: float) -> None:
    """On the GPU the forward equals transformers' eager act_fn(gate * m) * up for nearly every element
    (the GPU's approximate exp flips a rounding now and then), and is run-to-run deterministic."""
    gate = randn(512, 4096, dtype=dtype, device="cuda")
    up = randn(512, 4096, dtype=dtype, device="cuda")
    dh = randn(512, 4096, dtype=dtype, device="cuda")
    h = gated_act_fwd(gate, up, act, m)
    assert bitwise_fraction(h, hf_act(act)(gate * m) * up) >= 0.999
    assert torch.equal(h, gated_act_fwd(gate, up, act, m))
    first, second = gated_act_bwd(dh, gate, up, act, m), gated_act_bwd(dh, gate, up, act, m)
    assert all(torch.equal(a, b) for a, b in zip(first[:2], second[:2]))


def test_tiles_of_symbolic_sizes_follow_the_real_size() -> None:
    # torch.export / AOTInductor trace the launch with SymInts: the block comes from the hint, the
    # tile counts stay symbolic (an lru_cache keyed on a SymInt raised "unhashable type")
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    n = env.create_symintnode(env.create_symbol(5000, ConstantSource("n")), hint=5000)
    sym, concrete = _activations.tiles(n, 1024), _activations.tiles(5000, 1024)
    assert (sym.block_r, sym.block_c, sym.num_warps) == (concrete.block_r, concrete.block_c, concrete.num_warps)
    assert isinstance(sym.row_tiles, torch.SymInt) and sym.col_tiles == concrete.col_tiles
    assert sym.row_tiles.node.hint == concrete.row_tiles
