"""Rendering: a location inside a library shows the user's line that led there, a finding at several
lines shows each; sections whose
analysis never ran read "not analysed", not "No findings"; the report's meta names a dtype."""

from __future__ import annotations

import json

import torch
from rich.console import Console
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.assistant import Finding, Location, Report, Severity
from kernel_pytorch.assistant.report.html import to_html
from kernel_pytorch.assistant.report.render import render_terminal, to_json, to_markdown

_VIA = Location("/proj/model.py", 12, "forward", "return self.blocks(x)")
_LIB = Location("/site-packages/lib/layers.py", 40, "forward", "log.warning('x')", via=_VIA)
_REPORT = Report(
    model="M",
    meta={"sections_run": ["compilation_readiness"]},
    compilation_readiness=(Finding("graph-break.logging", Severity.WARNING, "Graph break: logging", "e", _LIB),),
)


def _terminal(report: Report, verbose: bool = True) -> str:
    console = Console(record=True, width=200)
    render_terminal(report, console, verbose=verbose)
    return console.export_text()


def test_a_library_location_shows_the_line_that_led_there() -> None:
    text = _terminal(_REPORT)
    assert "at /site-packages/lib/layers.py:40  log.warning('x')" in text
    assert "via /proj/model.py:12  return self.blocks(x)" in text
    assert "via `/proj/model.py:12` `return self.blocks(x)`" in to_markdown(_REPORT)
    loc = json.loads(to_json(_REPORT))["sections"]["compilation_readiness"][0]["location"]
    assert loc["via"] == {"file": "/proj/model.py", "line": 12, "function": "forward", "code": "return self.blocks(x)"}


def test_sections_that_did_not_run_read_not_analysed() -> None:
    text = _terminal(_REPORT, verbose=False)
    assert "No findings" not in text
    assert "Recompilations, Compile time, Fusion opportunities" in text and "not analysed" in text
    md = to_markdown(_REPORT)
    assert "## Compile time\n\nNot analysed" in md and "No findings." not in md
    # a report built without the list (by hand, or by an older version): every empty section ran
    assert "No findings: Recompilations" in _terminal(Report(model="M", compilation_readiness=_REPORT.findings()))


def test_meta_dtype_of_a_model_without_parameters() -> None:
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False, vary_scalars=False))
    report = assistant.analyze_component(nn.GELU(), (torch.randn(2, 4, dtype=torch.float64),))
    assert report.meta["dtype"] == "float64"
    run = report.meta["sections_run"]
    assert {"compilation_readiness", "recompilations", "compile_time", "fusion_opportunities",
            "memory_bottlenecks", "kernel_efficiency"} <= set(run)
    assert run[-1] == "optimization_suggestions"
    ints = assistant.analyze_component(nn.Identity(), (torch.arange(3),))
    assert ints.meta["dtype"] == "no parameters"


def test_a_finding_at_several_lines_shows_each_once_with_the_call_that_led_there() -> None:
    other = Location("/site-packages/lib/layers.py", 44, "forward", "log.info('y')", via=_VIA)
    f = Finding("fusion.rope", Severity.INFO, "RoPE", "e", _LIB, more_locations=(other,))
    assert f.locations == (_LIB, other)
    report = Report(model="M", meta={"sections_run": ["fusion_opportunities"]}, fusion_opportunities=(f,))
    text = _terminal(report)
    assert "at /site-packages/lib/layers.py:40" in text and "at /site-packages/lib/layers.py:44" in text
    assert text.count("via /proj/model.py:12") == 1
    md = to_markdown(report)
    assert "`/site-packages/lib/layers.py:40` `log.warning('x')`, `/site-packages/lib/layers.py:44`" in md
    assert md.count("via `/proj/model.py:12`") == 1
    data = json.loads(to_json(report))["sections"]["fusion_opportunities"][0]
    assert [loc["line"] for loc in data["locations"]] == [40, 44] and data["location"]["line"] == 40
    assert "layers.py:44" in to_html(report)
