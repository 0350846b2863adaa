"""The norm, mlp, math, adam and embedding launch configs: registered frozen defaults, overrides that
reach the launchers, and memoised launch choices keyed on the config (no cache to clear)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernel_pytorch.ops import _activations, tuning
from kernel_pytorch.ops._activations import MathConfig, MlpConfig
from kernel_pytorch.ops._common import rows as _rows
from kernel_pytorch.ops.adam import AdamConfig
from kernel_pytorch.ops.embedding import EmbeddingConfig, embedding_grad
from kernel_pytorch.ops.norm_config import NormConfig
from tests.grid import device_under_test, randn

DEV = device_under_test()
FAMILIES = {"norm": NormConfig, "mlp": MlpConfig, "math": MathConfig, "adam": AdamConfig,
            "embedding": EmbeddingConfig}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_default_is_the_config_class_default(family: str) -> None:
    default = tuning.default(family)
    assert type(default) is FAMILIES[family] and default == FAMILIES[family]()
    assert dataclasses.fields(default) and hash(default) == hash(FAMILIES[family]())
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.__setattr__(dataclasses.fields(default)[0].name, None)


def test_row_launch_keys_on_the_rows_config() -> None:
    """The same row under two configs gets each config's launch, in either order (a memo keyed on the
    sizes alone would hand the second the first's answer)."""
    base = tuning.current("norm").rows
    small = dataclasses.replace(base, max_fused_cols=16, loop_block=16)
    for _ in range(2):
        assert _rows.row_launch(40, 2, 8, base).single_pass
        looped = _rows.row_launch(40, 2, 8, small)
        assert not looped.single_pass and looped.block == 16


def test_tiles_follow_the_config_in_force() -> None:
    whole = _activations.tiles(64, 40)
    with tuning.changed("mlp", tile_elements=32, max_block_c=16, min_block_c=4):
        small = _activations.tiles(64, 40)
    assert small.block_c <= 16 and small.block_r * small.block_c <= 32
    assert whole.block_c == 64 and _activations.tiles(64, 40) == whole


def test_math_config_decides_precise_math() -> None:
    """Precise math on the GPU only, for bf16 only with precise_bf16; the config in force or given."""
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.empty(1, dtype=dtype, device=DEV)
        assert _activations.precise_math(t, MathConfig(precise=True)) == (t.is_cuda and dtype != torch.bfloat16)
        assert _activations.precise_math(t, MathConfig(precise=True, precise_bf16=True)) == t.is_cuda
        assert not _activations.precise_math(t, MathConfig(precise=False, precise_bf16=True))
        with tuning.changed("math", precise=False):
            assert not _activations.precise_math(t)


def test_embedding_override_reaches_the_launcher() -> None:
    dy, idx = randn(5, 8, device=DEV), torch.tensor([0, 2, 2, 1, 0], device=DEV)
    want = embedding_grad(dy, idx, 3)
    with tuning.changed("embedding", mode="bogus"), pytest.raises(ValueError, match="mode must be"):
        embedding_grad(dy, idx, 3)
    got = embedding_grad(dy, idx, 3, config=EmbeddingConfig(mode="rows", block_cols=4))
    torch.testing.assert_close(got, want)


def test_override_reaches_other_threads() -> None:
    """A CUDA backward runs its nodes on the autograd engine's device threads: an override around
    backward() must reach them, as the module constants the configs replace did. Run for real on CUDA by
    the next test."""
    import threading

    seen: list[int] = []
    with tuning.changed("adam", block=256):
        t = threading.Thread(target=lambda: seen.append(tuning.current("adam").block))
        t.start()
        t.join()
    assert seen == [256] and tuning.current("adam").block == tuning.default("adam").block


@pytest.mark.cuda
def test_override_reaches_a_cuda_backward() -> None:
    seen: list[int] = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(tuning.current("adam").block)
            return g * 2

    x = torch.ones(4, device="cuda", requires_grad=True)
    with tuning.changed("adam", block=256):
        Probe.apply(x).sum().backward()
    assert seen == [256]
