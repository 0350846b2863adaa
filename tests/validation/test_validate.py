"""validate_optimization: right modules pass, wrong ones fail with a message saying which tensor, by
how much and where; compile failures and non-determinism are reported, never raised."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.tolerances import TOLERANCES
from kernel_pytorch.validation import ValidationOptions, validate_optimization
from tests.grid import randn

FAST = dict(check_performance=False, compile_backend="eager")


class HFRMSNorm(nn.Module):
    """RMSNorm written the way Hugging Face writes LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class OffByOneColumn(HFRMSNorm):
    """Wrong in one column only: the report must point at it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        bump = torch.zeros_like(y)
        bump[..., 5] = 0.5
        return y + bump


class _WrongWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, w)
        return h * w

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        h, w = ctx.saved_tensors
        return g * w, 2 * (g * h).sum(0)  # the weight gradient is doubled


class WrongBackward(HFRMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return _WrongWeightGrad.apply(h, self.weight)


class Detached(HFRMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).detach()


def _pair(cls: type[HFRMSNorm], dim: int = 32) -> tuple[HFRMSNorm, nn.Module]:
    original = HFRMSNorm(dim)
    other = cls(dim)
    other.load_state_dict(original.state_dict())
    return original, other


def test_a_right_module_passes_on_every_part() -> None:
    original = HFRMSNorm(32)
    optimized = kp.nn.RMSNorm(32, eps=1e-6)
    optimized.load_state_dict(original.state_dict())
    r = validate_optimization(original, optimized, (randn(6, 32),), compile_backend="eager",
                              cpu_min_run_time=0.01)
    assert r.passed, r.summary()
    names = {c.name for c in r.correctness_check.checks[0]}
    assert names == {"output", "grad(input[0])", "grad(param 'weight')"}
    assert set(r.correctness_check.checks) == {0, 1, 2}
    perf = r.performance_improvement
    assert perf is not None and set(perf.passes) == {"fwd", "fwd+bwd"}
    for pc in perf.passes.values():
        assert pc.original.median_ms > 0 and pc.optimized.median_ms > 0
        assert pc.speedup == pytest.approx(pc.original.median_ms / pc.optimized.median_ms)
        assert pc.speedup_low <= pc.speedup <= pc.speedup_high
    mem = r.memory_efficiency
    assert mem is not None and "cpu" in mem.method
    assert r.compilation_success.success and r.compilation_success.graph_break_count == 0
    assert r.compilation_success.matches_eager
    assert r.determinism.deterministic
    parsed = json.loads(r.to_json())
    assert set(parsed) >= {"correctness_check", "performance_improvement", "memory_efficiency",
                           "compilation_success", "determinism", "passed"}
    for part in ("correctness_check", "performance_improvement", "memory_efficiency", "compilation_success"):
        assert part in r.summary()


def test_a_wrong_output_fails_naming_the_output_the_error_and_the_index() -> None:
    original, wrong = _pair(OffByOneColumn)
    x = randn(4, 32)
    r = validate_optimization(original, wrong, (x,), **FAST)
    assert not r.passed
    fails = r.correctness_check.failures()
    out = [c for _, c in fails if c.name == "output"]
    assert out and all(c.worst_index[-1] == 5 for c in out)
    assert out[0].max_abs_err == pytest.approx(0.5, rel=1e-5)
    text = r.summary()
    assert "output: MISMATCH" in text and "max abs err 0.5" in text and ", 5)" in text
    assert f"atol {TOLERANCES[torch.float32].atol:g}" in text


def test_a_wrong_gradient_fails_naming_the_parameter() -> None:
    original, wrong = _pair(WrongBackward)
    r = validate_optimization(original, wrong, (randn(5, 32),), **FAST)
    assert not r.passed
    failed = {c.name for _, c in r.correctness_check.failures()}
    assert failed == {"grad(param 'weight')"}
    ok_only_outputs = validate_optimization(original, wrong, (randn(5, 32),), check_gradients=False, **FAST)
    assert ok_only_outputs.passed
    # the same through an options object; a keyword beside it overrides its field
    outputs_only = ValidationOptions(check_gradients=False, **FAST)
    assert validate_optimization(original, wrong, (randn(5, 32),), options=outputs_only).passed
    with_grads = validate_optimization(original, wrong, (randn(5, 32),), options=outputs_only, check_gradients=True)
    assert not with_grads.passed


def test_a_keyword_that_is_no_option_is_named() -> None:
    original = HFRMSNorm(32)
    with pytest.raises(TypeError, match="no ValidationOptions field 'check_grads'; the fields: check_gradients"):
        validate_optimization(original, original, (randn(2, 32),), check_grads=False)


def test_an_output_cut_from_autograd_is_reported() -> None:
    original, detached = _pair(Detached)
    r = validate_optimization(original, detached, (randn(3, 32),), check_compile=False,
                              check_performance=False)
    assert not r.passed
    notes = " ".join(c.note for _, c in r.correctness_check.failures())
    assert "carries no gradient" in notes


def test_low_precision_uses_the_fp64_budget_for_long_reductions() -> None:
    class Chunked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # partial sums rounded to bf16
            return x.unflatten(-1, (64, -1)).sum(-1).sum(-1)

    class Fp32Sum(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.float().sum(-1).to(x.dtype)

    class DropsATerm(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., :-1].float().sum(-1).to(x.dtype)

    x = randn(64, 4096, dtype=torch.bfloat16)
    r = validate_optimization(Chunked(), Fp32Sum(), (x,), check_gradients=False, **FAST)
    assert r.passed, r.summary()
    assert {c.method for cs in r.correctness_check.checks.values() for c in cs} >= {"fp64 budget"}
    table_only = validate_optimization(Chunked(), Fp32Sum(), (x,), check_gradients=False,
                                       reference="none", **FAST)
    assert not table_only.passed
    wrong = validate_optimization(Chunked(), DropsATerm(), (x,), check_gradients=False, **FAST)
    assert not wrong.passed


def test_dict_inputs_callable_inputs_and_redrawn_seeds() -> None:
    original, same = _pair(HFRMSNorm)

    class Kw(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    r = validate_optimization(Kw(original), Kw(same), {"x": randn(2, 32)}, **FAST)
    assert r.passed
    assert "grad(input['x'])" in {c.name for c in r.correctness_check.checks[0]}
    seen: list[int] = []

    def make(seed: int) -> tuple[torch.Tensor]:
        seen.append(seed)
        return (randn(2, 32) + seed,)

    r2 = validate_optimization(original, same, make, seeds=(3, 4), **FAST)
    assert r2.passed and set(r2.correctness_check.checks) == {3, 4} and 3 in seen and 4 in seen


def test_a_graph_break_is_reported_not_raised() -> None:
    class Breaks(HFRMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = super().forward(x)
            if float(y.detach().sum()) > 1e30:  # data-dependent Python control flow: a graph break
                y = y * 2
            return y

    original, breaking = _pair(Breaks)
    r = validate_optimization(original, breaking, (randn(3, 32),), **FAST)
    assert r.passed  # numerically it is right
    comp = r.compilation_success
    assert not comp.success and comp.error
    assert comp.graph_count >= 1 and comp.graph_break_count >= 1 and comp.break_reasons
    assert "compilation_success: no" in r.summary()
    # each break names the user's line that caused it
    line = inspect.getsourcelines(Breaks.forward)[1] + 2
    assert f"{__file__}:{line}" in comp.break_locations
    assert f"(at {__file__}:{line})" in r.summary()


def test_non_determinism_is_reported() -> None:
    class Noisy(HFRMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + 1e-9 * torch.rand_like(x)

    original, noisy = _pair(Noisy)
    r = validate_optimization(original, noisy, (randn(3, 32),), check_compile=False, check_performance=False)
    assert r.passed  # within the fp32 table
    assert not r.determinism.deterministic and r.determinism.differing[0].startswith("output")


def test_modes_are_restored_and_eval_is_used() -> None:
    class DropoutNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.drop(self.lin(x))

    a, b = DropoutNet(), DropoutNet()
    b.load_state_dict(a.state_dict())
    a.train()
    b.train()
    r = validate_optimization(a, b, (randn(4, 8),), **FAST)
    assert r.passed and a.training and b.training and a.drop.training


@pytest.mark.cuda
def test_cuda_bf16_rms_norm_validates_times_and_measures() -> None:
    from kernel_pytorch.benchmark.memory import CUDA_METHOD
    from kernel_pytorch.validation import examples

    original, optimized, _ = examples.rms_norm_pair()
    original = original.to("cuda", torch.bfloat16)
    optimized = optimized.to("cuda", torch.bfloat16)
    x = randn(4096, 1024, dtype=torch.bfloat16, device="cuda")
    r = validate_optimization(original, optimized, (x,))
    assert r.passed, r.summary()
    assert not r.device.startswith("cpu")
    assert r.memory_efficiency.method == CUDA_METHOD
    for pm in r.memory_efficiency.passes.values():
        assert pm.original_bytes >= x.numel() * x.element_size()  # at least the output
    for pc in r.performance_improvement.passes.values():
        assert "cuda events" in pc.original.method and pc.speedup > 0
    assert r.compilation_success.success and r.compilation_success.backend == "inductor"
    assert r.determinism.deterministic


def test_compile_and_determinism_reruns_differentiate_the_first_seeds_outputs() -> None:
    class Optional(nn.Module):
        """Returns a second output only when asked: the differentiated outputs depend on the inputs."""

        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, extra: bool) -> dict[str, torch.Tensor]:
            y = self.lin(x)
            return {"y": y, "z": y.tanh()} if extra else {"y": y}

    def make(seed: int) -> tuple[torch.Tensor, bool]:
        return randn(4, 8) + seed, seed == 0  # seed 0 has two outputs, the last seed one

    a, b = Optional(), Optional()
    b.load_state_dict(a.state_dict())
    r = validate_optimization(a, b, make, seeds=(0, 1), **FAST)
    assert r.passed, r.summary()
    assert r.compilation_success.success and r.compilation_success.matches_eager, r.summary()
    assert r.determinism.deterministic, r.summary()


class LinearCentered(nn.Module):
    """A Linear with bias, then a reduction: each row minus its mean. Inductor sums the bias gradient
    over the rows in another order than eager, so the two differ by more than fp32's table allows."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y - y.mean(-1, keepdim=True)


class WrongWhenCompiled(LinearCentered):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y * (1 + 1e-4) if torch.compiler.is_compiling() else y


@pytest.mark.parametrize("reference", ["auto", "none"])
def test_a_model_validated_against_itself_passes_its_compile_check(reference: str) -> None:
    model = LinearCentered()
    r = validate_optimization(model, model, (randn(2048, 64),), seeds=(0,), reference=reference,
                              check_performance=False, check_determinism=False)
    comp = r.compilation_success
    assert r.passed and comp.success and comp.backend == "inductor"
    assert comp.matches_eager, r.summary()


def test_a_wrong_compiled_result_still_fails_the_compile_check() -> None:
    original, wrong = LinearCentered(), WrongWhenCompiled()
    wrong.load_state_dict(original.state_dict())
    r = validate_optimization(original, wrong, (randn(2048, 64),), seeds=(0,), **FAST)
    assert r.passed  # eagerly it is right
    comp = r.compilation_success
    assert comp.success and comp.matches_eager is False and "MISMATCH" in comp.mismatch
