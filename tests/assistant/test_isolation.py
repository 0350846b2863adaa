"""Every analysis leaves the process and the model as it found them: Dynamo, Inductor and functorch config,
threads, grad mode, deterministic flags, environment, RNG, hooks and compiled wrappers on the model,
and its parameters and buffers bitwise (a train-mode CNN's BatchNorm statistics included)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch._tree import bitwise_equal
from kernel_pytorch.assistant import SECTIONS
from kernel_pytorch.assistant import assistant as assistant_module
from kernel_pytorch.assistant.isolation import Snapshot


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    ).train()  # fmt: skip


def test_snapshot_names_and_restores_each_kind_of_change() -> None:
    model = _cnn()
    x = torch.randn(2, 3, 8, 8)
    saved = Snapshot.take(model)
    assert saved.changes() == []
    threads = torch.get_num_threads()
    key = "KP_ISOLATION_TEST"
    try:
        torch._dynamo.config.recompile_limit += 1
        torch._inductor.config.max_autotune = not torch._inductor.config.max_autotune
        torch.fx.experimental._config.use_duck_shape = not torch.fx.experimental._config.use_duck_shape
        os.environ[key] = "1"
        torch.set_num_threads(1 if threads != 1 else 2)
        torch.set_grad_enabled(False)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.rand(1)
        model[0].register_forward_hook(lambda *a: None)
        model[1].forward = lambda t: t
        model.compile(backend="eager")
        model[4](torch.randn(2, 8, 4, 4))  # BatchNorm's running statistics move
        model[8].weight.grad = torch.ones_like(model[8].weight)
        with torch.no_grad():
            model[3].weight.add_(1.0)
        changes = "\n".join(saved.changes())
        for expected in ("torch._dynamo.config.recompile_limit", "torch._inductor.config.max_autotune",
                         "use_duck_shape", "num_threads", "grad_enabled", "deterministic", key, "RNG state",
                         "0: _forward_hooks", "1: attribute forward", "the model: attribute _compiled_call_impl",
                         "(8,) parameter or buffer's values", "() parameter or buffer's values",
                         "(8, 8, 3, 3) parameter or buffer's values", "(10, 8) parameter's .grad"):
            assert expected in changes
    finally:
        saved.restore()
    assert saved.changes() == []
    assert os.environ.get(key) is None and torch.get_num_threads() == threads and torch.is_grad_enabled()
    assert model._compiled_call_impl is None and "forward" not in vars(model[1]) and not model[0]._forward_hooks
    assert model[8].weight.grad is None
    out = model(x)  # the model runs as before, uncompiled
    assert out.shape == (2, 10)


@pytest.fixture(scope="module")
def full_analysis() -> dict[str, object]:
    """A full analysis of a train-mode CNN with BatchNorm, with what differs from the state before it
    recorded after every analysis (a probe run between the steps, after each one's restore)."""
    model = _cnn()
    x = torch.randn(4, 3, 16, 16)
    state_dict = {k: v.clone() for k, v in model.state_dict().items()}
    reference = Snapshot.take(model)
    seen: dict[str, list[str]] = {}

    def probe(after: str):
        def run(ctx: object) -> list:
            seen[after] = reference.changes()
            return []

        return run

    steps = []
    for step in assistant_module.STEPS:
        steps += [step, assistant_module._Step(step.section, f"probe after {step.section}", probe(step.section))]
    mp = pytest.MonkeyPatch()
    mp.setattr(assistant_module, "STEPS", tuple(steps))
    try:
        assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(shapes={"batch": (4, 8)}))
        report = assistant.analyze_component(model, (x,))
    finally:
        mp.undo()
    return {"model": model, "state_dict": state_dict, "seen": seen, "after": reference.changes(), "report": report}


def test_every_analysis_leaves_the_process_and_the_model_as_found(full_analysis: dict) -> None:
    report = full_analysis["report"]
    assert not [f.id for f in report.findings() if f.id.startswith("analysis-error")]
    assert set(full_analysis["seen"]) == set(SECTIONS)  # every analysis ran, and a probe after it
    assert {k: v for k, v in full_analysis["seen"].items() if v} == {}
    assert full_analysis["after"] == []


def test_a_train_mode_cnn_state_dict_is_bitwise_unchanged(full_analysis: dict) -> None:
    model, before = full_analysis["model"], full_analysis["state_dict"]
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert [k for k in before if not bitwise_equal(after[k], before[k])] == []
    assert int(after["1.num_batches_tracked"]) == 0 and model.training
    # the analysis ran the training step it reports on (and would have moved the statistics)
    assert any(f.id == "verdict.compile" for f in full_analysis["report"].kernel_efficiency)
