"""optimize(rewrite=...): hand-written RMSNorms and gated activations in KernelBench-style problems
(`Model` + `get_inputs`) are found, replaced by our ops, validated (outputs and gradients) and reported
at the line the analyser's finding names; a failing rewrite is reverted alone; a model without the
patterns is untouched; compiled, the rewritten model's graph holds our registered ops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rewrite import FAMILIES, patterns_of
from tests.grid import device_under_test
from tests.optimize.rewrite_checks import close, marked_line, recording_pass

DEV = device_under_test()
B, T, D, I = 2, 5, 32, 48  # noqa: E741 (the intermediate size's usual name)


def _line(marker: str) -> int:
    return marked_line(__file__, marker)


class LlamaStyleNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm, written out: fp32 statistics, rounded back before the weight."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)  # AT:llama-norm
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class SwiGLUMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, I, bias=False), nn.Linear(D, I, bias=False)
        self.down_proj = nn.Linear(I, D, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))  # AT:swiglu


class Model(nn.Module):
    """Two pre-norm MLP blocks and a final norm written in the model's own forward (KernelBench's level-2
    style: the pattern in the problem's forward), after the last residual add (the residual form), with
    the other spellings: `x * x`, a mean over `dim=-1`, `/ sqrt`, the weight on the right, no casts."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList(LlamaStyleNorm() for _ in range(2))
        self.mlps = nn.ModuleList(SwiGLUMLP() for _ in range(2))
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(D))
        self.eps = 1e-5

    def forward(self, x: Tensor) -> Tensor:
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))  # AT:residual
        ms = (x * x).mean(dim=-1, keepdim=True)  # AT:plain-norm
        return x / torch.sqrt(ms + self.eps) * self.weight


class GeGLUModel(nn.Module):
    """gelu(gate, tanh) * up, the activation on the right of the multiply."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, 2 * I)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.proj(x).chunk(2, dim=-1)
        return up * F.gelu(gate, approximate="tanh")  # AT:geglu


class Broadcast(nn.Module):
    """An RMSNorm, then `silu(x) * scale` with a (D,) scale: the gated spelling, but no gated activation
    (our op takes gate and up of one shape), so that rewrite fails validation and is reverted alone."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = LlamaStyleNorm()
        self.scale = nn.Parameter(torch.randn(D))

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(self.norm(x)) * self.scale  # AT:broadcast


class GemmAddReLU(nn.Module):
    """KernelBench level-2 style: a GEMM, a bias added apart, an activation; and a residual ReLU of two
    activations, which is no bias add and stays."""

    def __init__(self) -> None:
        super().__init__()
        self.gemm = nn.Linear(D, D, bias=False)
        self.bias = nn.Parameter(torch.randn(D))

    def forward(self, x: Tensor) -> Tensor:
        y = self.gemm(x)
        y = y + self.bias
        y = torch.relu(y)  # AT:bias-relu
        return F.gelu(y + x)


class NoPattern(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, I), nn.Linear(I, D)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.relu(self.fc1(x))).mean(-1, keepdim=True) * x


def get_inputs() -> list[Tensor]:
    return [torch.randn(B, T, D, device=DEV)]


def _build(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls().to(DEV)


def _optimize(model: nn.Module, rewrite: object = True) -> tuple[nn.Module, kp.optimize.OptimizeReport]:
    return optimize(model, tuple(get_inputs()), components=False, compile=False, rewrite=rewrite)



@pytest.fixture(scope="module")
def rewritten() -> dict:
    model = _build(Model)
    original = _build(Model)
    out, report = _optimize(model)
    return {"model": out, "original": original, "report": report}


def test_patterns_found_rewritten_and_reported_at_their_lines(rewritten: dict) -> None:
    report = rewritten["report"]
    assert report.passed and report.validated
    got = sorted((r.kind, r.path, int(r.location.rsplit(":", 1)[1])) for r in report.rewrites)
    assert got == sorted([
        ("rms-norm", "norms.0", _line("llama-norm")), ("rms-norm", "norms.1", _line("llama-norm")),
        ("gated-act", "mlps.0", _line("swiglu")), ("gated-act", "mlps.1", _line("swiglu")),
        ("residual-norm", "", _line("residual")),
    ])
    assert all(r.status == "applied" and r.location.startswith(__file__) for r in report.rewrites)
    text = str(report)
    assert f"rewrite [residual-norm] {__file__}:{_line('residual')}" in text and "5 rewrites kept" in text
    assert report.to_dict()["rewrites"][0]["status"] == "applied"
    # the classes are untouched: the instances hold the rewritten forwards
    model = rewritten["model"]
    assert "forward" in vars(model) and "forward" in vars(model.norms[0])
    assert type(model) is Model and Model.forward.__qualname__ == "Model.forward"
    assert "forward" not in vars(LlamaStyleNorm()) and LlamaStyleNorm().forward.__func__ is LlamaStyleNorm.forward


def test_rewritten_model_matches_outputs_and_gradients(rewritten: dict) -> None:
    model, original = rewritten["model"], rewritten["original"]
    x = get_inputs()[0]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = model(xa), original(xb)
    close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    close(xa.grad, xb.grad)
    for (name, pa), (_, pb) in zip(model.named_parameters(), original.named_parameters()):
        assert pa.grad is not None, name
        close(pa.grad, pb.grad)


def test_analyser_names_the_same_lines(rewritten: dict) -> None:
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    model = _build(Model).cpu()
    findings = analyze_fusion(assistant.context(model, (torch.randn(B, T, D),)))
    kinds = ("fusion.rms-norm", "fusion.gated-act", "fusion.residual-norm")
    found = {(f.id.removeprefix("fusion."), loc.line) for f in findings if f.id in kinds
             for loc in (f.location, *f.more_locations) if loc is not None and loc.file == __file__}
    rewritten_lines = {(r.kind, int(r.location.rsplit(":", 1)[1])) for r in rewritten["report"].rewrites}
    assert rewritten_lines <= found
    # the final norm: one rewrite of the add and the norm, at the add's line, where the analyser names both
    assert {("rms-norm", _line("plain-norm")), ("residual-norm", _line("residual"))} <= found
    assert ("rms-norm", _line("plain-norm")) not in rewritten_lines


def test_compiled_graph_holds_our_ops(rewritten: dict) -> None:
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = rewritten["model"]
    x = get_inputs()[0]
    close(torch.compile(model, backend=backend)(x), rewritten["original"](x))
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("kernel_pytorch.rms_norm_fwd" in t for t in targets)
    assert any("kernel_pytorch.add_rms_norm_fwd" in t for t in targets)
    assert any("kernel_pytorch.gated_act_fwd" in t for t in targets)
    assert not any(t.endswith("rsqrt") for t in targets)


def test_other_spellings_geglu() -> None:
    model, report = _optimize(_build(GeGLUModel))
    (r,) = report.rewrites
    assert (r.kind, r.status, int(r.location.rsplit(":", 1)[1])) == ("gated-act", "applied", _line("geglu"))
    assert "gelu_tanh" in r.after and report.passed


def test_bias_activation_rewritten_residual_left() -> None:
    model, report = _optimize(_build(GemmAddReLU))
    (r,) = report.rewrites
    assert (r.kind, r.status, int(r.location.rsplit(":", 1)[1])) == ("bias-act", "applied", _line("bias-relu"))
    assert "bias_act(activation='relu')" in r.after and report.passed
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    findings = analyze_fusion(assistant.context(_build(GemmAddReLU).cpu(), (torch.randn(B, T, D),)))
    assert [(f.id, f.location.line) for f in findings] == [("fusion.bias-act", _line("bias-relu"))]


def test_failing_rewrite_reverted_alone_with_its_reason() -> None:
    model, report = _optimize(_build(Broadcast))
    by_kind = {r.kind: r for r in report.rewrites}
    assert by_kind["rms-norm"].status == "applied" and by_kind["rms-norm"].path == "norm"
    bad = by_kind["gated-act"]
    assert bad.status == "reverted" and bad.location.endswith(f":{_line('broadcast')}")
    assert "shape" in bad.detail and "failed validation" in bad.detail
    assert report.passed and "REVERTED rewrite [gated-act]" in str(report)
    assert "forward" not in vars(model) and "forward" in vars(model.norm)


def test_model_without_patterns_untouched() -> None:
    model = _build(NoPattern)
    out, report = _optimize(model)
    assert out is model and report.rewrites == []
    assert all("forward" not in vars(m) for m in model.modules())


class TrainOnly(nn.Module):
    """A forward that reads `self.training`: a traced forward would freeze one branch."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = LlamaStyleNorm()

    def forward(self, x: Tensor) -> Tensor:
        x = F.dropout(x, 0.1, self.training)
        v = x.pow(2).mean(-1, keepdim=True)
        return self.norm.weight * (x * torch.rsqrt(v + 1e-6))


class MakesConstant(nn.Module):
    """A forward making a tensor: the trace would keep it as a constant of the module."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x: Tensor) -> Tensor:
        x = x * torch.tensor(2.0)  # a 0-dim CPU tensor multiplies x on any device
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_forwards_that_cannot_be_frozen_are_left_alone() -> None:
    model, report = _optimize(_build(MakesConstant))
    assert report.rewrites == [] and set(vars(model)) == set(vars(_build(MakesConstant)))
    assert any("makes a tensor constant" in n for n in report.notes)
    model, report = _optimize(_build(TrainOnly).eval())
    # the child norm is rewritten; the model's own forward differs between train() and eval()
    assert [(r.kind, r.path) for r in report.rewrites] == [("rms-norm", "norm")]
    assert any("differs between train() and eval()" in n for n in report.notes) and "forward" not in vars(model)
    wrapped = _build(Model)
    own = wrapped.norms[0].forward
    wrapped.norms[0].forward = lambda x: own(x)  # a hook library's wrapper on the instance
    wrapped, report = _optimize(wrapped)
    assert "norms.0" not in {r.path for r in report.rewrites} and report.passed
    assert callable(vars(wrapped.norms[0])["forward"]) and vars(wrapped.norms[0])["forward"].__name__ == "<lambda>"


def test_default_changes_nothing_and_families_select() -> None:
    model, report = _optimize(_build(Model), rewrite=False)
    assert report.rewrites == [] and all("forward" not in vars(m) for m in model.modules())
    model, report = _optimize(_build(Model), rewrite="activation")
    assert {r.kind for r in report.rewrites} == {"gated-act"}
    assert {p.family for p in patterns_of(True)} == set(FAMILIES)
    with pytest.raises(ValueError, match="rewrite: unknown family 'flash'"):
        _optimize(_build(Model), rewrite=["flash"])


@pytest.mark.parametrize("kind", ["rms-norm", "gated-act", "bias-act"])
def test_analyser_fix_says_rewrite_and_runs(kind: str) -> None:
    from tests.assistant import fusion_zoo as zoo

    cls = zoo.PATTERNS[kind]
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    (finding,) = analyze_fusion(assistant.context(cls(), zoo.inputs(cls.__name__)))
    assert "kernel_pytorch.optimize(model, inputs, rewrite=True)" in finding.suggestion
    torch.manual_seed(0)
    model, inputs = cls().to(DEV), tuple(t.to(DEV) for t in zoo.inputs(cls.__name__))
    model, report = kp.optimize(model, inputs, rewrite=True, compile=False)  # the call the fix shows
    (r,) = report.rewrites
    assert report.passed and (r.kind, r.status) == (kind, "applied")
    assert r.location == str(finding.location)


def test_inductor_pass_puts_our_ops_in_the_compiled_graph() -> None:
    """A model compiled without optimize(): the pre-grad pass rewrites Dynamo's graph to our ops (which
    AOT autograd then traces through: their CPU bodies here, their Triton kernels on CUDA); forward and
    backward match eager."""
    rewrite, pre_grad, rewritten = recording_pass()
    torch._dynamo.reset()
    model, original = _build(Model), _build(Model)
    x = get_inputs()[0]
    y = torch.compile(model, options={"pre_grad_custom_pass": pre_grad})(x)
    expected = original(x)
    close(y, expected)
    y.sum().backward()
    expected.sum().backward()
    for (name, pa), (_, pb) in zip(model.named_parameters(), original.named_parameters()):
        assert pa.grad is not None, name
        close(pa.grad, pb.grad)
    # whole-model graph: the second and the final norm follow a residual add
    assert rewrite.counts == {"rms-norm": 1, "residual-norm": 2, "gated-act": 2}
    assert any("kernel_pytorch.rms_norm_fwd" in t for t in rewritten)
    assert any("kernel_pytorch.add_rms_norm_fwd" in t for t in rewritten)
    assert any("kernel_pytorch.gated_act_fwd" in t for t in rewritten)
    assert not any(t.endswith(("rsqrt", "sqrt", "silu")) for t in rewritten)


def test_hugging_face_llama_norms_and_mlp_rewritten_in_place() -> None:
    """Without the module rules, the rewrites alone reach transformers' LlamaRMSNorm and LlamaMLP (its
    ACT2FN SiLU module traced into), at the lines of modeling_llama.py, validated with the loss."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    llama = transformers.LlamaForCausalLM(config).to(DEV).eval()
    ids = torch.randint(0, 64, (2, 6), device=DEV)
    llama, report = optimize(llama, {"input_ids": ids, "labels": ids}, components=False, compile=False,
                             rewrite=True)
    assert report.passed and report.changes == []
    kinds = sorted((r.kind, r.path) for r in report.rewrites if r.status == "applied")
    assert kinds == [("gated-act", "model.layers.0.mlp"), ("rms-norm", "model.layers.0.input_layernorm"),
                     ("rms-norm", "model.layers.0.post_attention_layernorm"), ("rms-norm", "model.norm")]
    assert all("modeling_llama.py:" in r.location for r in report.rewrites)
