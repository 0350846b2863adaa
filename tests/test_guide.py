"""The guide's exercises: every chapter of docs/guide/ ends with an "## Exercise" section whose python
blocks stand alone and define a checker, `check_exercise_NN(solution) -> list[str]` (what is left to
fix; empty when solved). Here each chapter's checker runs on the solution in
tests/guide_solutions/ch<chapter>.py (its `SOLUTION`), and must find nothing left, and on the exercise's
starting point, where the chapter's own blocks assert what it finds. An example page of docs/examples/
with an Exercise section is held to the same, its solution in tests/guide_solutions/ex_<page>.py."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.test_docs import FENCE

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "docs" / "guide").glob("[0-9][0-9]_*.md"))
SECTION = re.compile(r"^## Exercise\n(.*?)(?=^## |\Z)", re.S | re.M)
SOLUTIONS = ROOT / "tests" / "guide_solutions"
EXAMPLES = sorted(p for p in (ROOT / "docs" / "examples").glob("*.md") if SECTION.search(p.read_text()))


def solution_module(path: Path) -> str:
    """The module holding `path`'s SOLUTION: ch<stem> for a guide chapter, ex_<stem> for an example page."""
    return f"tests.guide_solutions.{'ch' if path.parent.name == 'guide' else 'ex_'}{path.stem}"


def exercise_blocks(path: Path) -> list[str]:
    """The python blocks of `path`'s Exercise section, in order (those fenced `cuda` left out)."""
    found = SECTION.findall(path.read_text())
    assert len(found) == 1, f"{path.name}: one '## Exercise' section expected, found {len(found)}"
    return [body for tag, info, body in FENCE.findall(found[0]) if tag == "python" and "cuda" not in info.split()]


def test_every_chapter_has_an_exercise_and_a_solution() -> None:
    assert CHAPTERS, "docs/guide/ has no chapters"
    for path in CHAPTERS:
        assert exercise_blocks(path), f"{path.name}: its Exercise section has no python block"
        assert (SOLUTIONS / f"ch{path.stem}.py").is_file(), path.name


def test_example_exercises_and_solutions_match() -> None:
    # each example page's exercise has a solution, and each ex_ solution a page whose exercise it solves
    assert {f"ex_{p.stem}" for p in EXAMPLES} == {p.stem for p in SOLUTIONS.glob("ex_*.py")}
    for path in EXAMPLES:
        assert exercise_blocks(path), f"{path.name}: its Exercise section has no python block"


@pytest.mark.parametrize("path", CHAPTERS + EXAMPLES, ids=lambda p: p.stem)
def test_solution_passes_the_checker(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"exercise_{path.stem}"}
    for i, block in enumerate(exercise_blocks(path)):
        exec(compile(block, f"{path.name}[exercise block {i}]", "exec"), namespace)  # ours; running it is the point
    (checker,) = [v for k, v in namespace.items() if k.startswith("check_exercise_")]
    solution = importlib.import_module(solution_module(path)).SOLUTION
    assert checker(solution) == []


def test_figure_script_draws_from_the_committed_results(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("guide_figures", ROOT / "scripts" / "guide_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    rows, ceilings, files = figures.load_rows()
    assert {r["provider"] for r in rows} == {"ours", "compile", "eager"} and len(files) == len(ceilings) == 5
    paths = figures.write_figures(tmp_path)
    assert [p.name for p in paths] == ["roofline_h200.png", "pct_copy_h200.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    for p in paths:  # the committed figures are the script's
        assert (ROOT / "docs" / "guide" / "figures" / p.name).is_file()


def test_figure_script_draws_a_memory_timeline_from_a_probe_file(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("guide_figures", ROOT / "scripts" / "guide_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    from kernel_pytorch.benchmark.memory_peak import allocated_over_time

    trace = [{"action": "alloc", "addr": i, "size": 2**28, "time_us": 1000 * i} for i in range(8)]
    trace += [{"action": "free_requested", "addr": i, "time_us": 9000 + 1000 * i} for i in range(8)]
    line = allocated_over_time(trace).to_dict()
    source = tmp_path / "results" / "memory_timeline_test.json"
    source.parent.mkdir()
    source.write_text(json.dumps({"device": "Test GPU", "date": "2026-01-01", "torch": "2.x", "variants": {
        "torch.compile": {"step_ms": 12.0, "peak_mib": 2048.0, "timeline": line},
        "liger": {"error": "ImportError: no liger"}}}))
    path = figures.plot_memory_timeline(source, tmp_path / "memory_timeline_test.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
