"""Graph breaks of the zoo: each one named at the zoo's offending line with the fix for its kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.assistant.readiness import analyze_readiness, classify_break
from tests.assistant import zoo

ZOO_FILE = str(Path(zoo.__file__).resolve())

# model, zoo marker of the offending line, finding id, text its fix must contain
BREAKS = [
    (zoo.DataDependentBranch, "branch", "graph-break.data-dependent-branch", "torch.where"),
    (zoo.ItemCall, "item", "graph-break.item", "capture_scalar_outputs"),
    (zoo.PrintCall, "print", "graph-break.print", "torch.compiler.disable"),
    (zoo.LoggingCall, "logging", "graph-break.logging", "torch.compiler.is_compiling"),
    (zoo.NumpyCall, "numpy", "graph-break.numpy", "torch equivalent"),
    (zoo.UnsupportedBuiltin, "builtin", "graph-break.unsupported-builtin", "torch.compiler.disable"),
]


def _readiness(model: torch.nn.Module, *args: object, **options: object) -> list[Finding]:
    ctx = AnalysisContext(model, args, options=AnalysisOptions(measure_compile_time=False, **options))
    return analyze_readiness(ctx)


@pytest.fixture(scope="module")
def zoo_findings() -> dict[type, list[Finding]]:
    torch.manual_seed(0)
    return {cls: _readiness(cls(), torch.randn(4, 16)) for cls, *_ in BREAKS}


@pytest.mark.parametrize("cls, marker, finding_id, fix", BREAKS, ids=[b[1] for b in BREAKS])
def test_each_break_is_named_at_its_line_with_its_fix(
    zoo_findings: dict[type, list[Finding]], cls: type, marker: str, finding_id: str, fix: str
) -> None:
    breaks = [f for f in zoo_findings[cls] if f.id.startswith("graph-break.")]
    assert [f.id for f in breaks] == [finding_id]
    (found,) = breaks
    assert found.severity is Severity.WARNING
    assert found.location is not None
    assert Path(found.location.file).resolve() == Path(ZOO_FILE)
    assert found.location.line == zoo.line_of(marker)
    assert f"ZOO:{marker}" in (found.location.code or "")
    assert fix in found.suggestion
    assert found.evidence  # torch's own explanation
    graphs = next(f for f in zoo_findings[cls] if f.id == "readiness.graphs")
    assert graphs.data["break_count"] == 1
    assert graphs.data["graph_count"] >= 1
    fullgraph = next(f for f in zoo_findings[cls] if f.id == "readiness.fullgraph")
    assert fullgraph.data["fullgraph"] is False


def test_builtin_names_the_call(zoo_findings: dict[type, list[Finding]]) -> None:
    found = [f for f in zoo_findings[zoo.UnsupportedBuiltin] if f.id.startswith("graph-break")]
    assert "time.time" in found[0].title


def test_clean_model_has_no_breaks_and_fullgraph_works() -> None:
    findings = _readiness(zoo.Clean(), torch.randn(4, 16))
    assert not [f for f in findings if f.id.startswith("graph-break")]
    graphs = next(f for f in findings if f.id == "readiness.graphs")
    assert graphs.data == {"graph_count": 1, "ops_per_graph": [3], "break_count": 0}
    fullgraph = next(f for f in findings if f.id == "readiness.fullgraph")
    assert fullgraph.data["fullgraph"] is True and fullgraph.severity is Severity.INFO


def test_same_line_reached_twice_is_one_finding_with_two_call_sites() -> None:
    breaks = [f for f in _readiness(zoo.BreakTwiceSameLine(), torch.randn(4, 16)) if f.id.startswith("graph-break")]
    assert len(breaks) == 1
    assert breaks[0].location is not None and breaks[0].location.line == zoo.line_of("helper-print")
    assert breaks[0].data["call_sites"] == 2


def test_model_that_raises_eagerly_is_a_finding() -> None:
    findings = _readiness(zoo.RaisesEagerly(), torch.randn(4, 16))
    assert [f.id for f in findings] == ["readiness.eager-failed"]
    assert findings[0].severity is Severity.ERROR
    assert findings[0].location is not None and findings[0].location.line == zoo.line_of("raise-eager")
    assert "RuntimeError" in findings[0].evidence


def test_model_that_raises_only_when_traced_is_a_finding() -> None:
    findings = _readiness(zoo.RaisesWhenTraced(), torch.randn(4, 16))
    fallback = [f for f in findings if f.id == "readiness.frame-fallback"]
    assert len(fallback) == 1 and fallback[0].severity is Severity.ERROR
    assert fallback[0].location is not None and fallback[0].location.line == zoo.line_of("raise-traced")
    assert next(f for f in findings if f.id == "readiness.fullgraph").data["fullgraph"] is False


def test_a_backend_that_raises_is_a_finding_not_a_crash() -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("backend exploded")

    findings = _readiness(zoo.Clean(), torch.randn(4, 16), trace_backend=broken)
    failed = [f for f in findings if f.id == "readiness.trace-failed"]
    assert len(failed) == 1 and failed[0].severity is Severity.ERROR
    assert "backend exploded" in failed[0].evidence


@pytest.mark.parametrize(
    "reason, code, kind",
    [
        # torch before structured graph-break messages, and after
        ("generic_jump TensorVariable()", "if y.sum() > 0:", "data-dependent-branch"),
        (
            "Data-dependent branching\n  Explanation: Detected data-dependent branching",
            "if x.max() > 1:",
            "data-dependent-branch",
        ),
        ("Tensor.item", "v = t.item()", "item"),
        ("Unsupported Tensor.item() call with capture_scalar_outputs=False", "v = t.item()", "item"),
        ("call_function BuiltinVariable(print) [ConstantVariable()] {}", "print('x')", "print"),
        (
            "Failed to trace builtin operator\n  Explanation: builtin operator `print` with argument types",
            "print(1)",
            "print",
        ),
        (
            "Attempted to call function marked as skipped\n  Explanation: Dynamo does not know how to trace the "
            "Python builtin `_warnings.warn`.",
            "warnings.warn('x')",
            "logging",
        ),
        ("attempted to trace numpy function unsupported by PyTorch", "np.interp(a, b, c)", "numpy"),
        (
            "Dynamic shape operator\n  Explanation: Operator `aten.nonzero.default`'s output shape depends",
            "i = x.nonzero()",
            "dynamic-shape-op",
        ),
        ("Call to `torch._dynamo.graph_break()`", "torch._dynamo.graph_break()", "user-break"),
        ("something new in a future torch", "weird()", "other"),
    ],
)
def test_classification_of_torch_messages(reason: str, code: str, kind: str) -> None:
    assert classify_break(reason, code).kind == kind
