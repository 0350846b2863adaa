"""optimize(rewrite="attention") on an additive causal mask (0 on and below the diagonal, -inf above): a
buffer sliced [:t, :t] whose whole square is that mask, or `torch.full((t, t), -inf).triu(1)` built in the
forward (or `torch.ones((t, t)) * -inf` under the triu), carried as is_causal=True with no mask, reported at
the q @ k^T line; any other additive mask (a finite entry, a -1e9 fill, another diagonal, the lower
triangle) stays the dense mask it is."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from kernel_pytorch.optimize import optimize
from tests.grid import device_under_test
from tests.optimize.rewrite_checks import close, marked_line, recording_pass, same_outputs_and_grads

DEV = device_under_test()
B, T, C, H = 2, 5, 16, 2
CAUSAL = ("buffer", "built", "torch-triu", "ones-times-inf")
DENSE = ("finite-entry", "finite-fill", "shifted", "lower")


class AdditiveMask(nn.Module):
    """Attention with an additive mask named by `mask` (CAUSAL ones are causal, DENSE ones not)."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.proj = nn.Linear(C, 3 * C)
        buffer = torch.full((T + 2, T + 2), float("-inf")).triu(1)
        if mask == "finite-entry":
            buffer[T + 1, 0] = -1.0  # outside every [:t, :t] a call reads: the proof covers the whole buffer
        self.register_buffer("bias", buffer.view(1, 1, T + 2, T + 2))

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.proj(x).view(b, t, 3, H, C // H).permute(2, 0, 3, 1, 4).unbind(0)
        full = torch.full((t, t), float("-inf"), device=x.device)
        if self.mask == "built":
            m = full.triu(1)
        elif self.mask == "torch-triu":
            m = torch.triu(full, diagonal=1)
        elif self.mask == "ones-times-inf":
            m = torch.triu(torch.ones((t, t), device=x.device) * float("-inf"), diagonal=1)
        elif self.mask == "finite-fill":
            m = torch.full((t, t), -1e9, device=x.device).triu(1)
        elif self.mask == "shifted":
            m = full.triu(2)
        elif self.mask == "lower":
            m = full.tril(-1)
        else:
            m = self.bias[:, :, :t, :t]
        att = q @ k.transpose(-2, -1) * 0.5  # AT:qk
        return ((att + m).softmax(-1) @ v).sum(1)


def _build(mask: str) -> nn.Module:
    torch.manual_seed(0)
    return AdditiveMask(mask).to(DEV)


def _x(t: int = T) -> tuple[Tensor]:
    return (torch.randn(B, t, C, device=DEV),)


@pytest.mark.parametrize("mask", CAUSAL + DENSE)
def test_additive_causal_mask_only_where_proven(mask: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch import functional

    causal = mask in CAUSAL
    model, report = optimize(_build(mask), _x(), components=False, compile=False, rewrite="attention")
    (r,) = report.rewrites
    assert report.passed and r.status == "applied" and ("is_causal=True" in r.after) == causal
    assert int(r.location.rsplit(":", 1)[1]) == marked_line(__file__, "qk")
    calls: list[dict[str, object]] = []
    attention = functional.attention
    monkeypatch.setattr(functional, "attention", lambda *a, **kw: calls.append(kw) or attention(*a, **kw))
    same_outputs_and_grads(model, _build(mask), _x())
    shorter = _x(T - 2)  # another length: the mask follows it
    close(model(*shorter), _build(mask)(*shorter))
    assert len(calls) == 2 and all((c.get("is_causal", False), c.get("mask") is None) == (causal, causal)
                                   for c in calls)


def test_additive_causal_runs_the_dense_mask_off_the_square_or_dtype() -> None:
    from kernel_pytorch.optimize.rewrite.causal import kp_attention_causal

    q, k, v = (torch.randn(1, 2, n, 4, device=DEV) for n in (3, 4, 4))
    written = ((q @ k.transpose(-2, -1)) * 0.5).softmax(-1) @ v  # a [:1, :1] slice masks nothing
    close(kp_attention_causal(q, k, v, 0.5, 1, 6, 2, "mul", torch.float32), written)
    q, k, v = (torch.randn(1, 2, 4, 4, device=DEV, dtype=torch.float64) for _ in range(3))
    mask = torch.full((4, 4), float("-inf"), device=DEV).triu(1)  # fp32: the sum is promoted to fp64
    written = ((q @ k.transpose(-2, -1)) * 0.5 + mask).softmax(-1) @ v
    out = kp_attention_causal(q, k, v, 0.5, 4, None, 0, "mul", torch.float32)
    assert out.dtype == written.dtype
    close(out, written)


@pytest.mark.parametrize("mask,causal", [("buffer", True), ("built", True), ("finite-entry", False)])
def test_additive_causal_mask_in_the_inductor_pass(mask: str, causal: bool) -> None:
    rewrite, pre_grad, seen = recording_pass("attention")
    torch._dynamo.reset()
    model = torch.compile(_build(mask), options={"pre_grad_custom_pass": pre_grad})
    same_outputs_and_grads(model, _build(mask), _x())
    assert rewrite.counts == ({"attention": 1, "attention.causal": 1} if causal else {"attention": 1})
    assert any("kp_attention_causal_op" in t for t in seen) == causal
