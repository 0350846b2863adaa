"""The "mlp" rules: HF-style gated MLPs become kernel_pytorch.nn.GatedMLP and fc1/fc2 MLPs
kernel_pytorch.nn.MLP, by instance and around the same parameters; MLPs we cannot run are left
alone with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.optimize import default_rules, optimize, select_rules
from kernel_pytorch.optimize.rules.mlp import FcMLPRule, HFGatedMLPRule
from kernel_pytorch.tolerances import compare
from tests.optimize import models

transformers = pytest.importorskip("transformers")

N_MLPS = 2  # one per layer


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message()


def _mlps(model: nn.Module) -> list[nn.Module]:
    return [m for n, m in model.named_modules() if n.endswith(".mlp")]


def test_registered_and_selectable_by_name_and_family() -> None:
    names = {r.name: r.family for r in default_rules()}
    assert names["hf_gated_mlp"] == names["fc_mlp"] == "mlp"
    assert [r.name for r in select_rules("mlp")] == ["hf_gated_mlp", "packed_gated_mlp", "fc_mlp", "moe_block"]
    assert [r.name for r in select_rules(["hf_gated_mlp"])] == ["hf_gated_mlp"]


@pytest.fixture(scope="module")
def llama_mlp_run() -> dict:
    torch.manual_seed(0)
    model, inputs = models.llama()
    prompt = inputs["input_ids"][:1, :5]
    before = {
        "tokens": model.generate(prompt, max_new_tokens=4, do_sample=False),
        "params": {n: p for n, p in model.named_parameters()},
        "keys": list(model.state_dict()),
    }
    out, report = optimize(model, inputs, components="mlp", seeds=(0,))
    return {"model": out, "report": report, "inputs": inputs, "prompt": prompt, "before": before}


def test_llama_mlps_swapped_and_validated(llama_mlp_run: dict) -> None:
    model, report = llama_mlp_run["model"], llama_mlp_run["report"]
    assert report.passed and report.validated and report.counts() == {"hf_gated_mlp": N_MLPS}
    mlps = _mlps(model)
    assert len(mlps) == N_MLPS and all(type(m) is kp.nn.GatedMLP and m.activation == "silu" for m in mlps)
    assert "LlamaMLP (silu) -> kernel_pytorch.nn.GatedMLP" in report.applied()[0].reason
    from transformers.models.llama import modeling_llama

    fresh, _ = models.llama()
    assert type(fresh.model.layers[0].mlp) is modeling_llama.LlamaMLP  # the class is untouched


def _saved_intermediate(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """The tensors of the MLPs' intermediate width that autograd keeps for the backward of one step."""
    width, tokens, saved = model.config.intermediate_size, inputs["input_ids"].numel(), []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(**inputs)
    return [t for t in saved if t.dim() >= 2 and t.shape[-1] == width and t.numel() == tokens * width]


def test_llama_training_saves_gate_and_up_not_h(llama_mlp_run: dict) -> None:
    """Per layer HF's LlamaMLP keeps gate, act(gate), up and h; the optimized one gate and up alone."""
    saved = _saved_intermediate(llama_mlp_run["model"], llama_mlp_run["inputs"])
    assert len(saved) == 2 * N_MLPS
    assert len({t.untyped_storage().data_ptr() for t in saved}) == 2 * N_MLPS
    fresh, inputs = models.llama()
    assert len(_saved_intermediate(fresh, inputs)) == 4 * N_MLPS


def test_llama_keeps_parameters_keys_and_generate(llama_mlp_run: dict) -> None:
    model, before = llama_mlp_run["model"], llama_mlp_run["before"]
    assert {n: id(p) for n, p in model.named_parameters()} == {n: id(p) for n, p in before["params"].items()}
    assert list(model.state_dict()) == before["keys"]
    mlp = model.model.layers[0].mlp
    assert mlp.gate_proj.weight is before["params"]["model.layers.0.mlp.gate_proj.weight"]
    tokens = model.generate(llama_mlp_run["prompt"], max_new_tokens=4, do_sample=False)
    assert torch.equal(tokens, before["tokens"])


def test_llama_state_dict_round_trips(llama_mlp_run: dict) -> None:
    model, inputs = llama_mlp_run["model"], llama_mlp_run["inputs"]
    fresh, _ = models.llama()
    fresh.load_state_dict(model.state_dict())  # ours -> transformers'
    _close(fresh(**inputs).logits, model(**inputs).logits)
    with models.weights_kept(model):
        other, _ = models.llama()
        model.load_state_dict(other.state_dict())  # transformers' -> ours
        _close(model(**inputs).logits, other(**inputs).logits)


def test_gemma_gelu_tanh_mlps_swapped() -> None:
    model, inputs = models.gemma()
    keys = list(model.state_dict())
    _, report = optimize(model, inputs, components="mlp", seeds=(0,))
    assert report.passed and report.counts() == {"hf_gated_mlp": N_MLPS}
    assert all(type(m) is kp.nn.GatedMLP and m.activation == "gelu_tanh" for m in _mlps(model))
    assert list(model.state_dict()) == keys


def test_bf16_keeps_dtype() -> None:
    model, inputs = models.llama()
    model.to(torch.bfloat16)
    _, report = optimize(model, inputs, components="mlp", seeds=(0,))
    assert report.passed and report.counts() == {"hf_gated_mlp": N_MLPS}
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16


def test_falcon_h1_mlps_swapped_with_their_multipliers() -> None:
    """FalconH1MLP (gate_proj/up_proj/down_proj and mlp_multipliers) becomes a GatedMLP holding its
    multipliers, validated on the hybrid attention + Mamba model; keys, parameters and logits kept."""
    torch.manual_seed(0)
    model, inputs = models.falcon_h1()
    old = model.model.layers[0].feed_forward
    keys, params = list(model.state_dict()), {n: id(p) for n, p in model.named_parameters()}
    x = torch.randn(2, 3, model.config.hidden_size)
    expected = old(x)
    _, report = optimize(model, inputs, components="mlp", seeds=(0,))
    assert report.passed and report.counts() == {"hf_gated_mlp": N_MLPS}
    new = model.model.layers[0].feed_forward
    assert type(new) is kp.nn.GatedMLP and (new.gate_multiplier, new.down_multiplier) == (0.7, 1.9)
    assert "FalconH1MLP (silu, gate_multiplier=0.7, down_multiplier=1.9) -> kernel_pytorch.nn.GatedMLP" in (
        report.applied()[0].reason)
    assert list(model.state_dict()) == keys and {n: id(p) for n, p in model.named_parameters()} == params
    _close(new(x), expected)


def test_multipliers_the_module_does_not_apply_are_caught_by_the_probe() -> None:
    """A module whose gate_multiplier attribute its forward ignores is left alone: the probe tells."""
    module = Gated()
    module.gate_multiplier = 0.5
    match = HFGatedMLPRule().match(module, "mlp", module)
    assert match is not None and match.replacement is None and "computes something other" in match.reason


def test_unsupported_activation_left_alone_with_reason() -> None:
    model, inputs = models.llama(hidden_act="relu2")
    _, report = optimize(model, inputs, components="mlp", seeds=(0,))
    assert report.passed and report.counts() == {}
    assert len(report.skipped()) == N_MLPS
    assert all("'relu2'" in c.reason and c.rule == "hf_gated_mlp" for c in report.skipped())
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


class Gated(nn.Module):
    """A gated MLP by structure; `act` and `extra` make it one we must not swap."""

    def __init__(self, act: nn.Module | None = None, square: bool = False) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)
        self.down_proj = nn.Linear(16, 8, bias=False)
        self.act_fn = act if act is not None else nn.SiLU()
        self.square = square

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h * h if self.square else h)


class FcMLP(nn.Module):
    def __init__(self, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.act, self.drop, self.fc2 = nn.Linear(8, 32), nn.GELU(), nn.Dropout(drop), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


def _with_norm() -> nn.Module:
    module = FcMLP()
    module.norm = nn.LayerNorm(32)  # its weights would be lost in an MLP
    return module


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (Gated(nn.Tanh()), "cannot tell Gated's activation"),
        (Gated(square=True), "computes something other than GatedMLP"),
        (FcMLP(drop=0.1), "dropout"),
        (_with_norm(), "child norm (LayerNorm) holds parameters"),
    ],
    ids=["no-activation", "other-forward", "dropout", "extra-parameters"],
)
def test_left_alone(module: nn.Module, reason: str) -> None:
    rule = FcMLPRule() if isinstance(module, FcMLP) else HFGatedMLPRule()
    match = rule.match(module, "mlp", module)
    assert match is not None and match.replacement is None and reason in match.reason


def test_hooked_projection_left_alone() -> None:
    module = Gated()
    module.up_proj.register_forward_hook(lambda m, a, out: out)
    match = HFGatedMLPRule().match(module, "mlp", module)
    assert match is not None and match.replacement is None and match.reason.startswith("up_proj: has forward")


def test_other_modules_are_not_this_kind() -> None:
    assert HFGatedMLPRule().match(nn.Linear(4, 4), "x", nn.Linear(4, 4)) is None
    ours = kp.nn.GatedMLP(8, 16)
    assert HFGatedMLPRule().match(ours, "mlp", ours) is None


def test_fc_mlp_swapped_sharing_parameters() -> None:
    module = nn.Sequential(FcMLP())
    x = (torch.randn(2, 3, 8),)
    expected = module(*x)
    params = {n: id(p) for n, p in module.named_parameters()}
    keys = list(module.state_dict())
    _, report = optimize(module, x, components="fc_mlp", seeds=(0,))
    assert report.passed and report.counts() == {"fc_mlp": 1} and type(module[0]) is kp.nn.MLP
    assert {n: id(p) for n, p in module.named_parameters()} == params and list(module.state_dict()) == keys
    _close(module(*x), expected)


@pytest.mark.parametrize("family", ["gpt_neox", "falcon"])
def test_dense_h_to_4h_mlps_keep_their_names(family: str) -> None:
    torch.manual_seed(0)
    model, inputs = getattr(models, family)()
    old = _mlps(model)[0]
    keys, x = list(old.state_dict()), torch.randn(2, 3, 32)
    expected = old(x)
    _, report = optimize(model, inputs, components="fc_mlp", seeds=(0,))
    assert report.passed and report.counts() == {"fc_mlp": N_MLPS}
    new = _mlps(model)[0]
    assert type(new) is kp.nn.MLP and new.activation == "gelu" and new.names == ("dense_h_to_4h", "dense_4h_to_h")
    assert new.dense_h_to_4h.weight is old.dense_h_to_4h.weight and list(new.state_dict()) == keys
    assert "names=('dense_h_to_4h', 'dense_4h_to_h')" in repr(new)
    _close(new(x), expected)


def test_mlp_names_must_be_two_attribute_names() -> None:
    with pytest.raises(ValueError, match="two different attribute names"):
        kp.nn.MLP(8, 16, names=("fc", "fc"))
