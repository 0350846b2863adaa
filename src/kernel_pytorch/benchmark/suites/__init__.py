"""Benchmark suites by name. Each suite module defines `NAME` and
`run(*, device, providers, quick, ceilings, progress) -> BenchmarkResults`; `run_suite` writes its
JSON, markdown and PNGs. Later suites register here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kernel_pytorch.benchmark.results import BenchmarkResults

# name -> module implementing it
SUITES: dict[str, str] = {
    "norms": "kernel_pytorch.benchmark.suites.norms",
}


def suite_names() -> list[str]:
    """Registered suite names, in registration order."""
    return list(SUITES)


def get_suite(name: str) -> ModuleType:
    """The module of suite `name`; ValueError listing the known names otherwise."""
    try:
        return importlib.import_module(SUITES[name])
    except KeyError:
        raise ValueError(f"unknown benchmark suite {name!r}; known: {', '.join(SUITES)}") from None


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
        out_dir: output directory (created).
        plots: also write the bar and roofline charts (needs matplotlib).
        progress: progress(done, total, description) callback.
        options: passed to the suite's `run` (device, providers, quick, ceilings, ...).
    """
    results = get_suite(name).run(progress=progress, **options)
    json_path, md_path = results.write(out_dir)
    files = [json_path, md_path]
    if plots:
        from kernel_pytorch.benchmark.plots import write_plots

        files += write_plots(results, out_dir)
    return SuiteOutput(results, files)


__all__ = ["SUITES", "SuiteOutput", "get_suite", "run_suite", "suite_names"]
