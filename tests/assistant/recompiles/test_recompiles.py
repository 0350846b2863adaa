"""Recompilations: caught with their guard, classified, fixed, and the fix verified by a second sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_pytorch._env import recompile_limit, recompile_limit_name
from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.assistant.recompiles.causes import classify_recompile, failed_guard
from kernel_pytorch.assistant.recompiles.recompiles import analyze_recompilations
from kernel_pytorch.assistant.records import CompileRecord
from tests.assistant import zoo
from tests.grid import device_under_test, randn

DEV = device_under_test()


def _analyze(model: torch.nn.Module, args: tuple, extra: tuple = (), **options: object) -> list[Finding]:
    ctx = AnalysisContext(
        model, args, options=AnalysisOptions(measure_compile_time=False, **options), extra_inputs=extra
    )
    return analyze_recompilations(ctx)


def _one(findings: list[Finding], finding_id: str, **data: object) -> Finding:
    hits = [f for f in findings if f.id == finding_id and all(f.data.get(k) == v for k, v in data.items())]
    assert len(hits) == 1, [(f.id, dict(f.data)) for f in findings]
    return hits[0]


@pytest.fixture(scope="module")
def static_batch() -> tuple[list[Finding], torch.Tensor]:
    """An MLP compiled with dynamic=False and called with 4 batch sizes: 3 recompiles before the fix."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    return _analyze(zoo.Mlp(), (x,), dynamic=False, shapes={"batch": (2, 4, 8, 16), "seq": (8,)}), x


def test_varying_batch_recompiles_are_fixed_by_mark_dynamic(static_batch: tuple[list[Finding], torch.Tensor]) -> None:
    findings, _ = static_batch
    summary = _one(findings, "recompile.summary")
    assert summary.data["recompiles_before"] == 3
    assert summary.data["recompiles_after"] <= 1  # the goal for varying batch sizes
    assert summary.severity is Severity.WARNING
    batch = _one(findings, "recompile.dynamic-dim", dim=0)
    assert batch.data["input"] == "x"
    assert batch.data["recompiles_before"] == 3 and batch.data["recompiles_after"] == 0
    assert "torch._dynamo.mark_dynamic(x, 0)" in batch.suggestion
    assert "batch" in batch.title
    assert "size mismatch at index 0" in batch.evidence
    assert "verified" in (batch.estimated_gain or "")
    assert batch.location is not None and batch.location.line == zoo.def_line(zoo.Mlp)
    assert Path(batch.location.file).resolve() == Path(zoo.__file__).resolve()


def test_the_users_example_tensors_are_not_marked(static_batch: tuple[list[Finding], torch.Tensor]) -> None:
    _, x = static_batch
    assert not getattr(x, "_dynamo_dynamic_indices", None)


def test_automatic_dynamic_batch_and_seq_then_fix() -> None:
    findings = _analyze(zoo.Mlp(), (torch.randn(2, 8, 16),))
    summary = _one(findings, "recompile.summary")
    # torch's automatic dynamic shapes: one recompile per dim that varies, none once marked dynamic
    assert summary.data["recompiles_before"] == 2
    assert summary.data["recompiles_after"] == 0
    assert _one(findings, "recompile.dynamic-dim", dim=1).title.startswith("Recompiles when seq (dim 1)")


def test_batch_of_one_costs_at_most_one_recompile_after_the_fix() -> None:
    findings = _analyze(zoo.Mlp(), (torch.randn(2, 8, 16),), dynamic=False, shapes={"batch": (1, 2, 4, 8), "seq": (8,)})
    summary = _one(findings, "recompile.summary")
    assert summary.data["recompiles_before"] == 3  # batch 1, 4 and 8 after the example's 2
    assert summary.data["recompiles_after"] <= 1
    # said once, in the summary, because a size of 1 is swept
    said = [f.id for f in findings if "Sizes 0 and 1 are always specialised" in f.evidence + f.suggestion]
    assert said == ["recompile.summary"]


def test_python_scalar_is_named_at_its_line_and_tensorised() -> None:
    findings = _analyze(zoo.ScalarArg(), (torch.randn(4, 16), 0.5), shapes={"batch": (4,)})
    scalar = _one(findings, "recompile.python-scalar")
    assert scalar.data["input"] == "scale"
    assert scalar.data["recompiles_before"] == 1 and scalar.data["recompiles_after"] == 0
    assert "torch.tensor(scale)" in scalar.suggestion
    assert scalar.location is not None and scalar.location.line == zoo.line_of("scalar")
    assert _one(findings, "recompile.summary").data["recompiles_after"] == 0


def test_calls_the_eager_model_rejects_are_left_out() -> None:
    findings = _analyze(
        zoo.Mlp(),
        (torch.randn(2, 3, 16),),
        extra=((torch.randn(2, 3, 16, dtype=torch.float64),),),
        shapes={"batch": (2,), "seq": (3,)},
    )
    # a float64 input into a float32 Linear fails eagerly: left out, not blamed on the compiler
    assert _one(findings, "recompile.rejected-sizes").data["rejected"] == ["extra_inputs[0]"]
    assert [f.id for f in findings] == ["recompile.rejected-sizes", "recompile.no-sweep"]


def test_dtype_and_parameter_changes_are_classified() -> None:
    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    x = torch.randn(4, 16)
    findings = _analyze(Scale(), (x,), extra=((x.double(),), (torch.nn.Parameter(x.clone()),)), shapes={"batch": (4,)})
    dtype = _one(findings, "recompile.dtype")
    assert "dtype mismatch" in dtype.evidence and "recompiles_after" not in dtype.data
    assert "type-change" in {f.data.get("kind") for f in findings}


class _Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | int) -> torch.Tensor:
        return x + y


def _change(kind: str) -> tuple[torch.nn.Module, tuple, tuple, str]:
    """(model, the example call on the test's device, one call that changes `kind`, the input changed)."""
    x = randn(4, 16, device=DEV)
    return {
        "device": (_Twice(), (x,), (x.to("cpu" if DEV == "cuda" else "meta"),), "x"),
        "rank": (_Twice(), (x,), (x.reshape(4, 2, 8),), "x"),
        "dtype": (_Twice(), (x,), (x.double(),), "x"),
        "type-change": (_Add(), (x, torch.tensor(1.0, device=DEV)), (x, 1), "y"),
    }[kind]


@pytest.mark.parametrize("kind", ["device", "rank", "dtype", "type-change"])
def test_a_call_that_changes_one_thing_is_classified_by_it(kind: str) -> None:
    """A device (CUDA and CPU, or CPU and meta), a rank, a dtype, a tensor passed as an int: each is
    named as what changed, for the input that changed."""
    model, args, extra, name = _change(kind)
    findings = _analyze(model, args, extra=(extra,), shapes={"batch": (4,)})
    cause = _one(findings, f"recompile.{kind}")
    assert cause.data["input"] == name and cause.data["recompiles_before"] == 1
    assert [f.id for f in findings if f.id != "recompile.summary"] == [f"recompile.{kind}"]


def test_a_python_number_of_another_type_is_a_type_change() -> None:
    """scale=2 after scale=0.5: the int fails the float's type check, not a value check."""
    x = randn(4, 16, device=DEV)
    findings = _analyze(zoo.ScalarArg().to(DEV), (x, 0.5), extra=((x, 2),), shapes={"batch": (4,)})
    change = _one(findings, "recompile.type-change")
    assert change.data["input"] == "scale" and "type=<class 'float'>" in change.evidence
    assert "object-identity" not in {f.data.get("kind") for f in findings}


class _BreaksThenUsesTheBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        torch._dynamo.graph_break()
        return y.sum(-1) * y.shape[0]


def test_a_frame_resumed_after_a_graph_break_is_classified_in_its_own_frame() -> None:
    """Static shapes and three batch sizes: the entry frame recompiles on x, the frame resumed after the
    break on its local y; y is said to be a value live across the break, not the input, and
    dynamic=True (which reaches it, mark_dynamic on x does not) verified."""
    findings = _analyze(_BreaksThenUsesTheBatch(), (randn(2, 8, device=DEV),), dynamic=False,
                        shapes={"batch": (2, 4, 8)})
    entry = _one(findings, "recompile.dynamic-dim", input="x")
    assert "frame" not in entry.data and entry.data["recompiles_before"] == 2
    resumed = _one(findings, "recompile.dynamic-dim", input="y")
    assert resumed.data["frame"].startswith("torch_dynamo_resume_in_forward")
    assert resumed.data["recompiles_before"] == 2 and resumed.data["recompiles_after"] == 0
    assert "graph break" in resumed.title and "dynamic=True" in resumed.suggestion


def test_sweep_summary_names_extra_inputs_sizes_and_scalars() -> None:
    x = torch.randn(4, 16)
    findings = _analyze(zoo.ScalarArg(), (x, 0.5), extra=((torch.randn(3, 16), 0.5),), shapes={"batch": (4, 8)})
    evidence = _one(findings, "recompile.summary").evidence
    # each part says what the calls were: the extra input by name, then the values each swept thing took
    assert evidence.startswith("swept extra_inputs[0]; batch in {8}; scale in {0.25, 0.75} with dynamic=None")
    assert "in {}" not in evidence


def test_recompile_limit_is_reported() -> None:
    sizes = tuple(range(2, 2 + recompile_limit() + 3))
    findings = _analyze(zoo.Clean(), (torch.randn(2, 16),), dynamic=False, shapes={"batch": sizes})
    limit = _one(findings, "recompile.limit")
    assert limit.severity is Severity.ERROR
    assert "verified" in limit.evidence  # mark_dynamic keeps every call under the limit
    assert _one(findings, "recompile.summary").data["recompiles_after"] == 0


def test_raising_the_recompile_limit_is_verified_when_nothing_else_helps() -> None:
    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    x = torch.randn(4, 16)
    dtypes = (torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int16, torch.int8)
    extra = tuple((x.to(d),) for d in dtypes)
    # seven dtypes, a limit of four: only a higher limit keeps every call compiled
    with torch._dynamo.config.patch({recompile_limit_name(): 4}):
        findings = _analyze(Scale(), (x,), extra=extra, shapes={"batch": (4,)})
    limit = _one(findings, "recompile.limit")
    assert limit.data["limit"] == 4
    assert limit.data["limit_hit_after"] == 0
    assert f"{recompile_limit_name()} = {limit.data['raised_limit']}" in limit.suggestion
    assert {f.data.get("kind") for f in findings} >= {"dtype"}


def test_analysis_restores_dynamo_config() -> None:
    before = recompile_limit()
    _analyze(zoo.Clean(), (torch.randn(2, 16),), dynamic=False, shapes={"batch": (2, 3)})
    assert recompile_limit() == before


def test_nothing_to_vary_is_said_so() -> None:
    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / x.norm()

    findings = _analyze(Norm(), (torch.randn(()),))
    assert [f.id for f in findings] == ["recompile.no-sweep"]


def test_keyword_inputs_are_swept_by_name() -> None:
    ids = torch.randint(0, 32, (2, 6))
    ctx = AnalysisContext(
        zoo.TwoInputs(), (), {"ids": ids, "mask": torch.ones(2, 6)}, options=AnalysisOptions(measure_compile_time=False)
    )
    assert ctx.input_dims == {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch"}}
    findings = analyze_recompilations(ctx)
    names = {f.data.get("input") for f in findings if f.id == "recompile.dynamic-dim"}
    assert "ids" in names
    assert _one(findings, "recompile.summary").data["recompiles_after"] == 0


def test_failed_guard_parsing() -> None:
    reason = (
        "0/1: tensor 'x' size mismatch at index 0. expected 4, actual 8\n"
        "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 8"
    )
    assert failed_guard(reason) == "tensor 'x' size mismatch at index 0. expected 2, actual 8"
    scalar = "0/0: scale == 0.5        # return x * scale  # f.py:3 in forward\nUser stack trace:\n  ..."
    assert failed_guard(scalar) == "scale == 0.5"


@pytest.mark.parametrize(
    "reason, kind",
    [
        ("0/0: tensor 'x' stride mismatch at index 0. expected 16, actual 1", "stride"),
        ("0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0", "requires-grad"),
        ("0/0: len(xs) == 3", "container-length"),
        ("0/0: 2 <= L['x'].size()[0]", "shape-guard"),
        ("0/0: ___check_obj_id(L['self'].cfg, 1234)", "object-identity"),
        ("0/0: GLOBAL_STATE changed: grad_mode ", "grad-mode"),
    ],
)
def test_guard_classification(reason: str, kind: str) -> None:
    ctx = AnalysisContext(zoo.Clean(), (torch.randn(2, 16),), options=AnalysisOptions(measure_compile_time=False))
    assert classify_recompile(CompileRecord("0/1", "v", reason), ctx).kind == kind


@pytest.mark.parametrize(
    "guard, kind, name, dim",
    [
        ("tensor 'kwargs['ids']' size mismatch at index 1. expected 16, actual 8", "dynamic-dim", "kwargs['ids']", 1),
        ("tensor 'L['kwargs']['ids']' size mismatch at index 0. expected 2", "dynamic-dim", "L['kwargs']['ids']", 0),
        ("tensor 'kwargs['x']' dtype mismatch. expected Float, actual BFloat16", "dtype", "kwargs['x']", None),
        ("tensor 'L['batch']['x']' stride mismatch at index 0. expected 16, actual 1", "stride", "L['batch']['x']", 0),
        ("kwargs['scale'] == 0.5", "python-scalar", "kwargs['scale']", None),
        ("L['kwargs']['scale'] == 0.5", "python-scalar", "L['kwargs']['scale']", None),
        ("___check_type_id(L['scale'], 94000), type=<class 'float'>", "type-change", "L['scale']", None),
        ("___check_type_id(L['self'].cfg, 94000)", "object-identity", None, None),
    ],
)
def test_keyword_and_nested_guards_are_classified(guard: str, kind: str, name: str, dim: int | None) -> None:
    ctx = AnalysisContext(zoo.ScalarArg(), (), {"x": torch.randn(2, 16), "scale": 0.5})
    cause = classify_recompile(CompileRecord("0/1", "v", f"0/0: {guard}"), ctx)
    assert (cause.kind, cause.name, cause.dim) == (kind, name, dim)  # quotes inside the name kept


def test_a_guard_of_another_frame_is_not_resolved_to_an_input() -> None:
    ctx = AnalysisContext(zoo.ScalarArg(), (torch.randn(2, 16), 0.5))
    reason = "1/0: tensor 'x' size mismatch at index 0. expected 2, actual 4"
    inner = classify_recompile(CompileRecord("1/1", "batch=4", reason, co_name="loss_fn"), ctx, root_frame=0)
    assert inner.kind == "dynamic-dim" and not inner.root and inner.frame == "loss_fn"
    root = classify_recompile(CompileRecord("0/1", "batch=4", reason, co_name="forward"), ctx, root_frame=0)
    assert root.root and root.variant == "batch=4"
    # a number compared in another frame is still a Python scalar; a module attribute is not
    scalar = classify_recompile(CompileRecord("1/1", "v", "1/0: alpha == 0.25", co_name="f"), ctx, root_frame=0)
    attr = classify_recompile(CompileRecord("1/1", "v", "1/0: L['self'].p == 0.25", co_name="f"), ctx, root_frame=0)
    assert (scalar.kind, attr.kind) == ("python-scalar", "object-identity")


def test_each_recompile_is_named_by_what_its_call_changed() -> None:
    # compiled static: each batch size is a new entry, and torch reports the guard that fails against
    # the newest one; the sweep moves the example's entry to the front first, so the scalar calls are
    # named by the scalar, not by the batch size of the call before them
    findings = _analyze(zoo.ScalarArg(), (torch.randn(4, 16), 0.5), dynamic=False, shapes={"batch": (4, 8, 12)})
    assert _one(findings, "recompile.dynamic-dim").data["recompiles_before"] == 2
    assert _one(findings, "recompile.python-scalar").data["recompiles_before"] == 2
