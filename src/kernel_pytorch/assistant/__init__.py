"""The compile analyser: each concern is a function `analyze_x(ctx) -> list[Finding]`, collected into a
`Report` by `CompilerOptimizationAssistant`; `render` turns reports into terminal, JSON or Markdown."""

from kernel_pytorch.assistant.assistant import STEPS, CompilerOptimizationAssistant
from kernel_pytorch.assistant.compile_time.compile_time import analyze_compile_time
from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import SECTIONS, Finding, Location, Report, Severity
from kernel_pytorch.assistant.kernels.efficiency import analyze_kernels
from kernel_pytorch.assistant.readiness.readiness import analyze_readiness
from kernel_pytorch.assistant.recompiles.recompiles import analyze_recompilations
from kernel_pytorch.assistant.report.suggestions import analyze_suggestions

__all__ = [
    "SECTIONS",
    "STEPS",
    "AnalysisContext",
    "AnalysisOptions",
    "CompilerOptimizationAssistant",
    "Finding",
    "Location",
    "Report",
    "Severity",
    "analyze_compile_time",
    "analyze_kernels",
    "analyze_readiness",
    "analyze_recompilations",
    "analyze_suggestions",
]
