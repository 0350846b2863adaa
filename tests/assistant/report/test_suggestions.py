"""The ranked suggestions and the short report agree with the report's own measurements: the kind of
problem ranks first (correctness, graph breaks and recompilations, speed, compile time, memory), a cost
is never read as a gain, a fix measured slower is listed as tried instead of suggested, suggestions do
not repeat their findings, the verdict's words agree with its ratio, and the order is the same on a
second run."""

from __future__ import annotations

import random

import torch
from rich.console import Console
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.compile_time.compile_time import _REGIONAL
from kernel_pytorch.assistant.context import AnalysisOptions
from kernel_pytorch.assistant.dynamo import readable
from kernel_pytorch.assistant.findings import Finding, Location, Report, Severity
from kernel_pytorch.assistant.kernels.profile import RuntimeProfile
from kernel_pytorch.assistant.kernels.profiler import profile_steps
from kernel_pytorch.assistant.report.render import render_terminal, verdict_text
from kernel_pytorch.assistant.report.suggestions import analyze_suggestions, rank
from kernel_pytorch.benchmark.timer import Timing
from kernel_pytorch.models import build_model


class _Ctx:
    """A context whose kernel profile measured a 2 ms eager forward."""

    module = nn.Linear(64, 64)
    options = AnalysisOptions()

    def __init__(self, findings: dict[str, list[Finding]] | None = None) -> None:
        step = Timing(2.0, 1.9, 2.1, 1.8, 2.2, 9, "t")
        self.runtime = RuntimeProfile("cpu", "cpu", None, timings={"eager fwd": step})
        self.findings = findings or {}


_AT = Location("/proj/model.py", 7, "forward", "y = x.item()")


def _f(id: str, severity: Severity = Severity.WARNING, gain: str | None = None, **data: object) -> Finding:
    return Finding(id=id, severity=severity, title=id, evidence=f"evidence of {id}", location=_AT,
                   suggestion=f"fix {id}", estimated_gain=gain, data=data)


def test_correctness_and_graph_breaks_outrank_byte_savings() -> None:
    findings = [
        _f("memory.autocast", Severity.INFO, "about 59 KiB less activation memory", freed_bytes=59 * 1024),
        _f("fusion.rms-norm", Severity.INFO, "24 us", seconds_saved=24e-6),
        _f("graph-break.item"),
        _f("compile-time.failed", Severity.ERROR),
        _f("recompile.dynamic-dim", gain="1 -> 0 recompiles (verified)"),
    ]
    order = [f.id for _, f, _ in rank(_Ctx(), findings)]
    assert order == ["compile-time.failed", "graph-break.item", "recompile.dynamic-dim", "fusion.rms-norm",
                     "memory.autocast"]


def test_a_cost_in_time_is_not_ranked_as_a_gain() -> None:
    # activation checkpointing frees memory and costs a recompute: its ms are a cost
    ckpt = _f("memory.checkpointing", Severity.WARNING,
              "about 591 KiB less peak memory, for about 105 ms more per step", freed_bytes=591 * 1024, cost_ms=105.0)
    fusion = _f("fusion.rope", Severity.INFO, "23 us", seconds_saved=23e-6)
    ((_, first, g1), (score, second, g2)) = rank(_Ctx(), [ckpt, fusion])
    assert (first.id, second.id) == ("fusion.rope", "memory.checkpointing")
    assert g2["ms"] is None and g2["bytes"] == 591 * 1024
    out = analyze_suggestions(_Ctx({"memory_bottlenecks": [ckpt], "fusion_opportunities": [fusion]}))
    assert "of the step time" not in out[1].estimated_gain and "of the peak memory" in out[1].estimated_gain


def test_a_fix_measured_slower_is_listed_as_tried_not_suggested() -> None:
    sdpa = Finding("kernel.sdpa-repeat-kv", Severity.INFO, "Attention could take another path", "e",
                   Location("/proj/model.py", 30), suggestion="",
                   data={"ms_as_made": 0.017, "ms_fixed": 7.518, "fix_slower": True, "fix": "sdpa.enable_gqa",
                         "gain_ms": 0.0, "measured": True})
    gqa = _f("fusion.gqa-repeat", Severity.INFO, "9.75 us", seconds_saved=9.75e-6, fix="sdpa.enable_gqa")
    other = _f("fusion.rms-norm", Severity.INFO, "24 us", seconds_saved=24e-6)
    out = analyze_suggestions(_Ctx({"fusion_opportunities": [gqa, other], "kernel_efficiency": [sdpa]}))
    assert [f.id for f in out] == [
        "suggestion.fusion.rms-norm", "tried.fusion.gqa-repeat", "tried.kernel.sdpa-repeat-kv"
    ]
    tried = out[1]
    assert not tried.suggestion and "0.017 ms as made, 7.52 ms fixed" in tried.title
    assert tried.data["measured_by"] == "kernel.sdpa-repeat-kv" and "rank" not in tried.data


def test_suggestions_point_at_their_finding_instead_of_repeating_it() -> None:
    f = _f("fusion.rms-norm", Severity.INFO, "24 us", seconds_saved=24e-6)
    (s,) = analyze_suggestions(_Ctx({"fusion_opportunities": [f]}))
    assert f.evidence not in s.evidence and "Fusion opportunities" in s.evidence and "`fusion.rms-norm`" in s.evidence
    assert s.suggestion == f.suggestion and s.location == f.location and not s.more_locations


def test_the_order_does_not_depend_on_the_order_findings_arrive_in() -> None:
    findings = [_f(f"fusion.k{i}", Severity.INFO, None, seconds_saved=1e-4 * (1 + i // 2)) for i in range(8)]
    findings += [_f("graph-break.a"), _f("graph-break.b"), _f("memory.m", Severity.INFO, None, freed_bytes=4096)]
    expected = [f.id for _, f, _ in rank(_Ctx(), findings)]
    for seed in range(5):
        shuffled = findings[:]
        random.Random(seed).shuffle(shuffled)
        assert [f.id for _, f, _ in rank(_Ctx(), shuffled)] == expected


def test_the_verdict_reads_as_its_ratio_says() -> None:
    assert verdict_text("no difference", 1.75) == "no measurable difference (median 1.75x, within the timing noise)"
    assert verdict_text("compile", 1.8) == "compile, 1.80x faster"
    assert verdict_text("eager", 0.8) == "eager, compiled 1.25x slower"


def test_cross_references_name_the_finding_not_a_position() -> None:
    for text in _REGIONAL.values():
        said = text.format(blocks="2 identical `Block` blocks")
        assert "below" not in said and "above" not in said and "`Block`" in said


def test_dynamo_source_names_read_as_the_code_spells_them() -> None:
    guard = "___check_obj_id(G['__import_transformers_dot_models_dot_qwen2_dot_modeling_qwen2'].F, 1)"
    assert readable(guard) == "___check_obj_id(transformers.models.qwen2.modeling_qwen2.F, 1)"
    assert readable("L['self']._modules['mlp'].act_fn, L['input_ids']") == "self.mlp.act_fn, input_ids"


def test_profiled_ops_are_counted_per_step_without_the_profilers_start_up() -> None:
    a = torch.randn(64, 64)
    run = profile_steps(lambda: (a @ a) @ a, 3, "cpu", "eager", "fwd")
    mm = [k for k in run.kernels if k.op == "aten::mm"]
    assert sum(k.calls for k in mm) == 2.0  # two matmuls per counted step, the uncounted first one left out
    assert run.kernel_ms <= run.wall_ms


def _long_report() -> Report:
    fixes = tuple(Finding(f"suggestion.fusion.k{i}", Severity.INFO, f"#{i + 1}: fix {i}", "details: Fusion", _AT,
                          suggestion=f"do {i}", estimated_gain="[estimated] 1 us", data={"rank": i + 1})
                  for i in range(8))
    fusion = tuple(Finding(f"fusion.k{i}", Severity.INFO, f"pattern {i}", "a long evidence " * 20, _AT,
                           suggestion=f"do {i}") for i in range(8))
    return Report(model="M", fusion_opportunities=fusion, optimization_suggestions=fixes)


def test_the_terminal_report_is_short_and_verbose_gives_the_details() -> None:
    short, full = Console(record=True, width=120), Console(record=True, width=120)
    render_terminal(_long_report(), short)
    render_terminal(_long_report(), full, verbose=True)
    text, verbose = short.export_text(), full.export_text()
    assert "a long evidence" not in text and "a long evidence" in verbose
    assert "#5: fix 4" in text and "#6: fix 5" not in text and "#8: fix 7" in verbose
    assert sum("pattern" in line for line in text.splitlines()) == 8  # one line per finding
    assert len(text.splitlines()) < len(verbose.splitlines()) / 2


def test_two_runs_on_one_model_suggest_in_the_same_order() -> None:
    model, inputs = build_model("llama-tiny", device="cpu", dtype=torch.float32)
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False, vary_scalars=False))
    orders = []
    for _ in range(2):
        report = assistant.analyze_component(model, inputs)
        orders.append([(f.id, str(f.location)) for f in report.optimization_suggestions])
    assert orders[0] == orders[1] and orders[0]
