"""Fusion opportunities: each pattern found at its line with its cost, none on already-fused paths,
and the patterns of transformers' own Llama (RMSNorm, SwiGLU MLP, rotate-half RoPE, repeat_kv)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.assistant.components import COMPONENTS, component
from kernel_pytorch.assistant.dynamo import module_path
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.assistant.fusion.graph import GraphView
from kernel_pytorch.assistant.fusion.patterns import find_all
from kernel_pytorch.models import build_model
from tests.assistant import fusion_zoo as zoo


def _fusion(model: torch.nn.Module, inputs: object) -> list:
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False), device="cpu")
    return analyze_fusion(assistant.context(model, inputs))


@pytest.mark.parametrize("kind", list(zoo.PATTERNS))
def test_pattern_found_at_its_line(kind: str) -> None:
    cls = zoo.PATTERNS[kind]
    findings = _fusion(cls(), zoo.inputs(cls.__name__))
    assert [f.id for f in findings] == [f"fusion.{kind}"]
    (f,) = findings
    assert f.location is not None and f.location.file == zoo.__file__ and f.location.line == zoo.line_of(kind)
    d = f.data
    assert d["ops"] >= 1 and d["bytes_today"] > 0 and 0 < d["bytes_saved"] <= d["bytes_today"] + d["bytes_saved"]
    assert d["seconds_saved"] > 0 and d["measured"] is False
    assert d["component"] in COMPONENTS and f.suggestion and "estimated" in (f.estimated_gain or "")
    assert d["modules"] == [""]  # the model itself


def test_already_fused_paths_give_no_finding() -> None:
    assert _fusion(zoo.AlreadyFused(), zoo.inputs("AlreadyFused")) == []


def test_loop_counts_iterations_and_rms_cost() -> None:
    (loop,) = _fusion(zoo.LoopAttention(), zoo.inputs("LoopAttention"))
    assert loop.data["count"] == 6 and "6 iterations" in loop.title
    (rms,) = _fusion(zoo.HandRMSNorm(), zoo.inputs("HandRMSNorm"))
    # x (2, 8, 32) fp32 = 2 KiB: the fused kernel reads x and the weight and writes y once
    assert rms.data["bytes_today"] - rms.data["bytes_saved"] == 2 * 2048 + 32 * 4
    assert rms.data["kernels"] == 6 and rms.data["kernels_saved"] == 5
    assert rms.data["details"]["eps"] == 1e-6 and "eps=1e-06" in rms.suggestion


def test_rms_norm_fix_fits_where_the_norm_is_written() -> None:
    """A norm module (HandRMSNorm) is replaced by ours; a norm written inside a bigger module's forward is
    computed there with F.rms_norm or a child norm, not "replace each Block"."""
    (module,) = _fusion(zoo.HandRMSNorm(), zoo.inputs("HandRMSNorm"))
    assert "Replace each `HandRMSNorm`" in module.suggestion

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(32))
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            return self.proj(h)

    (inline,) = [f for f in _fusion(Block(), (torch.randn(2, 8, 32),)) if f.id == "fusion.rms-norm"]
    assert "In `Block.forward`" in inline.suggestion and "rms_norm(x, (32,), weight, eps=1e-06)" in inline.suggestion
    assert "Replace each" not in inline.suggestion


def test_components_in_development_say_so() -> None:
    assert component("rms_norm").available and "`kp.nn.RMSNorm`" in component("rms_norm").named()
    for key in ("gated_mlp", "rope", "attention", "linear_cross_entropy"):
        c = component(key)
        assert c.available or "(in development)" in c.named()
        assert c.available == (c.named().startswith("`"))


def test_builtin_llama_patterns_and_no_false_positive_after_swap() -> None:
    model, inputs = build_model("llama-tiny", device="cpu", dtype=torch.float32)
    kinds = {f.id for f in _fusion(model, inputs)}
    assert {"fusion.rms-norm", "fusion.gated-act", "fusion.rope", "fusion.gqa-repeat"} <= kinds
    graphs = [g for g in kp.CompilerOptimizationAssistant(device="cpu").context(model, inputs).trace.graphs]
    assert not any(m.kind == "attention" for g in graphs for m in find_all(GraphView(g)))  # it uses SDPA


def test_transformers_llama() -> None:
    transformers = pytest.importorskip("transformers")
    from tests.assistant.real_models import _DECODER, _eval, _lm_inputs

    for impl in ("sdpa", "eager"):
        config = transformers.LlamaConfig(**{**_DECODER, "num_hidden_layers": 1}, attn_implementation=impl)
        findings = _fusion(_eval(transformers.LlamaForCausalLM(config)), _lm_inputs())
        by = {f.id: f for f in findings}
        assert {"fusion.rms-norm", "fusion.gated-act", "fusion.rope", "fusion.gqa-repeat"} <= set(by), impl
        assert by["fusion.rms-norm"].data["module_type"] == "LlamaRMSNorm"
        assert by["fusion.rms-norm"].data["modules"][0] == "model.layers.0.input_layernorm"
        assert by["fusion.gated-act"].location.file.endswith("modeling_llama.py")
        assert ("fusion.attention" in by) == (impl == "eager"), impl


@pytest.mark.parametrize(("dynamo", "named"), [
    ("L['self'].model.layers[0].input_layernorm", "model.layers.0.input_layernorm"),
    ("L['self']._modules['mlp']", "mlp"),
    ("L['args'][0].model.layers[0].mlp", "model.layers.0.mlp"),  # a forward behind a (*args, **kwargs) wrapper
    ("L['self']", ""),
])
def test_module_paths_read_as_named_modules_names_them(dynamo: str, named: str) -> None:
    assert module_path(dynamo) == named


def _llama(source: str) -> tuple[torch.nn.Module, object]:
    """A two-layer Llama: kernel_pytorch's built-in one, or transformers' own code."""
    if source == "llama-tiny":
        return build_model(source, device="cpu", dtype=torch.float32)
    pytest.importorskip("transformers")
    from tests.assistant.real_models import llama

    return llama()


@pytest.mark.parametrize("source", ["llama-tiny", "transformers"])
def test_one_finding_per_cause_with_every_line(source: str) -> None:
    """RoPE on q and on k, the two residual adds of a decoder layer: one finding each, at every line."""
    findings = _fusion(*_llama(source))
    ids = [f.id for f in findings]
    assert len(ids) == len(set(ids)), ids  # every pattern of a Llama has one cause
    by = {f.id: f for f in findings}
    # the built-in Llama's decoder layer is the shared pre-norm block of kernel_pytorch.models
    layer_forward = "PreNormBlock.forward" if source == "llama-tiny" else "LlamaDecoderLayer.forward"
    for kind, function, layer in (
        ("rope", "apply_rotary_pos_emb", "model.layers.{}.self_attn"),
        ("residual-norm", layer_forward, "model.layers.{}"),
    ):
        f = by[f"fusion.{kind}"]
        assert f.location == f.locations[0] and len({loc.line for loc in f.locations}) >= 2, kind
        assert f.to_dict()["locations"] == [loc.to_dict() for loc in f.locations]
        assert f"in `{function}`" in f.title and f.data["function"] == function
        assert f.data["count"] == 4 and f.data["modules"] == [layer.format(0), layer.format(1)]


@pytest.mark.parametrize("source", ["llama-tiny", "transformers"])
def test_findings_name_the_users_code_not_dynamos(source: str) -> None:
    for f in _fusion(*_llama(source)):
        # Dynamo's names: a module made from a function ("Func"), a global ("G['__import_a_dot_b']")
        text = json.dumps(f.to_dict()).replace("scaled_dot_product", "")
        assert not re.search(r"\bFunc\b|G\.__import|G\['__import|_dot_", text), f.id
        assert f"in `{f.data['function']}`" in f.title
