"""Does Inductor write a backward op's declared mutations over saved activations, or clone them first?

A toy gated activation whose backward op (`probe::act_bwd_`) declares gate and up mutated and writes
d_gate, d_up over them (as the eager gated MLP does over buffers it owns); the autograd backward returns
the mutated tensors as the gradients. Compiled training step; prints whether the gradients match the
composed eager block and, from the generated backward, the lines that allocate buffers and call the op
(an in-place write shows the op handed the saved mm outputs, with no clone or copy_ beside it).

Usage:
    TORCH_LOGS=output_code python3 benchmarks/probes/probe_reinplace.py [cuda] 2>&1 \
        | grep -E "act_bwd_|empty_strided|clone|match"
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.library.custom_op("probe::act_bwd_", mutates_args=("g", "u"))
def act_bwd_(dh: Tensor, g: Tensor, u: Tensor) -> None:
    """d_gate, d_up of silu(g) * u for the upstream dh, written over g and u."""
    s = torch.sigmoid(g)
    du = dh * g * s
    dg = dh * u * (s * (1 + g * (1 - s)))
    g.copy_(dg)
    u.copy_(du)


@torch.library.custom_op("probe::act_fwd", mutates_args=())
def act_fwd(g: Tensor, u: Tensor) -> Tensor:
    return F.silu(g) * u


@act_fwd.register_fake
def _(g: Tensor, u: Tensor) -> Tensor:
    return torch.empty_like(g)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, dh: Tensor) -> tuple[Tensor, Tensor]:
    g, u = ctx.saved_tensors
    act_bwd_(dh, g, u)
    return g, u


act_fwd.register_autograd(_backward, setup_context=_setup)


class Block(torch.nn.Module):
    """down(act(gate(x)) * up(x)), x (N, 64) -> (N, 64)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(64, 256, bias=False)
        self.up = torch.nn.Linear(64, 256, bias=False)
        self.down = torch.nn.Linear(256, 64, bias=False)

    def forward(self, x: Tensor, composed: bool = False) -> Tensor:
        g, u = self.gate(x), self.up(x)
        return self.down(F.silu(g) * u if composed else act_fwd(g, u))


def main() -> None:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    torch.manual_seed(0)
    block = Block().to(device)
    x = torch.randn(128, 64, device=device, requires_grad=True)
    torch.compile(block)(x).sum().backward()
    grads = [x.grad] + [p.grad for p in block.parameters()]
    x.grad = None
    block.zero_grad()
    block(x, composed=True).sum().backward()
    ok = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, [x.grad] + [p.grad for p in block.parameters()]))
    print(f"compiled gradients match the composed eager block: {ok}")


if __name__ == "__main__":
    main()
