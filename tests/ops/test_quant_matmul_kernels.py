"""The quantized-matmul launchers against the reference (reference/quant_matmul.py): every scheme on each
path (gemv, split-K, tiled, dequantize-then-matmul), every dtype, with and without a bias, M in {1, 3, 17},
K neither a multiple of the block nor of int4's group, several K slices; int4's group sizes; fp8 from its
bytes; the dequantization kernel and the backward. Small tiles keep the interpreter fast; on a GPU the
cuda-marked tests run the Llama-3-8B decode shapes with the default config."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.quant_matmul import GemvLaunch, SplitKLaunch, TileLaunch, dequantize, plan, quant_matmul
from kernel_pytorch.ops.quant_matmul.launch import quant_matmul_backward
from kernel_pytorch.reference import quant_matmul as R
from tests.grid import DTYPES, Poisoned, device_under_test, randn
from tests.ops.norm_helpers import assert_close
from tests.ops.quant_helpers import assert_matmul_close, magnitude, quantized, reference, weight_args

DEV = device_under_test()
SCHEMES = R.SCHEMES
N, K, GROUP = 20, 70, 32  # K: 3 blocks of 32 (the last short), 3 int4 groups (the last short)


def _small(cfg, gemv_block_k: int = 32):
    """Tiles of 16 x 32 on every path, tiled from M = 9 on: several column blocks, K steps and slices."""
    split = SplitKLaunch(block_n=16, block_k=32, num_warps=2, num_stages=1, programs_per_sm=2, max_split=8)
    gemv = GemvLaunch(block_n=16, block_k=gemv_block_k, num_warps=2, programs_per_sm=2, max_split=8)
    launches = dataclasses.replace(cfg.int8, gemv=gemv, split_k=split,
                                   tiled=TileLaunch(block_m=16, block_n=16, block_k=32, group_m=2, num_warps=2,
                                                    num_stages=1))
    return dataclasses.replace(cfg, gemv_max_m=1, decode_max_m=8, int8=launches, fp8=launches, int4=launches)


@pytest.fixture
def small_tiles() -> Iterator[None]:
    with tuning.override(quant_matmul=_small(tuning.current("quant_matmul"))):
        yield


def _check(scheme: str, m: int, dtype: torch.dtype, bias: bool, group: int = GROUP, k: int = K,
           lead: tuple[int, ...] = ()) -> torch.Tensor:
    parts = quantized(scheme, N, k, group, DEV)
    x = randn(*lead, m, k, dtype=dtype, device=DEV)
    b = randn(N, dtype=dtype, device=DEV) if bias else None
    with Poisoned():
        y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), group, b)
    assert y.shape == (*lead, m, N) and y.dtype == dtype
    assert_matmul_close(y, reference(scheme, x, parts, group, b), magnitude(scheme, x, parts, group, b), k,
                        f"{scheme} y")
    return y


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 3, 17], ids=["gemv", "split_k", "tiled"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_path_matches_the_reference(scheme: str, m: int, dtype: torch.dtype, bias: bool,
                                          small_tiles) -> None:
    p = plan(m, N, K, scheme, GROUP, torch.device(DEV), tuning.current("quant_matmul"))
    assert p.path == {1: "gemv", 3: "split_k", 17: "tiled"}[m]
    if DEV == "cpu" and m < 17:
        assert p.splits > 1  # the partial sums and their second kernel run
    _check(scheme, m, dtype, bias)


@pytest.mark.parametrize("m", [1, 5, 12], ids=["gemv", "split_k", "tiled"])
@pytest.mark.parametrize("group", [64, 128])
def test_int4_group_sizes(group: int, m: int, small_tiles) -> None:
    """K = 200: 4 groups of 64 or 2 of 128, the last one short of the group size either way."""
    _check("int4", m, torch.bfloat16, True, group=group, k=200)


@pytest.mark.parametrize("gemv_block_k", [64, 128])
def test_int4_gemv_tiles_spanning_groups(gemv_block_k: int) -> None:
    """The gemv path's tile may cover several int4 groups (each column takes its group's scale)."""
    with tuning.override(quant_matmul=_small(tuning.current("quant_matmul"), gemv_block_k)):
        assert plan(1, N, K, "int4", GROUP, torch.device(DEV), tuning.current("quant_matmul")).block_k > GROUP
        _check("int4", 1, torch.float16, True)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_strided_and_batched_x(scheme: str, small_tiles) -> None:
    """x with two leading dims, and x as the first K columns of a wider tensor (strided rows)."""
    _check(scheme, 3, torch.bfloat16, True, lead=(2,))
    parts = quantized(scheme, N, K, GROUP, DEV)
    x = randn(5, K + 6, dtype=torch.float16, device=DEV)[:, :K]
    y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), GROUP, None)
    assert_matmul_close(y, reference(scheme, x, parts, GROUP, None), magnitude(scheme, x, parts, GROUP, None), K, "y")


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_odd_k(scheme: str, small_tiles) -> None:
    _check(scheme, 1, torch.float32, False, k=67)
    _check(scheme, 3, torch.bfloat16, True, k=67)


@pytest.mark.parametrize("m", [1, 3, 17])
def test_fp8_from_its_bytes(m: int, small_tiles) -> None:
    """The e4m3 decode of GPUs without the conversion instructions gives the hardware's values."""
    parts = quantized("fp8", N, K, device=DEV)
    x = randn(m, K, dtype=torch.bfloat16, device=DEV)
    args = (parts["qweight"], parts["scale"], None, 0, None)
    assert torch.equal(quant_matmul("fp8", x, *args, native_fp8=False), quant_matmul("fp8", x, *args, native_fp8=True))


def test_every_e4m3_value_decodes() -> None:
    """All 254 finite e4m3 bytes (subnormals, both zeros, +-448) through the byte decode and the native one."""
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8, device=DEV)
    q = codes.view(torch.float8_e4m3fn).reshape(2, -1)
    scale = torch.ones(2, device=DEV)
    for native in (False, True):
        got = dequantize("fp8", q, scale, None, 0, q.shape[1], torch.float32, native_fp8=native)
        assert torch.equal(got, q.to(torch.float32)), native


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_kernel_is_the_reference(scheme: str) -> None:
    """fp32: the same products as the reference, bitwise; bf16: that rounded once (to nearest on the
    GPU; Triton's interpreter truncates, one unit in the last place)."""
    parts = quantized(scheme, 37, K, GROUP, DEV)
    want = R.dequantize(parts, scheme, GROUP)
    got = dequantize(scheme, parts["qweight"], parts["scale"], parts.get("zero"), GROUP, K, torch.float32)
    assert torch.equal(got, want)
    got = dequantize(scheme, parts["qweight"], parts["scale"], parts.get("zero"), GROUP, K, torch.bfloat16)
    if DEV == "cuda":
        assert torch.equal(got, want.to(torch.bfloat16))
    else:
        assert_close(got, want.to(torch.bfloat16), "bf16 weight")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dequantize_prefill_mode(scheme: str) -> None:
    with tuning.changed("quant_matmul", decode_max_m=4, prefill="dequant"):
        p = plan(9, N, K, scheme, GROUP, torch.device(DEV), tuning.current("quant_matmul"))
        assert p.path == "dequant"
        _check(scheme, 9, torch.float32, True)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_backward_matches_the_reference(scheme: str) -> None:
    """dx = dy @ dequant(W) (the weight rounded to dy's dtype once: fp32 here, so only sums differ) and
    dbias, against the reference's."""
    parts = quantized(scheme, N, K, GROUP, DEV)
    dy = randn(2, 3, N, device=DEV)
    args = weight_args(scheme, parts, GROUP)
    dx, dbias = quant_matmul_backward(scheme, dy, parts["qweight"], parts["scale"], parts.get("zero"), GROUP, True)
    want_dx, want_db = getattr(R, f"{scheme}_matmul_backward")(dy, *args, True)
    w = R.dequantize(parts, scheme, GROUP, torch.float64)
    assert_matmul_close(dx, want_dx, dy.double().abs() @ w.abs(), N, "dx")
    assert_matmul_close(dbias, want_db, dy.double().abs().sum((0, 1)), 6, "dbias")
    assert quant_matmul_backward(scheme, dy, parts["qweight"], parts["scale"], parts.get("zero"), GROUP,
                                 False)[1] is None


def test_launches_name_only_kernel_parameters(monkeypatch, small_tiles) -> None:
    """Every keyword a launcher passes is a parameter of its kernel or a launch option: Triton's
    interpreter ignores others, the GPU compiler refuses them."""
    from kernel_pytorch.ops.quant_matmul import launch

    seen = set()
    for name in ("_matmul", "_gemv", "_sum_splits", "_dequant"):
        launcher = getattr(launch, name)

        def checked(grid, *args, launcher=launcher, name=name, **meta):
            unknown = set(meta) - set(launcher.fn.arg_names) - {"num_warps", "num_stages", "eager"}
            assert not unknown, f"{name} passes {sorted(unknown)}"
            seen.add(name)
            return launcher(grid, *args, **meta)

        monkeypatch.setattr(launch, name, checked)
    for scheme in SCHEMES:
        for m in (1, 3, 17):
            _check(scheme, m, torch.float32, True)
        dequantize(scheme, *quantized_args(scheme), GROUP, K, torch.float32)
    assert seen == {"_matmul", "_gemv", "_sum_splits", "_dequant"}


def quantized_args(scheme: str) -> tuple:
    """(qweight, scale, zero or None) of a random N x K weight."""
    parts = quantized(scheme, N, K, GROUP, DEV)
    return parts["qweight"], parts["scale"], parts.get("zero")


def test_empty_rows() -> None:
    parts = quantized("int8", N, K, device=DEV)
    y = quant_matmul("int8", randn(0, K, device=DEV), parts["qweight"], parts["scale"], None, 0, None)
    assert y.shape == (0, N)


def test_plan_splits_k_to_fill_the_device() -> None:
    """Decode shapes: K slices until programs_per_sm programs per SM; prefill: no slices."""
    cfg = tuning.current("quant_matmul")
    dev = torch.device(DEV)
    for scheme in SCHEMES:
        one = plan(1, 4096, 4096, scheme, 128, dev, cfg)
        assert one.path == "gemv" and one.k_per_split % one.block_k == 0
        assert one.splits * one.k_per_split >= 4096 > (one.splits - 1) * one.k_per_split
        eight = plan(8, 4096, 4096, scheme, 128, dev, cfg)
        assert eight.path == "split_k" and eight.block_m == 16
        if scheme == "int4":
            assert eight.block_k <= 128
        assert plan(512, 4096, 4096, scheme, 128, dev, cfg).splits == 1


# --- on a GPU: the decode shapes of Llama-3-8B with the default config ------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("nk", [(4096, 4096), (14336, 4096), (4096, 14336)], ids=["qkvo", "up", "down"])
@pytest.mark.parametrize("m", [1, 8, 32, 300])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_llama_shapes(scheme: str, m: int, nk: tuple[int, int]) -> None:
    n, k = nk
    parts = quantized(scheme, n, k, 128, "cuda")
    x = randn(m, k, dtype=torch.bfloat16, device="cuda")
    bias = randn(n, dtype=torch.bfloat16, device="cuda")
    y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), 128, bias)
    assert_matmul_close(y, reference(scheme, x, parts, 128, bias), magnitude(scheme, x, parts, 128, bias), k, "y")
    again = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), 128, bias)
    assert torch.equal(y, again)  # split sums in a fixed order: bitwise the same on every run


@pytest.mark.cuda
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_fp16_and_fp32(scheme: str) -> None:
    for dtype in (torch.float16, torch.float32):
        for m in (1, 8, 200):
            parts = quantized(scheme, 1024, 2048, 64, "cuda")
            x = randn(m, 2048, dtype=dtype, device="cuda")
            y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), 64, None)
            assert_matmul_close(y, reference(scheme, x, parts, 64, None), magnitude(scheme, x, parts, 64, None),
                                2048, f"{dtype} m={m}")


def test_config_is_registered_frozen_and_checked() -> None:
    from kernel_pytorch.ops.quant_matmul import QuantMatmulConfig

    default = tuning.default("quant_matmul")
    assert type(default) is QuantMatmulConfig and default == QuantMatmulConfig() and hash(default)
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.__setattr__("prefill", "dequant")
    with pytest.raises(ValueError, match="prefill"):
        QuantMatmulConfig(prefill="cublas")
    with pytest.raises(ValueError, match="decode_max_m"):
        QuantMatmulConfig(gemv_max_m=8, decode_max_m=4)
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        SplitKLaunch(block_n=16, block_k=48)
    # plans key on the config: the same shape under another config gets that config's plan
    dev = torch.device(DEV)
    assert plan(3, N, K, "int8", 0, dev, default).path == "split_k"
    assert plan(3, N, K, "int8", 0, dev, dataclasses.replace(default, decode_max_m=2)).path == "tiled"


def test_symbolic_sizes_plan_from_their_hints() -> None:
    """torch.export / AOTInductor trace the launch with SymInts: the plan comes from the hint (an
    lru_cache keyed on a SymInt raised "unhashable type"), the grid follows the real size."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from kernel_pytorch.ops.quant_matmul.launch import _size_hint

    env = ShapeEnv()
    m = env.create_symintnode(env.create_symbol(8, ConstantSource("m")), hint=8)
    assert _size_hint(m, 33) == 8 and _size_hint(5, 33) == 5
    unbacked = env.create_unbacked_symint()
    assert _size_hint(unbacked, 33) == 33  # no hint: past decode_max_m, the tiled path
