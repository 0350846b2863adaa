"""Every launch of the gated activation and rotary kernels names exactly its kernel's parameters: the
positional arguments and the keywords together cover each parameter once, and no keyword is unknown
(Triton's interpreter ignores unknown keywords, the GPU compiler refuses them). quant_matmul's launches
have the same check in test_quant_matmul_kernels.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops._common.launch import Launcher
from tests.grid import device_under_test, randn

DEV = device_under_test()
_LAUNCH_OPTIONS = {"num_stages"}  # Triton's own keywords besides num_warps (a parameter of Launcher.__call__)


def _checked_launch(seen: set[str]) -> Callable[..., None]:
    """Launcher.__call__, first checking the launch's arguments against its kernel's parameters."""
    call = Launcher.__call__

    def checked(self: Launcher, grid: tuple, *args: object, eager: bool, num_warps: int, **meta: object) -> None:
        names = list(self.fn.arg_names)
        kernel = self.fn.fn.__name__
        keywords = set(meta) - _LAUNCH_OPTIONS
        assert keywords <= set(names), f"{kernel} passes {sorted(keywords - set(names))}"
        assert keywords.isdisjoint(names[: len(args)]), f"{kernel} passes a parameter twice"
        assert set(names[len(args):]) == keywords, f"{kernel} leaves out {sorted(set(names[len(args):]) - keywords)}"
        seen.add(kernel)
        call(self, grid, *args, eager=eager, num_warps=num_warps, **meta)

    return checked


def test_gated_act_launches_name_their_kernels_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch.ops import gated_act as G

    seen: set[str] = set()
    monkeypatch.setattr(Launcher, "__call__", _checked_launch(seen))
    up = randn(3, 16, device=DEV)
    for gate in (randn(3, 16, device=DEV), randn(16, 3, device=DEV).t()):  # dense, and strided rows
        h = G.gated_act_fwd(gate, up, "silu", 0.5, eager=True)
        G.gated_act_bwd(h, gate, up, "silu", 0.5, with_h=True, eager=True)
        G.gated_act_bwd(h, gate, up, "silu", 0.5, eager=True)
    gate_up = randn(3, 32, device=DEV)
    h = G.gated_act_packed_fwd(gate_up, "gelu", eager=True)
    G.gated_act_packed_bwd(h, gate_up, "gelu", with_h=True, eager=True)
    assert seen == {"_gated_act_fwd_kernel", "_gated_act_bwd_kernel"}


@pytest.mark.parametrize("schedule", ["flat", "tile", "token"])
def test_rope_launches_name_their_kernels_parameters(monkeypatch: pytest.MonkeyPatch, schedule: str) -> None:
    from kernel_pytorch.ops.rope import rope_bwd, rope_fwd

    seen: set[str] = set()
    monkeypatch.setattr(Launcher, "__call__", _checked_launch(seen))
    q, k = randn(2, 4, 3, 16, device=DEV), randn(2, 2, 3, 16, device=DEV)
    cos, sin = randn(2, 3, 12, device=DEV), randn(2, 3, 12, device=DEV)  # partial rotary: 4 features pass
    table, pos = randn(8, 12, device=DEV), torch.tensor([[0, 5, 2]], device=DEV)
    with tuning.changed("rope", schedule=schedule):
        for interleaved in (False, True):
            qo, ko = rope_fwd(q, k, cos, sin, None, interleaved, eager=True)
            rope_bwd(qo, ko, table, table, pos, interleaved, inplace=True, eager=True)
    want = {"flat": "_rope_flat_kernel", "tile": "_rope_kernel", "token": "_rope_token_kernel"}[schedule]
    assert seen == {want}
