"""The compile analyser: each concern is a function `analyze_x(ctx) -> list[Finding]`, collected into a
`Report` by `CompilerOptimizationAssistant` (`AnalysisOptions`: what to analyse and how).

The shared pieces sit here (`context`, `options`, `findings`, `inputs`, `records`, `dynamo`, `locate`,
`isolation`, `estimates`, `components`); each concern is a package: `readiness`, `recompiles`,
`compile_time`, `fusion`, `memory`, `kernels` (with the compile verdict) and `report` (the ranked
suggestions; `report.render` and `report.html` turn reports into terminal, JSON, Markdown or HTML)."""

from kernel_pytorch.assistant.assistant import STEPS, CompilerOptimizationAssistant
from kernel_pytorch.assistant.compile_time.compile_time import analyze_compile_time
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.findings import SECTIONS, Finding, Location, Report, Severity
from kernel_pytorch.assistant.fusion.fusion import analyze_fusion
from kernel_pytorch.assistant.kernels.efficiency import analyze_kernels
from kernel_pytorch.assistant.memory.memory import analyze_memory
from kernel_pytorch.assistant.options import AnalysisOptions
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
    "analyze_fusion",
    "analyze_kernels",
    "analyze_memory",
    "analyze_readiness",
    "analyze_recompilations",
    "analyze_suggestions",
]
