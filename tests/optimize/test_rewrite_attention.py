"""optimize(rewrite=...) on attention written out (`softmax(q @ k^T * scale + mask) @ v`) and on a linear
head called as a module into cross-entropy: found, replaced, validated (outputs and gradients), reported at
the analyser's line; near misses (a softmax over another dim, a learned scale, a finite fill value) left
alone; a fill mask proven causal carried as is_causal=True, and no other (an upper triangle, a tril buffer
with one entry changed); in the Inductor pass, the graph holds SDPA and our loss op. Additive causal masks:
test_rewrite_causal_add.py; one head written without its dim: test_rewrite_single_head.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.optimize import optimize
from tests.grid import device_under_test
from tests.optimize.rewrite_checks import close, marked_line, recording_pass, same_outputs_and_grads

DEV = device_under_test()
B, T, C, H, V = 2, 5, 16, 2, 24


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention written out: `* (1 / sqrt(hd))`, a lower-triangular buffer as a -inf fill mask,
    an nn.Dropout(0); `near` makes a near miss."""

    def __init__(self, near: str = "") -> None:
        super().__init__()
        self.near, self.hd = near, C // H
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_dropout = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.temperature = nn.Parameter(torch.tensor(0.3))

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(b, t, H, self.hd).transpose(1, 2) for z in (q, k, v))
        scale = self.temperature if self.near == "learned-scale" else 1.0 / math.sqrt(self.hd)
        att = (q @ k.transpose(-2, -1)) * scale  # AT:qk
        fill = -1e9 if self.near == "finite-fill" else float("-inf")
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, fill)
        att = F.softmax(att, dim=-2 if self.near == "softmax-dim" else -1)
        att = self.attn_dropout(att)
        y = att @ v
        return y.transpose(1, 2).contiguous().view(b, t, c)


class OtherSpellings(nn.Module):
    """`torch.matmul`, `/ math.sqrt(C)` (a scale carried as written, whatever it is), an additive float mask
    buffer, `.softmax(dim=-1)`; or a scale computed from a size, `* q.size(-1) ** -0.5` or `/
    math.sqrt(q.size(-1))`, with no mask."""

    def __init__(self, sized: str = "") -> None:
        super().__init__()
        self.sized = sized
        self.proj = nn.Linear(C, 3 * C, bias=False)
        self.register_buffer("alibi", -0.5 * torch.arange(T).float().flip(0).expand(T, T).contiguous())

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self.proj(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4).unbind(0)
        if self.sized == "pow":
            att = torch.matmul(q, k.transpose(-1, -2)) * q.size(-1) ** -0.5  # AT:sized
        elif self.sized == "sqrt":
            att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))  # AT:sqrt
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C) + self.alibi  # AT:div
        return torch.matmul(att.softmax(dim=-1), v).sum(1)


class LinearHead(nn.Module):
    """The common LM head: an nn.Linear called, its logits into cross-entropy."""

    def __init__(self, bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, C)
        self.lm_head = nn.Linear(C, V, bias=bias)

    def forward(self, ids: Tensor, labels: Tensor) -> Tensor:
        logits = self.lm_head(self.embed(ids))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))  # AT:head


def _build(cls: type[nn.Module], **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kw).to(DEV)


def _x() -> tuple[Tensor]:
    return (torch.randn(B, T, C, device=DEV),)


def _lm_inputs() -> tuple[Tensor, Tensor]:
    return torch.randint(0, V, (B, T), device=DEV), torch.randint(0, V, (B, T), device=DEV)




def _where(r: object) -> int:
    return int(r.location.rsplit(":", 1)[1])


def test_attention_rewritten_at_the_analysers_line() -> None:
    model, report = optimize(_build(CausalSelfAttention), _x(), components=False, compile=False,
                             rewrite="attention")
    (r,) = report.rewrites
    assert report.passed and (r.kind, r.status, _where(r)) == ("attention", "applied", _line("qk"))
    assert "attention" in r.after and "is_causal=True" in r.after
    same_outputs_and_grads(model, _build(CausalSelfAttention), _x())
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    findings = analyze_fusion(assistant.context(_build(CausalSelfAttention).cpu(), (_x()[0].cpu(),)))
    (finding,) = [f for f in findings if f.id == "fusion.attention"]
    assert finding.location.line == _line("qk") and "rewrite=True" in finding.suggestion


@pytest.mark.parametrize("sized", ["", "pow", "sqrt"], ids=["matmul-div-additive-mask", "size-pow", "size-sqrt"])
def test_attention_other_spellings(sized: str) -> None:
    model, report = optimize(_build(OtherSpellings, sized=sized), _x(), components=False, compile=False,
                             rewrite="attention")
    (r,) = report.rewrites
    marker = {"pow": "sized", "sqrt": "sqrt"}.get(sized, "div")
    assert report.passed and (r.status, _where(r)) == ("applied", _line(marker))
    same_outputs_and_grads(model, _build(OtherSpellings, sized=sized), _x())


@pytest.mark.parametrize("near", ["softmax-dim", "learned-scale", "finite-fill"])
def test_attention_near_misses_left_alone(near: str) -> None:
    model, report = optimize(_build(CausalSelfAttention, near=near), _x(), components=False, compile=False,
                             rewrite="attention")
    assert report.rewrites == [] and "forward" not in vars(model)


def test_attention_fully_masked_row_stays_nan() -> None:
    from kernel_pytorch.optimize.rewrite.attention import kp_attention_written

    q, k, v = (torch.randn(1, 1, 2, 4, device=DEV) for _ in range(3))
    fill = torch.tensor([[False, True], [True, True]], device=DEV)
    out = kp_attention_written(q, k, v, 2.0, fill, float("-inf"), "div", "fill")
    written = ((q @ k.transpose(-2, -1)) / 2.0).masked_fill(fill, float("-inf")).softmax(-1) @ v
    close(out[..., 0, :], written[..., 0, :])
    assert out[..., 1, :].isnan().all()


def test_attention_in_the_inductor_pass() -> None:
    rewrite, pre_grad, seen = recording_pass("attention")
    torch._dynamo.reset()
    model, original = _build(CausalSelfAttention).eval(), _build(CausalSelfAttention).eval()
    same_outputs_and_grads(torch.compile(model, options={"pre_grad_custom_pass": pre_grad}), original, _x())
    assert rewrite.counts == {"attention": 1, "attention.causal": 1} and not any("softmax" in t for t in seen)
    assert any("kp_attention_causal_op" in t for t in seen) and not any("eq" == t.split(".")[-1] for t in seen)


def test_linear_head_module_call_rewritten() -> None:
    inputs = _lm_inputs()
    model, report = optimize(_build(LinearHead), inputs, components=False, compile=False, rewrite="cross_entropy")
    (r,) = report.rewrites
    assert report.passed and (r.kind, r.status, _where(r)) == ("linear-cross-entropy", "applied", _line("head"))
    same_outputs_and_grads(model, _build(LinearHead), inputs)
    # a Linear with a bias is not our op's form: its call stays the module's
    model, report = optimize(_build(LinearHead, bias=True), inputs, components=False, compile=False,
                             rewrite="cross_entropy")
    assert report.rewrites == [] and "forward" not in vars(model)


def test_linear_head_module_call_in_the_inductor_pass() -> None:
    """Dynamo inlines the Linear as `linear(h, W, None)`: matched as `F.linear(h, W)`."""
    rewrite, pre_grad, _ = recording_pass("cross_entropy")
    torch._dynamo.reset()
    inputs = _lm_inputs()
    model = torch.compile(_build(LinearHead), options={"pre_grad_custom_pass": pre_grad})
    same_outputs_and_grads(model, _build(LinearHead), inputs)
    assert rewrite.counts == {"linear-cross-entropy": 1}


class MaskedAttention(nn.Module):
    """A fill mask of a buffer sliced [:t, :t] (`mask` the buffer: tril, triu, or tril with one entry changed;
    `== 0`) or built in the forward (`~torch.tril(torch.ones((t, t), dtype=torch.bool))`)."""

    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask
        self.proj = nn.Linear(C, 3 * C)
        buffer = torch.ones(T + 2, T + 2).triu() if mask == "triu" else torch.ones(T + 2, T + 2).tril()
        if mask == "tril-changed":
            buffer[T + 1, 0] = 0.0  # outside every [:t, :t] a call reads: the proof covers the whole buffer
        self.register_buffer("bias", buffer.view(1, 1, T + 2, T + 2))

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.proj(x).view(b, t, 3, H, C // H).permute(2, 0, 3, 1, 4).unbind(0)
        if self.mask == "built-sizes":  # Dynamo's spelling; torch.fx does not trace a size that is a proxy here
            m = ~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        elif self.mask == "built":
            m = ~torch.tril(torch.ones((t, t), dtype=torch.bool, device=x.device))  # torch.fx traces a size tuple
        else:
            m = self.bias[:, :, :t, :t] == 0
        att = (q @ k.transpose(-2, -1)).masked_fill(m, float("-inf"))
        return (att.softmax(-1) @ v).sum(1)


@pytest.mark.parametrize("mask,causal", [("tril", True), ("built", True), ("triu", False), ("tril-changed", False)])
def test_attention_causal_mask_only_where_proven(mask: str, causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch import functional

    model, report = optimize(_build(MaskedAttention, mask=mask), _x(), components=False, compile=False,
                             rewrite="attention")
    (r,) = report.rewrites
    assert report.passed and r.status == "applied" and ("is_causal=True" in r.after) == causal
    calls: list[dict[str, object]] = []
    attention = functional.attention
    monkeypatch.setattr(functional, "attention", lambda *a, **kw: calls.append(kw) or attention(*a, **kw))
    same_outputs_and_grads(model, _build(MaskedAttention, mask=mask), _x())
    shorter = (torch.randn(B, T - 2, C, device=DEV),)  # another length: the slice follows it
    close(model(*shorter), _build(MaskedAttention, mask=mask)(*shorter))
    assert len(calls) == 2 and all((c.get("is_causal", False), c.get("mask") is None) == (causal, causal)
                                   for c in calls)


def test_attention_causal_runs_the_dense_mask_off_the_square() -> None:
    from kernel_pytorch.optimize.rewrite.causal import kp_attention_causal

    q, k, v = (torch.randn(1, 2, n, 4, device=DEV) for n in (3, 4, 4))
    written = ((q @ k.transpose(-2, -1)) / 2.0).softmax(-1) @ v  # a [:1, :1] slice masks nothing
    close(kp_attention_causal(q, k, v, 2.0, 1, 6, 2, "div"), written)
    q = torch.randn(1, 2, 4, 4, device=DEV)
    causal = torch.ones(4, 4, dtype=torch.bool, device=DEV).triu(1)
    written = ((q @ k.transpose(-2, -1)) / 2.0).masked_fill(causal, float("-inf")).softmax(-1) @ v
    close(kp_attention_causal(q, k, v, 2.0, 4, 6, 2, "div"), written)


@pytest.mark.parametrize("mask,causal", [("built-sizes", True), ("tril-changed", False)])
def test_attention_causal_mask_in_the_inductor_pass(mask: str, causal: bool) -> None:
    rewrite, pre_grad, _ = recording_pass("attention")
    torch._dynamo.reset()
    model = torch.compile(_build(MaskedAttention, mask=mask), options={"pre_grad_custom_pass": pre_grad})
    same_outputs_and_grads(model, _build(MaskedAttention, mask=mask), _x())
    assert rewrite.counts == ({"attention": 1, "attention.causal": 1} if causal else {"attention": 1})
