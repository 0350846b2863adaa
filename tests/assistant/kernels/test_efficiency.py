"""Kernel efficiency, the compile verdict, SDPA fast paths, ranked suggestions and the HTML report:
structure on the CPU (the numbers measured here are CPU op times; GPU values in the cuda tests)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.context import AnalysisOptions
from kernel_pytorch.assistant.findings import Finding, Report, Severity
from kernel_pytorch.assistant.kernels.profile import RuntimeProfile
from kernel_pytorch.assistant.kernels.sdpa import NO_GAIN, is_causal_mask, repeat_factor
from kernel_pytorch.assistant.kernels.verdict import pass_verdict
from kernel_pytorch.assistant.report.charts import breakdown_svg, chart_images, roofline_svg
from kernel_pytorch.assistant.report.html import to_html
from kernel_pytorch.assistant.report.render import to_json, to_markdown
from kernel_pytorch.assistant.report.suggestions import gain_of, rank
from kernel_pytorch.benchmark.timer import Timing


class SlowAttention(nn.Module):
    """Causal GQA attention written the slow way: a materialised mask and K/V repeated to 4 heads."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2, fast: bool = False) -> None:
        super().__init__()
        self.h, self.kv, self.d, self.fast = heads, kv_heads, dim // heads, fast
        self.q = nn.Linear(dim, dim)
        self.kv_proj = nn.Linear(dim, 2 * kv_heads * self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.d).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, t, 2, self.kv, self.d).permute(2, 0, 3, 1, 4)
        if self.fast:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = k.repeat_interleave(self.h // self.kv, dim=1), v.repeat_interleave(self.h // self.kv, dim=1)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the slow call
        return out.transpose(1, 2).reshape(b, t, -1)


def _line(marker: str) -> int:
    src = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(src, 1) if marker in text)


@functools.cache
def _report(fast: bool = False) -> Report:
    torch.manual_seed(0)
    assistant = kp.CompilerOptimizationAssistant(
        kp.AnalysisOptions(backend="aot_eager", train=not fast, vary_scalars=False, measure_compile_time=not fast),
        sections=["compile_time", "kernel_efficiency", "optimization_suggestions"],
    )  # fmt: skip
    return assistant.analyze_component(SlowAttention(fast=fast), (torch.randn(2, 16, 32),))


def test_kernel_section_profiles_eager_and_compiled_forward_and_backward() -> None:
    report = _report()
    summaries = {f.data["run"]: f for f in report.kernel_efficiency if f.id == "kernel.summary"}
    assert set(summaries) == {"eager fwd", "compiled fwd", "eager fwd+bwd", "compiled fwd+bwd"}
    eager = summaries["eager fwd"].data
    assert eager["kernel_count"] > 0 and eager["step_ms"] > 0 and 0 < eager["top5_share"] <= 1.0001
    assert eager["ceilings"] is None and "not measured on the CPU" in summaries["eager fwd"].evidence
    mm = next(k for k in eager["kernels"] if k["op"] == "aten::addmm")
    assert mm["flops"] > 0 and mm["tflops"] > 0 and mm["pct_of_matmul"] is None  # no CPU roofs
    assert report.meta["sections_run"] == ["compile_time", "kernel_efficiency", "optimization_suggestions"]


def test_verdict_is_measured_for_both_passes() -> None:
    (verdict,) = [f for f in _report().kernel_efficiency if f.id == "verdict.compile"]
    assert [p["pass"] for p in verdict.data["passes"]] == ["fwd", "fwd+bwd"] and verdict.data["pass"] == "fwd+bwd"
    for p in verdict.data["passes"]:
        assert p["measured"] and p["eager_ms"] > 0 and p["compiled_ms"] > 0 and p["compile_s"] is not None
        assert p["verdict"] in ("compile", "eager", "no difference", "unreliable")
    assert verdict.data["verdict"] in verdict.title.lower() or "compil" in verdict.title.lower()


def test_sdpa_that_lost_its_fast_path_is_found_at_its_line_with_a_measured_fix() -> None:
    (f,) = [f for f in _report().kernel_efficiency if f.id.startswith("kernel.sdpa")]
    assert f.id == "kernel.sdpa-causal-mask-repeat-kv"
    # a warning when the fixed call measured faster in every round; a fix measured no faster in some round
    # (timing noise) is information. Faster in every round is faster in the median too.
    no_gain = f.data["fix_slower"]
    assert no_gain or f.data["ms_fixed"] <= f.data["ms_as_made"] * (1 - NO_GAIN)
    assert f.severity == (Severity.INFO if no_gain else Severity.WARNING)
    assert ("none measured" in f.estimated_gain) == no_gain
    assert f.location is not None and f.location.line == _line("# the slow call")
    assert f.data["causal_mask"] and f.data["repeat"] == 2 and f.data["measured"] and f.data["same_output"]
    # the fix is suggested when it measured faster, else reported as tried (in the evidence)
    fix = f.evidence if no_gain else f.suggestion
    assert "is_causal=True" in fix and "enable_gqa=True" in fix and (f.suggestion == "") == no_gain
    assert f.data["fix_slower"] == no_gain and f.data["fix"] == "sdpa.is_causal+enable_gqa"
    assert not [f for f in _report(fast=True).kernel_efficiency if f.id.startswith("kernel.sdpa")]


def test_causal_mask_and_repeat_detection_by_value() -> None:
    tril = torch.ones(6, 6, dtype=torch.bool).tril()
    assert is_causal_mask(tril, 6, 6) and not is_causal_mask(~tril, 6, 6) and not is_causal_mask(None, 6, 6)
    additive = torch.zeros(6, 6).masked_fill(~tril, float("-inf"))
    assert is_causal_mask(additive[None, None], 6, 6)
    k = torch.randn(1, 2, 5, 4)
    assert repeat_factor(torch.randn(1, 8, 5, 4), k.repeat_interleave(4, dim=1)) == 4
    assert repeat_factor(torch.randn(1, 4, 5, 4), torch.randn(1, 4, 5, 4)) == 1


def _timing(ms: float, spread: float = 0.02) -> Timing:
    return Timing(ms, ms * (1 - spread), ms * (1 + spread), ms * 0.9, ms * 1.1, 10, "test")


def test_pass_verdict_from_bands_and_breakeven() -> None:
    rt = RuntimeProfile("cpu", "cpu", None, timings={"eager fwd": _timing(10.0), "compiled fwd": _timing(5.0),
                                                     "eager fwd+bwd": _timing(10.0), "compiled fwd+bwd": _timing(10.1)},
                        compile_s={"fwd": 2.0, "fwd+bwd": 3.0})  # fmt: skip
    fwd = pass_verdict(rt, "fwd")
    assert fwd is not None and fwd["verdict"] == "compile" and fwd["breakeven_steps"] == 400
    both = pass_verdict(rt, "fwd+bwd")
    assert both is not None and both["verdict"] == "no difference" and both["breakeven_steps"] is None
    slow = RuntimeProfile("cpu", "cpu", None, timings={"eager fwd": _timing(5.0), "compiled fwd": _timing(9.0)})
    assert pass_verdict(slow, "fwd")["verdict"] == "eager"  # type: ignore[index]
    assert pass_verdict(slow, "fwd+bwd") is None  # not measured: no verdict


def _f(id: str, gain: str | None = None, **data: object) -> Finding:
    return Finding(id=id, severity=Severity.WARNING, title=id, evidence="", suggestion="do it",
                   estimated_gain=gain, data=data)


def test_suggestions_rank_by_kind_then_gain() -> None:
    class Ctx:
        module = nn.Linear(256, 256)  # 4 x 257 KiB as the memory scale
        options = AnalysisOptions(kernel_profile=False)
        warm_forward_s = 0.004  # the step: 4 ms

    findings = [
        _f("fusion.rmsnorm", "about 1 MiB less traffic", seconds_saved=0.002, measured=False),  # 2 ms
        _f("memory.checkpoint", None, gain_bytes=2**17),
        _f("kernel.sdpa", "0.5 ms per forward (measured)", gain_ms=0.5, measured=True),
        _f("compile-time.regional", "about 3.3 s of 14 s compile time (estimated)"),
        _f("graph-break.x"),
        _f("analysis-error.x", "1 ms"),
    ]
    ranked = rank(Ctx(), findings)
    order = [f.id for _, f, _ in ranked]
    assert order == ["graph-break.x", "fusion.rmsnorm", "kernel.sdpa", "compile-time.regional", "memory.checkpoint"]
    assert ranked[1][0] == pytest.approx(0.5)  # 2 ms of the 4 ms step
    assert gain_of(findings[3])["compile_s"] == pytest.approx(3.3) and gain_of(findings[2])["measured"]


def test_suggestions_section_and_renderings_carry_the_same_findings(tmp_path: Path) -> None:
    report = _report()
    sugg = [s for s in report.optimization_suggestions if s.id.startswith("suggestion.")]
    assert sugg and [s.data["rank"] for s in sugg] == list(range(1, len(sugg) + 1))
    assert all(s.severity == Severity.INFO and s.suggestion and s.estimated_gain for s in sugg)
    assert all(s.estimated_gain.startswith(("[measured]", "[estimated]", "[no estimate]")) for s in sugg)
    # the SDPA fix is ranked when it measured faster, else listed as tried
    assert any(s.data["source_id"].startswith("kernel.sdpa") for s in report.optimization_suggestions)
    page, md, js = to_html(report, charts="svg"), to_markdown(report), to_json(report)
    for f in report.findings():
        assert f.id in js and f.id in md and f.id in page
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "Fusion opportunities" in page and "Not analysed" in page  # a section not run says so
    assert 'id="kernel_efficiency"' in page and "Compile verdict" in page


def test_charts_without_profiled_runs_and_with_roofs() -> None:
    assert chart_images(Report(model="m")) == {}
    run = {"run": "eager fwd", "kernel_ms": 2.0, "ceilings": {"copy_gbps": 3000.0, "matmul_tflops": 700.0,
                                                             "matmul_dtype": "bfloat16", "device": "H100"},
           "kernels": [{"name": "sm90_gemm", "where": "eager", "ms": 1.5, "intensity": 200.0, "tflops": 500.0},
                       {"name": "elementwise", "where": "eager", "ms": 0.25, "intensity": 0.25, "tflops": 0.5}]}
    roof = roofline_svg([run])
    assert "measured roofs: 3000 GB/s, 700 TFLOP/s" in roof and roof.count("<circle") >= 2
    bars = breakdown_svg([run])
    assert "sm90_gemm" in bars and "other kernels" in bars


def test_unknown_sections_are_refused_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="valid sections: compilation_readiness"):
        kp.CompilerOptimizationAssistant(sections=["kernels"])


def test_chrome_trace_of_the_profiled_runs(tmp_path: Path) -> None:
    import json

    path = tmp_path / "trace.json"
    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(measure_compile_time=False, chrome_trace=str(path)),
                                                 sections=["kernel_efficiency"])
    report = assistant.analyze_component(nn.Linear(8, 8).eval(), (torch.randn(4, 8),))  # eval: forward only
    (trace,) = [f for f in report.kernel_efficiency if f.id == "kernel.trace"]
    data = json.loads(path.read_text())
    assert data["otherData"]["runs"] == ["eager fwd"] and trace.data["path"] == str(path)
    skipped = [f for f in report.kernel_efficiency if f.id == "kernel.not-measured"]
    assert skipped and "compile" in skipped[0].evidence  # nothing compiled: said, not assumed
