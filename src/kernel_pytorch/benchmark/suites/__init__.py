"""Benchmark suites by name.

A suite is one module under `suites/` holding its op benchmarks (`spec.OpBench`, one per op) and
`SUITE = spec.Suite(name, specs)`; `runner.run(SUITE, ...)` gates and times them all, and `run_suite`
writes the JSON, markdown and PNGs. Adding a family is that module plus its line in SUITES.

Layering: the suites and their runner sit above `kernel_pytorch.validation` (the gate uses its
comparisons), which itself uses the measurement tools below them (benchmark/{timer, ceilings, memory,
results, module, plots}.py); `kernel_pytorch.benchmark` itself never imports this package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kernel_pytorch.benchmark.results import BenchmarkResults

# name -> module implementing it (defines SUITE)
SUITES: dict[str, str] = {
    "norm": "kernel_pytorch.benchmark.suites.norm",
    "attention": "kernel_pytorch.benchmark.suites.attention",
    "rope": "kernel_pytorch.benchmark.suites.rope",
    "mlp": "kernel_pytorch.benchmark.suites.mlp",
    "cross_entropy": "kernel_pytorch.benchmark.suites.cross_entropy",
}

# former names a command line may still use -> the suite's name
ALIASES: dict[str, str] = {"norms": "norm"}


def suite_names() -> list[str]:
    """Registered suite names, in registration order."""
    return list(SUITES)


def get_suite(name: str) -> ModuleType:
    """The module of suite `name` (or of its former name in ALIASES); ValueError listing the known names otherwise."""
    try:
        return importlib.import_module(SUITES[ALIASES.get(name, name)])
    except KeyError:
        raise ValueError(f"unknown benchmark suite {name!r}; known: {', '.join(SUITES)}") from None


def output_paths(name: str, out_dir: str | Path) -> list[Path]:
    """Files of suite `name`'s earlier results already in `out_dir` (the ones `run_suite` would replace)."""
    d = Path(out_dir)
    if not d.is_dir():
        return []
    found = [d / f"{name}.json", d / f"{name}.md", *sorted(d.glob(f"{name}_*.png"))]
    return [p for p in found if p.is_file()]


@dataclass
class SuiteOutput:
    results: BenchmarkResults
    files: list[Path]


def run_suite(
    name: str,
    out_dir: str | Path,
    *,
    plots: bool = True,
    progress: Callable[[int, int, str], None] | None = None,
    **options: Any,
) -> SuiteOutput:
    """Run suite `name` and write `<out_dir>/<name>.json`, `.md` and (with `plots`) PNGs.

    Args:
        name: a key of SUITES.
        out_dir: output directory (created; files of the same names are replaced).
        plots: also write the bar and roofline charts (needs matplotlib).
        progress: progress(done, total, description) callback.
        options: passed to `runner.run` (device, providers, ops, quick, ceilings, ...).
    """
    from kernel_pytorch.benchmark.suites.runner import run

    results = run(get_suite(name).SUITE, progress=progress, **options)
    json_path, md_path = results.write(out_dir)
    files = [json_path, md_path]
    if plots:
        from kernel_pytorch.benchmark.plots import write_plots

        files += write_plots(results, out_dir)
    return SuiteOutput(results, files)


__all__ = ["SUITES", "SuiteOutput", "get_suite", "output_paths", "run_suite", "suite_names"]
