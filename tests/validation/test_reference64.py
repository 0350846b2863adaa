"""The fp64 reference where a layer refuses float64: that layer runs in fp32 inside the copy, every
other layer in fp64, so the budget survives; and on transformers' MoE models (fused experts refuse
fp64) the default optimize() keeps its correct swaps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kernel_pytorch.validation import validate_optimization
from kernel_pytorch.validation.reference64 import fp64_copy

FAST = dict(check_performance=False, check_compile=False, check_determinism=False)


class RefusesFp64(nn.Module):
    """A layer with a kernel that has no float64 version (as torch._grouped_mm)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64 or self.weight.dtype == torch.float64:
            raise TypeError("Expected mat_a to be Float32, BFloat16 or Float16 matrix, got Double")
        return x * self.weight


class Net(nn.Module):
    """A wide row summed in chunks, each rounded to the input's dtype: in bf16 far from the exact sum."""

    def __init__(self, width: int = 4096) -> None:
        super().__init__()
        self.expert = RefusesFp64(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.expert(x))
        return h.unflatten(-1, (64, -1)).sum(-1).sum(-1)


class Fp32Sum(Net):
    """The same model summing in fp32 (the kind of change optimize() makes): closer to the exact sum than
    the original, so it fails the table against the original and passes the fp64 budget."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.expert(x))
        return h.float().sum(-1).to(h.dtype)


def test_a_layer_refusing_fp64_runs_in_fp32_inside_the_reference() -> None:
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(64, 4096)
    ref, label = fp64_copy(model, (x,), "auto")
    assert ref is not None and label == "fp64 copy of the original"
    run = ref.run([n for n, _ in model.named_parameters()], (x,), with_grads=True, seed=0, grad_outputs=None)
    assert ref.fp32_layers == ["expert"] and "expert" in ref.label
    assert run.outputs.dtype == torch.float64
    assert ref.module.proj.weight.dtype == torch.float64 and ref.module.expert.weight.dtype == torch.float32
    assert run.grads["grad(param 'proj.weight')"].dtype == torch.float64
    assert model.expert.weight.dtype == torch.float32 and not model.expert._forward_pre_hooks  # the user's untouched


def test_the_budget_survives_a_layer_refusing_fp64() -> None:
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    other = Fp32Sum().to(torch.bfloat16)
    other.load_state_dict(model.state_dict())
    x = torch.randn(64, 4096, dtype=torch.bfloat16)
    r = validate_optimization(model, other, (x,), seeds=(0,), check_gradients=False, **FAST)
    corr = r.correctness_check
    assert "1 layer(s) in fp32" in corr.reference, corr.reference
    assert r.passed, r.summary()
    table_only = validate_optimization(model, other, (x,), seeds=(0,), check_gradients=False, reference="none",
                                       **FAST)
    assert not table_only.passed  # the fp32 sum needs the budget: the test above exercised it
    assert "fp64 budget" in {c.method for c in corr.checks[0]}


def test_a_failure_outside_any_layer_still_drops_the_reference() -> None:
    class Root(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dtype == torch.float64:
                raise TypeError("no fp64 here")
            return x * self.w

    model = Root()
    r = validate_optimization(model, copy.deepcopy(model), (torch.randn(2, 3),), seeds=(0,), **FAST)
    assert r.passed and r.correctness_check.reference.startswith("none: the fp64 copy failed")


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_models_keep_their_correct_swaps(family: str) -> None:
    transformers = pytest.importorskip("transformers")
    import kernel_pytorch as kp

    base = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_experts_per_tok=2)
    config = {
        "mixtral": lambda: transformers.MixtralConfig(**base, num_local_experts=4),
        "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**base, num_experts=4, moe_intermediate_size=32,
                                                         shared_expert_intermediate_size=32),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**base, num_experts=4, moe_intermediate_size=32, head_dim=8),
    }[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, 96, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    model, report = kp.optimize(model, {"input_ids": ids, "attention_mask": mask, "labels": labels})
    assert report.passed, report.summary()
    assert not [c for c in report.changes if c.status == "reverted"], report.summary(validation=False)
    counts = report.counts()
    assert counts["hf_rms_norm"] == 5 and counts["hf_attention"] == 2 and counts["fused_linear_cross_entropy"] == 1
