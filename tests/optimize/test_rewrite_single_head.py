"""optimize(rewrite="attention") on single-head attention, q, k, v of shape (B, T, D): run as one head of
our attention (and SDPA in the Inductor pass), validated on outputs and gradients, reported at the
q @ k^T line; with no mask, an additive (T, T) mask, or a causal mask (carried as is_causal=True). A 4-D
mask, which broadcasts the written output to 4-D, keeps the written code."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from kernel_pytorch.optimize import optimize
from tests.grid import device_under_test
from tests.optimize.rewrite_checks import close, marked_line, recording_pass, same_outputs_and_grads

DEV = device_under_test()
B, T, C = 2, 5, 8


class SingleHead(nn.Module):
    """`softmax(q @ k^T * s [+ mask]) @ v` on (B, T, C); `mask`: "none", "additive" (a (T, T) buffer),
    "causal" (full(-inf).triu(1) built), "fill" (a causal fill mask), "4d" (a (1, 1, T, T) buffer)."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.proj = nn.Linear(C, 3 * C)
        bias = -0.5 * torch.arange(T).float().flip(0).expand(T, T).contiguous()
        self.register_buffer("bias", bias.view(1, 1, T, T) if mask == "4d" else bias)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        q, k, v = self.proj(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) * C ** -0.5  # AT:qk
        if self.mask == "causal":
            att = att + torch.full((t, t), float("-inf"), device=x.device).triu(1)
        elif self.mask == "fill":
            att = att.masked_fill(~torch.tril(torch.ones((t, t), dtype=torch.bool, device=x.device)), float("-inf"))
        elif self.mask != "none":
            att = att + self.bias
        return att.softmax(-1) @ v


def _build(mask: str) -> nn.Module:
    torch.manual_seed(0)
    return SingleHead(mask).to(DEV)


def _x() -> tuple[Tensor]:
    return (torch.randn(B, T, C, device=DEV),)


@pytest.mark.parametrize("mask", ["none", "additive", "causal", "fill", "4d"])
def test_single_head_attention_rewritten(mask: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch import functional

    model, report = optimize(_build(mask), _x(), components=False, compile=False, rewrite="attention")
    (r,) = report.rewrites
    line = int(r.location.rsplit(":", 1)[1])
    assert report.passed and r.status == "applied" and line == marked_line(__file__, "qk")
    assert ("is_causal=True" in r.after) == (mask in ("causal", "fill"))
    calls: list[tuple[int, dict[str, object]]] = []
    attention = functional.attention
    monkeypatch.setattr(functional, "attention",
                        lambda q, *a, **kw: calls.append((q.dim(), kw)) or attention(q, *a, **kw))
    x = _x()
    y = model(*x)
    assert y.shape == ((1, B, T, C) if mask == "4d" else (B, T, C))
    same_outputs_and_grads(model, _build(mask), x)
    if mask == "4d":  # the written code, its output 4-D as written
        assert calls == []
    else:
        assert len(calls) == 2 and all(d == 4 and kw.get("is_causal", False) == (mask in ("causal", "fill"))
                                       for d, kw in calls)


@pytest.mark.parametrize("mask,causal", [("additive", False), ("causal", True)])
def test_single_head_attention_in_the_inductor_pass(mask: str, causal: bool) -> None:
    rewrite, pre_grad, seen = recording_pass("attention")
    torch._dynamo.reset()
    model = torch.compile(_build(mask), options={"pre_grad_custom_pass": pre_grad})
    x = _x()
    close(model(*x), _build(mask)(*x))
    same_outputs_and_grads(model, _build(mask), x)
    assert rewrite.counts == ({"attention": 1, "attention.causal": 1} if causal else {"attention": 1})
    assert not any("softmax" in t for t in seen)
