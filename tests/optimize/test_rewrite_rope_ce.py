"""optimize(rewrite=...) on a rotate-half rotary embedding of q and k and on a linear head into
cross-entropy, written out: found, replaced by our ops, validated (outputs and gradients), reported at
the analyser's line; near misses (other half orders, cos/sin differing between q and k, other
reductions, class weights) left alone; compiled, the graph holds our registered ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.optimize import optimize
from tests.grid import device_under_test
from tests.optimize.rewrite_checks import marked_line, recording_pass, same_outputs_and_grads

DEV = device_under_test()
B, T, D, H, V = 2, 5, 32, 2, 40


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


def rotate_half(x: Tensor) -> Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def halves_swapped(x: Tensor) -> Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x1, x2), dim=-1)


def rotate_chunks(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


ROTATIONS = {"half": rotate_half, "swapped": halves_swapped, "chunk": rotate_chunks}


class Attention(nn.Module):
    """Attention with transformers' apply_rotary_pos_emb written inline; `rot` and `swap_k` make near misses,
    `rotary` < D/H a partial rotary width (transformers' form: the first features rotated, the rest passed)."""

    def __init__(self, rot: str = "half", swap_k: bool = False, rotary: int = D // H) -> None:
        super().__init__()
        self.rot, self.swap_k, self.hd, self.r = rot, swap_k, D // H, rotary
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, rotary, 2).float() / rotary), False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, self.hd).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        freqs = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        rot = ROTATIONS[self.rot]
        (q, q_pass), (k, k_pass) = (t.split([self.r, self.hd - self.r], dim=-1) for t in (q, k))
        q = (q * cos) + (rot(q) * sin)  # AT:rope-q
        if self.swap_k:
            k = (k * sin) + (rot(k) * cos)
        else:
            k = (k * cos) + (rot(k) * sin)
        q, k = torch.cat((q, q_pass), dim=-1), torch.cat((k, k_pass), dim=-1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(b, t, D)


class LMHeadLoss(nn.Module):
    """A tied LM head and its loss written out: `F.linear` or `@ W.T`, the views, the fp32 upcast."""

    def __init__(self, matmul: bool = False, **loss: object) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.norm = nn.RMSNorm(D)
        self.matmul, self.loss = matmul, loss

    def forward(self, ids: Tensor, labels: Tensor) -> Tensor:
        h = self.norm(self.embed(ids))
        if self.matmul:
            h = h.reshape(-1, D)
            return F.cross_entropy(h @ self.embed.weight.T, labels.reshape(-1), **self.loss)  # AT:ce-rows
        logits = F.linear(h, self.embed.weight).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), **self.loss)  # AT:ce-view


def _attention_inputs() -> tuple[Tensor]:
    return (torch.randn(B, T, D, device=DEV),)


def _lm_inputs() -> tuple[Tensor, Tensor]:
    ids = torch.randint(0, V, (B, T), device=DEV)
    labels = torch.randint(0, V, (B, T), device=DEV)
    labels[0, :2] = -1  # ignored tokens, with ignore_index=-1
    return ids, labels


def _build(cls: type[nn.Module], **kw: object) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kw).to(DEV)




def _where(r: object) -> int:
    return int(r.location.rsplit(":", 1)[1])


@pytest.mark.parametrize("kw", [{"rot": "chunk"}, {"rotary": 8}], ids=["chunk", "partial-rotary"])
def test_rope_other_spellings(kw: dict) -> None:
    """`chunk(2, dim=-1)` halves; a partial width's rotated slice (the rest passes through as written)."""
    inputs = _attention_inputs()
    model, report = optimize(_build(Attention, **kw), inputs, components=False, compile=False, rewrite="rope")
    (r,) = report.rewrites
    assert report.passed and (r.kind, r.status, _where(r)) == ("rope", "applied", _line("rope-q"))
    same_outputs_and_grads(model, _build(Attention, **kw), inputs)


def test_rope_of_q_and_k_rewritten_at_the_analysers_line() -> None:
    inputs = _attention_inputs()
    model, report = optimize(_build(Attention), inputs, components=False, compile=False, rewrite="rope")
    (r,) = report.rewrites
    assert report.passed and (r.kind, r.status, _where(r)) == ("rope", "applied", _line("rope-q"))
    assert r.location.startswith(__file__) and "apply_rotary" in r.after
    same_outputs_and_grads(model, _build(Attention), inputs)
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    findings = analyze_fusion(assistant.context(_build(Attention).cpu(), (inputs[0].cpu(),)))
    (finding,) = [f for f in findings if f.id == "fusion.rope"]
    lines = {loc.line for loc in (finding.location, *finding.more_locations) if loc is not None}
    assert _line("rope-q") in lines and "rewrite=True" in finding.suggestion


@pytest.mark.parametrize("kw", [{"rot": "swapped"}, {"swap_k": True}], ids=["half-order", "sin-cos-of-k"])
def test_rope_near_misses_left_alone(kw: dict) -> None:
    model, report = optimize(_build(Attention, **kw), _attention_inputs(), components=False, compile=False,
                             rewrite="rope")
    assert report.rewrites == [] and "forward" not in vars(model)


def test_rope_bf16_is_the_written_rounding() -> None:
    """hf_rounding: each product and the sum in q's dtype, as written, so bf16 agrees bitwise."""
    from kernel_pytorch.optimize.rewrite.rope import kp_rotate_half_rope

    torch.manual_seed(0)
    q, k = (torch.randn(B, H, T, 16, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = (torch.randn(1, T, 16, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    qo, ko = kp_rotate_half_rope(q, k, cos, sin, 1)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    assert torch.equal(qo, q * c + rotate_half(q) * s) and torch.equal(ko, k * c + rotate_half(k) * s)


def test_rope_in_the_inductor_pass() -> None:
    """Dynamo folds `x.shape[-1] // 2`: the literal split is proven by the example shapes there."""
    rewrite, pre_grad, seen = recording_pass("rope")
    torch._dynamo.reset()
    inputs = _attention_inputs()
    model, original = _build(Attention), _build(Attention)
    same_outputs_and_grads(torch.compile(model, options={"pre_grad_custom_pass": pre_grad}), original, inputs)
    assert rewrite.counts == {"rope": 1} and any("kernel_pytorch.rope_fwd" in t for t in seen)
    assert not any(t.endswith("cat") for t in seen)


@pytest.mark.parametrize("matmul,loss", [
    (False, {"ignore_index": -1, "label_smoothing": 0.1}),
    (True, {"ignore_index": -1, "reduction": "sum"}),
], ids=["linear-view-float-smoothing", "matmul-rows-sum"])
def test_linear_cross_entropy_rewritten(matmul: bool, loss: dict) -> None:
    inputs = _lm_inputs()
    model, report = optimize(_build(LMHeadLoss, matmul=matmul, **loss), inputs, components=False, compile=False,
                             rewrite="cross_entropy")
    (r,) = report.rewrites
    where = _line("ce-rows" if matmul else "ce-view")
    assert report.passed and (r.kind, r.status, _where(r)) == ("linear-cross-entropy", "applied", where)
    same_outputs_and_grads(model, _build(LMHeadLoss, matmul=matmul, **loss), inputs)


@pytest.mark.parametrize("loss", [
    {"ignore_index": -1, "reduction": "none"},
    {"ignore_index": -1, "weight": torch.rand(V)},
], ids=["reduction-none", "class-weights"])
def test_linear_cross_entropy_options_we_do_not_take_left_alone(loss: dict) -> None:
    loss = {k: v.to(DEV) if isinstance(v, Tensor) else v for k, v in loss.items()}
    model, report = optimize(_build(LMHeadLoss, **loss), _lm_inputs(), components=False, compile=False,
                             rewrite="cross_entropy")
    assert report.rewrites == [] and "forward" not in vars(model)


def test_linear_cross_entropy_compiled_after_optimize_holds_our_op() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    inputs = _lm_inputs()
    loss = {"ignore_index": -1}
    model, _ = optimize(_build(LMHeadLoss, **loss), inputs, components=False, compile=False, rewrite=True)
    same_outputs_and_grads(torch.compile(model, backend=backend), _build(LMHeadLoss, **loss), inputs)
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("kernel_pytorch.fused_linear_cross_entropy_fwd" in t for t in targets)
    assert not any("cross_entropy" in t and "kernel_pytorch" not in t for t in targets)


@pytest.mark.parametrize("matmul", [False, True], ids=["linear-view-float", "matmul-rows"])
def test_linear_cross_entropy_in_the_inductor_pass(matmul: bool) -> None:
    """Dynamo keeps only the keywords written and folds `logits.size(-1)`: the pass writes the keywords
    out and the example shapes prove the literal row width."""
    rewrite, pre_grad, seen = recording_pass("cross_entropy")
    torch._dynamo.reset()
    inputs = _lm_inputs()
    loss = {"ignore_index": -1, "label_smoothing": 0.05}
    model, original = _build(LMHeadLoss, matmul=matmul, **loss), _build(LMHeadLoss, matmul=matmul, **loss)
    same_outputs_and_grads(torch.compile(model, options={"pre_grad_custom_pass": pre_grad}), original, inputs)
    assert rewrite.counts == {"linear-cross-entropy": 1}
    assert not any(t.endswith("cross_entropy") for t in seen)
