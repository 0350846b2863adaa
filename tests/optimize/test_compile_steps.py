"""optimize()'s compile steps beside regional compilation: mark_dynamic from several shapes (the dims
found and a 0-recompile check, on the CPU), channels_last for convolution nets, opt-in TF32 and CUDA
graphs (their CPU reports here; the measured paths in the `cuda` tests)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor, nn

from kernel_pytorch.optimize import CompileOptions, mark_dynamic_inputs, optimize
from kernel_pytorch.optimize.compile_steps import channels_last_inputs
from kernel_pytorch.optimize.dynamic import count_recompiles, mark_inputs, varying_dims
from tests.optimize import models


class Masked(nn.Module):
    """x (B, T, C) and a (B, T) mask the code ties to x: both vary together."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.fc(x) * mask.unsqueeze(-1)


def masked(batch: int, seq: int) -> tuple[Tensor, Tensor]:
    return torch.randn(batch, seq, 8), torch.ones(batch, seq)


def step(report, name):
    return next(s for s in report.compile_steps if s.name == name)


def test_varying_dims_by_name() -> None:
    model = Masked()
    found = varying_dims(model, masked(2, 6), [masked(3, 6), masked(4, 9)])
    assert found.names == {"x": [0, 1], "mask": [0, 1]} and found.marks == {0: [0, 1], 1: [0, 1]}
    assert not found.problems
    kw = varying_dims(model, {"x": torch.randn(2, 6, 8), "mask": torch.ones(2, 6)},
                      [{"x": torch.randn(2, 5, 8), "mask": torch.ones(2, 5)}])
    assert kw.names == {"x": [1], "mask": [1]}
    odd = varying_dims(model, masked(2, 6), [masked(1, 6), (torch.randn(2, 6), torch.ones(2, 6))])
    assert odd.names == {"mask": [0]}  # x changes rank in one call: not marked
    assert any("size 0 or 1" in p for p in odd.problems)
    assert any("rank or dtype" in p for p in odd.problems)
    scalar = varying_dims(nn.Identity(), (torch.ones(2), 3), [(torch.ones(2), 4)])
    assert scalar.names == {} and "Python number" in scalar.problems[0]


def test_marks_compile_once_across_shapes() -> None:
    model = Masked()
    calls = [masked(2, 6), masked(3, 7), masked(5, 9)]
    found = varying_dims(model, calls[0], calls[1:])
    plain, marked = count_recompiles(model, calls), count_recompiles(model, calls, found.marks)
    assert plain.recompiles >= 1 and marked.recompiles == 0 and not marked.errors
    x, mask = calls[0]
    fresh = mark_inputs(calls[0], found.marks)
    assert fresh[0] is not x and not hasattr(x, "_dynamo_dynamic_indices")  # the example stays unmarked
    mark_dynamic_inputs(model, (x, mask), found.names)
    assert x._dynamo_dynamic_indices == {0, 1}


def test_optimize_reports_dynamic_dims_and_saves_them(tmp_path) -> None:
    from kernel_pytorch.deploy import save

    model = Masked()
    _, report = optimize(model, masked(2, 6), extra_inputs=[masked(3, 7), masked(4, 5)], components="none",
                         seeds=(0,))
    s = step(report, "mark_dynamic")
    assert s.status == "applied" and s.measured["recompiles_marked"] == 0 and s.measured["calls"] == 3
    assert report.dynamic_dims == {"x": [0, 1], "mask": [0, 1]} and report.passed
    assert report.to_dict()["dynamic_dims"] == {"x": [0, 1], "mask": [0, 1]}
    save(model, tmp_path, report=report)
    assert json.loads((tmp_path / "kernel_pytorch.json").read_text())["dynamic_dims"] == {"x": [0, 1], "mask": [0, 1]}


def test_mark_dynamic_needs_extra_inputs() -> None:
    model, inputs = models.stack()
    _, report = optimize(model, inputs, components="none", validate=False)
    assert step(report, "mark_dynamic").status == "skipped" and report.dynamic_dims == {}
    _, report = optimize(model, inputs, extra_inputs=[inputs], components="none", validate=False)
    assert "no dim varies" in step(report, "mark_dynamic").reason


def test_channels_last_conversion() -> None:
    model, (x,) = models.cnn()
    expected = model(x)
    stats = model.features[1].running_mean.clone()
    _, auto = optimize(model, (x,), components="none", validate=False)
    assert "not measured on the CPU" in step(auto, "channels_last").reason
    assert not model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    model.train()  # BatchNorm updates its statistics in train mode: the step's own calls must not
    _, report = optimize(model, (x,), components="none", compile=True, seeds=(0,))
    s = step(report, "channels_last")
    assert s.status == "applied" and "channels_last" in s.reason and report.passed, report
    assert model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(model.features[1].running_mean, stats)
    cl = channels_last_inputs((x, torch.randn(2, 3)))
    assert cl[0].is_contiguous(memory_format=torch.channels_last) and cl[1].is_contiguous()
    model.eval()
    torch.testing.assert_close(model(cl[0]), expected)
    _, plain = optimize(*models.stack(), components="none", compile=True, validate=False)
    assert step(plain, "channels_last").reason.startswith("no nn.Conv2d")


def test_tf32_is_opt_in_and_cpu_reports() -> None:
    model, inputs = models.stack()
    before = torch.get_float32_matmul_precision()
    _, report = optimize(model, inputs, components="none", seeds=(0,))
    assert step(report, "tf32").status == "skipped" and "opt-in" in step(report, "tf32").reason
    _, report = optimize(model, inputs, components="none", seeds=(0,), tf32=True)
    assert "not applicable on the CPU" in step(report, "tf32").reason
    assert torch.get_float32_matmul_precision() == before
    graphs = step(report, "cuda_graphs")
    assert graphs.status == "skipped" and "not applicable on the CPU" in graphs.reason
    _, off = optimize(model, inputs, components="none", compile=False, validate=False)
    assert off.compile_steps == []  # compile=False: no compile steps, TF32 not asked


def test_cli_tf32_flag(tmp_path, capsys) -> None:
    from kernel_pytorch.cli.main import main

    path = tmp_path / "net.py"
    path.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    before = torch.get_float32_matmul_precision()
    assert main(["optimize", f"{path}:make", "--tf32", "--no-validate", "--json"]) == 0
    steps = {s["name"]: s for s in json.loads(capsys.readouterr().out)["compile"]}
    assert "not applicable on the CPU" in steps["tf32"]["reason"] and torch.get_float32_matmul_precision() == before


def test_graphs_run_only_where_gradients_are_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks given CUDA graphs call the reduce-overhead compile with gradients on and the default
    compile under no_grad (where CUDA graph trees would free one block's output before the next reads it)."""
    from kernel_pytorch.optimize import compile_steps

    made = []

    def fake_compile(fn, **opts):
        made.append(opts)
        return lambda *a, **kw: (opts.get("mode") or "default", fn(*a, **kw))

    monkeypatch.setattr(compile_steps.torch, "compile", fake_compile)
    block = torch.nn.Linear(3, 3)
    compile_steps.compile_blocks([block], CompileOptions(dynamic=False, mode="reduce-overhead"))
    assert made == [{"dynamic": False, "mode": "reduce-overhead"}, {"dynamic": False, "mode": None}]
    x = torch.randn(2, 3)
    mode, y = block(x)
    assert mode == "reduce-overhead" and torch.equal(y, block._call_impl(x))
    with torch.no_grad():
        assert block(x)[0] == "default"
    # a graph mode the caller asks for is split the same way; other modes compile as asked
    made.clear()
    compile_steps.compile_blocks([block], CompileOptions(mode="max-autotune"))
    assert made == [{"mode": "max-autotune"}, {"mode": "max-autotune-no-cudagraphs"}]
    with torch.no_grad():
        assert block(x)[0] == "max-autotune-no-cudagraphs"
    made.clear()
    compile_steps.compile_blocks([block], CompileOptions(mode="max-autotune-no-cudagraphs"))
    assert made == [{"mode": "max-autotune-no-cudagraphs"}]  # nn.Module.compile: one compile, for every call
    assert not isinstance(block._compiled_call_impl, compile_steps.GradModeGraphs)


# ----- CUDA: the measured paths ---------------------------------------------------------------------

@pytest.mark.cuda
def test_channels_last_measured_on_cuda() -> None:
    model, (x,) = models.cnn()
    model, x = model.cuda(), x.cuda()
    _, report = optimize(model, (x,), components="none", seeds=(0,))
    s = step(report, "channels_last")
    assert s.status in ("applied", "reverted") and set(s.measured) >= {"contiguous_ms", "channels_last_ms"}
    assert model.features[0].weight.is_contiguous(memory_format=torch.channels_last) == (s.status == "applied")
    assert report.passed


@pytest.mark.cuda
def test_tf32_on_cuda_sets_or_restores() -> None:
    model, (x,) = models.stack()
    model, x = model.cuda(), x.cuda()
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        _, report = optimize(model, (x,), components="none", seeds=(0,), tf32=True)
        s = step(report, "tf32")
        assert s.status in ("applied", "reverted"), s
        if s.status == "applied":
            assert torch.get_float32_matmul_precision() == "high" and "global state" in s.reason
        else:
            assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.cuda
def test_cuda_graphs_step_on_cuda() -> None:
    model, (x,) = models.stack()
    model, x = model.cuda(), x.cuda()
    _, report = optimize(model, (x,), components="none", compile=True, seeds=(0,))
    s = step(report, "cuda_graphs")
    assert step(report, "regional").status == "applied" and report.passed
    # a tiny model is launch-bound: reduce-overhead is tried (timed, or reverted with the error); otherwise
    # the profile says why not
    if s.status == "skipped":
        assert "launch-bound" in s.reason
    else:
        assert s.status in ("applied", "reverted") and "idle_fraction" in s.measured
        assert all(b._compiled_call_impl is not None for b in model.blocks)  # compiled either way
        assert "reduce-overhead" in s.reason
    # evaluation at other batch sizes, then a training step: each call's blocks hand on live outputs
    model.eval()
    with torch.no_grad():
        for n in (3, 5):
            xs = torch.randn(n, *x.shape[1:], device="cuda")
            assert torch.isfinite(model(xs)).all()
    model.train()
    model(x).float().square().mean().backward()
