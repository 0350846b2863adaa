"""The assistant end to end: sections, JSON, rendering, and an analysis that fails inside itself."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

import kernel_pytorch as kp
from kernel_pytorch.assistant import SECTIONS, Finding, Location, Report, Severity
from kernel_pytorch.assistant import assistant as assistant_module
from kernel_pytorch.assistant.report.render import headline, render_terminal, to_json, to_markdown
from tests.assistant import zoo

NO_COMPILE = kp.AnalysisOptions(measure_compile_time=False)


@pytest.fixture(scope="module")
def report() -> Report:
    torch.manual_seed(0)
    model = zoo.ItemCall()
    options = kp.AnalysisOptions(measure_compile_time=False, shapes={"batch": [4, 8]})
    assistant = kp.CompilerOptimizationAssistant(options)
    return assistant.analyze_component(model, (torch.randn(4, 16),))


def test_report_has_every_section_and_names_the_break(report: Report) -> None:
    assert [name for name, _ in report.sections()] == list(SECTIONS)
    (item,) = report.by_id("graph-break.item")
    assert item.location is not None and item.location.line == zoo.line_of("item")
    assert report.compile_time[0].id == "compile-time.skipped"
    assert report.section("fusion_opportunities") == ()  # nothing to fuse in ItemCall
    assert report.memory_bottlenecks[0].id == "memory.summary"
    assert "kernel.summary" in {f.id for f in report.kernel_efficiency}  # eager only: nothing compiled
    assert {f.data["source_id"] for f in report.optimization_suggestions} >= {"graph-break.item"}
    assert report.model == "ItemCall"
    assert report.meta["sweep"] == {"batch": [4, 8]}
    assert set(report.meta["seconds"]) >= {"compilation_readiness", "recompilations", "total"}


def test_findings_are_sorted_worst_first(report: Report) -> None:
    for _, findings in report.sections():
        ranks = [f.severity.rank for f in findings]
        assert ranks == sorted(ranks, reverse=True)


def test_json_round_trip(report: Report) -> None:
    data = json.loads(to_json(report))
    assert set(data["sections"]) == set(SECTIONS)
    ids = [f["id"] for f in data["sections"]["compilation_readiness"]]
    assert "graph-break.item" in ids
    loc = next(f for f in data["sections"]["compilation_readiness"] if f["id"] == "graph-break.item")["location"]
    assert loc["line"] == zoo.line_of("item")
    assert data["headline"]["graph_breaks"] == 1
    assert data["counts"] == report.counts()


def test_markdown_and_terminal_show_every_finding(report: Report) -> None:
    md = to_markdown(report)
    console = Console(record=True, width=200)
    render_terminal(report, console, verbose=True)
    text = console.export_text()
    for f in report.findings():
        assert f.title in md
        assert f.title in text
    short = Console(record=True, width=400)
    render_terminal(report, short)  # one line per finding: every title but the suggestions' past the top ones
    lines = short.export_text()
    assert all(f.title in lines for f in report.findings() if not f.id.startswith("suggestion."))
    assert "## Compilation readiness" in md
    assert f"zoo.py:{zoo.line_of('item')}" in text


def test_headline_numbers(report: Report) -> None:
    h = headline(report)
    assert h["graph_breaks"] == 1 and h["fullgraph"] is False
    assert h["recompiles_before"] >= 1 and h["recompiles_after"] is not None


def test_an_analysis_that_raises_becomes_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(ctx: object) -> list[Finding]:
        raise KeyError("bug in an analysis")

    steps = (assistant_module._Step("compile_time", "compile time", explode), *assistant_module.STEPS[:1])
    monkeypatch.setattr(assistant_module, "STEPS", steps)
    report = kp.CompilerOptimizationAssistant(NO_COMPILE).analyze_component(
        zoo.Clean(), torch.randn(2, 16)
    )
    (failed,) = report.compile_time
    assert failed.id == "analysis-error.compile_time" and failed.severity is Severity.ERROR
    assert "bug in an analysis" in failed.evidence
    assert report.by_id("readiness.graphs")  # the other analyses still ran


def test_keyword_inputs_and_dtype_option() -> None:
    inputs = {"ids": torch.randint(0, 32, (2, 5)), "mask": torch.ones(2, 5, dtype=torch.float64)}
    report = kp.CompilerOptimizationAssistant(NO_COMPILE, dtype=torch.float64).analyze_component(
        zoo.TwoInputs(), inputs
    )
    assert report.meta["dtype"] == "float64"
    assert report.meta["inputs"] == {"ids": "int64[2, 5]", "mask": "float64[2, 5]"}
    assert report.by_id("readiness.graphs")[0].data["break_count"] == 0


def test_finding_is_frozen_data() -> None:
    f = Finding("x.y", Severity.INFO, "t", "e", Location("f.py", 3, "fn", "a = 1"))
    with pytest.raises(AttributeError):
        f.title = "other"  # type: ignore[misc]
    assert f.to_dict()["location"] == {"file": "f.py", "line": 3, "function": "fn", "code": "a = 1"}
    assert str(f.location) == "f.py:3"


def test_options_are_one_object_and_the_old_keywords_say_where_they_went() -> None:
    assistant = kp.CompilerOptimizationAssistant(NO_COMPILE, sections=["compilation_readiness"])
    assert assistant.options.measure_compile_time is False
    assert assistant.options.kernel_profile is False  # no kernel section: the compile measures no forward
    assert kp.AnalysisOptions(shapes={"batch": range(1, 3)}).shapes == {"batch": (1, 2)}
    with pytest.raises(TypeError, match=r"AnalysisOptions\(measure_compile_time=False, train=True\)"):
        kp.CompilerOptimizationAssistant(measure_compile_time=False, train=True)
    with pytest.raises(TypeError, match="unexpected keyword argument.*'colour'"):
        kp.CompilerOptimizationAssistant(colour="red")
    with pytest.raises(TypeError, match="must be an AnalysisOptions, got dict"):
        kp.CompilerOptimizationAssistant({"train": True})
