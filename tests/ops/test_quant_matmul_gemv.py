"""The gemv kernel (ops/quant_matmul/gemv.py) against the reference: every weight code dequantized
exactly through its bits (x the identity: y = dequant(W).T, bitwise), tiles of several int4 groups, runs
shorter than a group, K short of a step, of a run and of a group, N short of a block, K slices with and
without a bias, several rows of x, and the plan's slicing rule. Small tiles keep the interpreter fast."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.quant_matmul import GemvLaunch, QuantMatmulConfig, plan, quant_matmul
from kernel_pytorch.ops.quant_matmul.gemv import gemv_runs
from kernel_pytorch.reference import quant_matmul as R
from tests.grid import Poisoned, device_under_test, randn
from tests.ops.quant_helpers import assert_matmul_close, magnitude, quantized, reference

DEV = device_under_test()


def _gemv(block_n: int = 8, block_k: int = 64, per_sm: int = 2, max_m: int = 1) -> QuantMatmulConfig:
    """The current config with every scheme's gemv launch replaced, gemv for M <= max_m."""
    cfg = tuning.current("quant_matmul")
    gemv = GemvLaunch(block_n=block_n, block_k=block_k, num_warps=2, programs_per_sm=per_sm, max_split=8)
    swap = {s: dataclasses.replace(cfg.scheme(s), gemv=gemv) for s in R.SCHEMES}
    return dataclasses.replace(cfg, gemv_max_m=max_m, decode_max_m=max(max_m, cfg.decode_max_m), **swap)


def _every_code(scheme: str, n: int, k: int, group: int) -> dict[str, torch.Tensor]:
    """Parts whose weight holds every code of the scheme (int4: every byte, so every pair of nibbles,
    and every zero point), with scales of several binades."""
    g = torch.Generator().manual_seed(0)
    if scheme == "int4":
        q = (torch.arange(n * k // 2) % 256).reshape(n, k // 2).to(torch.uint8)
        groups = -(-k // group)
        zero = (torch.arange(n * groups) % 16).reshape(n, groups).to(torch.uint8)
        scale = torch.rand(n, groups, generator=g).mul(4).exp2().to(torch.bfloat16)
        return {"qweight": q.to(DEV), "scale": scale.to(DEV), "zero": zero.to(DEV)}
    codes = torch.arange(n * k) % 256
    if scheme == "fp8":
        codes = codes[codes & 0x7F != 0x7F]  # no NaN codes
        codes = torch.cat([codes, codes[: n * k - codes.numel()]])
    q = codes.reshape(n, k).to(torch.uint8).view(torch.int8 if scheme == "int8" else torch.float8_e4m3fn)
    scale = torch.rand(n, generator=g).mul(4).exp2()
    return {"qweight": q.to(DEV), "scale": scale.to(DEV)}


@pytest.mark.parametrize("scheme", R.SCHEMES)
def test_every_code_dequantizes_exactly(scheme: str) -> None:
    """x = I (one row per k, each its own gemv program): y[k, n] = dequant(W)[n, k] with one product
    and zeros summed, so bitwise the reference's weight in fp32."""
    n, k, group = 24, 64, 32
    parts = _every_code(scheme, n, k, group)
    x = torch.eye(k, device=DEV)
    with tuning.override(quant_matmul=_gemv(block_n=8, block_k=64, max_m=k)):
        assert plan(k, n, k, scheme, group, torch.device(DEV), tuning.current("quant_matmul")).path == "gemv"
        y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), group, None)
    assert torch.equal(y, R.dequantize(parts, scheme, group).t())


@pytest.mark.parametrize(("n", "k", "group", "block_k"), [
    (20, 200, 64, 256),   # a step of 4 runs of one group each; K ends inside the first step's fourth run
    (20, 200, 64, 32),    # runs of half a group
    (5, 70, 32, 128),     # N short of one block; K short of a group and of a run
    (37, 520, 128, 256),  # the last of 5 groups 8 wide, a run of 8 columns in a step of 256
])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_int4_runs_and_groups(n: int, k: int, group: int, block_k: int, bias: bool) -> None:
    parts = quantized("int4", n, k, group, DEV)
    x = randn(1, k, dtype=torch.bfloat16, device=DEV)
    b = randn(n, dtype=torch.bfloat16, device=DEV) if bias else None
    chunks, cb = gemv_runs("int4", block_k, group)
    assert chunks * cb * 2 == block_k and cb * 2 <= group
    with tuning.override(quant_matmul=_gemv(block_n=16, block_k=block_k)), Poisoned():
        y = quant_matmul("int4", x, parts["qweight"], parts["scale"], parts["zero"], group, b)
    assert_matmul_close(y, reference("int4", x, parts, group, b), magnitude("int4", x, parts, group, b), k, "y")


@pytest.mark.parametrize("scheme", R.SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("per_sm", [1, 8], ids=["one-slice", "slices"])
def test_slices_rows_and_odd_sizes(scheme: str, dtype: torch.dtype, per_sm: int) -> None:
    """K slices or none, 3 rows of x through gemv (one program each), N = 19 (a short block), K odd
    (int8, fp8) or short of a step (int4), x rows strided."""
    n, k, group = 19, 134 if scheme == "int4" else 133, 32
    parts = quantized(scheme, n, k, group, DEV)
    x = randn(3, k + 3, dtype=dtype, device=DEV)[:, :k]
    b = randn(n, dtype=dtype, device=DEV)
    cfg = _gemv(block_n=8, block_k=32, per_sm=per_sm, max_m=3)
    p = plan(3, n, k, scheme, group, torch.device(DEV), cfg)
    assert p.path == "gemv" and (p.splits > 1) == (per_sm == 8)
    with tuning.override(quant_matmul=cfg), Poisoned():
        y = quant_matmul(scheme, x, parts["qweight"], parts["scale"], parts.get("zero"), group, b)
    assert y.dtype == dtype
    assert_matmul_close(y, reference(scheme, x, parts, group, b), magnitude(scheme, x, parts, group, b), k, "y")


def test_plan_slices_only_below_programs_per_sm() -> None:
    """Blocks of N that already give programs_per_sm programs per SM take all of K each (one launch);
    fewer blocks take the most slices that stay at or under it."""
    dev = torch.device(DEV)
    sms = 4 if DEV == "cpu" else torch.cuda.get_device_properties(0).multi_processor_count
    launch = GemvLaunch(block_n=16, block_k=256, programs_per_sm=2)
    cfg = dataclasses.replace(tuning.current("quant_matmul"),
                              int8=dataclasses.replace(tuning.current("quant_matmul").int8, gemv=launch))
    wide = plan(1, 16 * 2 * sms, 4096, "int8", 0, dev, cfg)
    assert wide.splits == 1 and wide.k_per_split >= 4096
    narrow = plan(1, 16 * sms // 2, 4096, "int8", 0, dev, cfg)
    assert narrow.splits == 4 and narrow.k_per_split == 1024
    assert plan(1, 16, 300, "int8", 0, dev, cfg).splits == 2  # never more slices than steps


def test_gemv_launch_is_checked() -> None:
    with pytest.raises(ValueError, match="block_k must be a power of two"):
        GemvLaunch(block_n=16, block_k=96)
    with pytest.raises(ValueError, match="programs_per_sm must be a positive int"):
        GemvLaunch(block_n=16, block_k=64, programs_per_sm=0)
