"""Graph breaks of the zoo: each one named at the zoo's offending line with the fix for its kind."""

from __future__ import annotations

import inspect
import traceback
from pathlib import Path

import pytest
import rich.console
import torch

from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import Finding, Location, Severity
from kernel_pytorch.assistant.readiness.graph_breaks import library_fix
from kernel_pytorch.assistant.readiness.readiness import (
    analyze_readiness,
    classify_break,
    dedupe_breaks,
    torch_explanation,
)
from kernel_pytorch.assistant.records import BreakRecord
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


@pytest.mark.parametrize(
    "reason, kind",
    [
        ("Attempted to wrap RNN, GRU, or LSTM\n  Explanation: Dynamo does not support RNN, GRU, or LSTM.", "rnn"),
        ("step_unsupported", "nested-break"),
    ],
)
def test_classification_of_rnn_and_nested_breaks(reason: str, kind: str) -> None:
    found = classify_break(reason, "h, _ = self.rnn(x)")
    assert found.kind == kind
    assert "allow_rnn = True" in found.fix if kind == "rnn" else "inside the function" in found.fix


def test_an_unknown_break_takes_torchs_hint_as_its_fix() -> None:
    reason = "Something new\n  Explanation: torch cannot do this.\n  Hint: Use torch.foo() instead."
    assert classify_break(reason, "weird()").fix == "Use torch.foo() instead."


def _record(reason: str, *frames: tuple[str, int, str]) -> BreakRecord:
    return BreakRecord(reason, tuple(traceback.FrameSummary(f, line, name) for f, line, name in frames))


def test_a_caller_stopped_by_a_break_it_inlined_is_merged_into_that_break() -> None:
    """GPT-2 with labels: a logging call inside an inlined library property breaks the graph, and
    Dynamo reports the caller's line once more as `step_unsupported`."""
    caller = (ZOO_FILE, zoo.line_of("helper-print") + 8, "forward")
    inner = (ZOO_FILE, zoo.line_of("helper-print"), "_chatty")
    logging_break = "logging.Logger method not supported\n  Explanation: logging.Logger methods are not supported."
    breaks = dedupe_breaks([_record(logging_break, caller, inner), _record("step_unsupported", caller)])
    assert [b.kind.kind for b in breaks] == ["print"]  # the helper's line is a print
    assert [c.line for c in breaks[0].callers] == [caller[1]]


def test_a_logging_break_in_library_code_gets_the_ignore_setting() -> None:
    library = inspect.getsourcefile(rich.console) or ""
    reason = (
        "logging.Logger method not supported for non-export cases\n  Explanation: logging.Logger methods are not "
        "supported.\n  Developer debug context: method: <Logger transformers.modeling_utils (WARNING)>.warning_once, "
        "args: [ConstantVariable(str: '`loss_type=None` was set in the config but it is unrecognized.')]"
    )
    (brk,) = dedupe_breaks([_record(reason, (ZOO_FILE, zoo.line_of("print"), "forward"), (library, 10, "print"))])
    assert brk.location is not None and brk.location.file == library
    assert brk.location.via is not None and brk.location.via.line == zoo.line_of("print")
    fix = library_fix(brk.kind, brk.reason, brk.location)
    assert fix is not None and "torch._dynamo.config.ignore_logging_functions.add(logging.Logger.warning_once)" in fix
    assert 'model.loss_type = "ForCausalLM"' in fix
    assert library_fix(brk.kind, brk.reason, Location(ZOO_FILE, zoo.line_of("print"))) is None  # the user's own code


class _Gru(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def test_an_rnn_frame_fallback_names_the_frame_and_the_verified_allow_rnn_fix() -> None:
    findings = _readiness(_Gru(), torch.randn(2, 5, 8))
    rnn = [f for f in findings if f.data.get("kind") == "rnn"]
    assert len(rnn) == 1 and rnn[0].id in ("readiness.frame-fallback", "graph-break.rnn")
    assert "torch._dynamo.config.allow_rnn = True" in rnn[0].suggestion
    assert rnn[0].data["verified"] is True and rnn[0].data["graphs_after"] == 1
    if rnn[0].id == "readiness.frame-fallback":
        assert "`_Gru.forward`" in rnn[0].title
        graphs = next(f for f in findings if f.id == "readiness.graphs")
        assert graphs.data["graph_count"] == 0 and graphs.title.startswith("Nothing was compiled")
        fullgraph = next(f for f in findings if f.id == "readiness.fullgraph")
        assert "gives up on" in fullgraph.title and "Attempted" not in fullgraph.evidence  # said once
        assert "above" not in fullgraph.title + fullgraph.suggestion


def test_a_passing_fullgraph_check_carries_no_fix() -> None:
    fullgraph = next(f for f in _readiness(zoo.Clean(), torch.randn(4, 16)) if f.id == "readiness.fullgraph")
    assert fullgraph.data["fullgraph"] is True and not fullgraph.suggestion


def test_torchs_words_carry_no_raw_reprs() -> None:
    reason = (
        "Unsupported method call\n  Explanation: Dynamo does not know how to trace method `keys` of class "
        "<class 'my.Config'> on <my.Config object at 0x7f3a2b1c0d90>.\n  Hint: Avoid <class 'my.Config'> here."
    )
    text, hints = torch_explanation(reason)
    assert "<class" not in text and "object at 0x" not in text and "my.Config on my.Config" in text
    assert hints == ["Avoid my.Config here."]


class _GruThenPrint(_Gru):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rnn(x)[0]
        print("hidden", y.shape)  # fullgraph=True rejects this even with allow_rnn
        return y


def test_allow_rnn_that_does_not_verify_says_why() -> None:
    rnn = [f for f in _readiness(_GruThenPrint(), torch.randn(2, 5, 8)) if f.data.get("kind") == "rnn"]
    assert len(rnn) == 1 and rnn[0].data["verified"] is False
    assert rnn[0].data["unverified_reason"] and "Not verified here" in rnn[0].suggestion
    assert rnn[0].estimated_gain is None
