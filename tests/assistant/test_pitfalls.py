"""docs/reference/common_pitfalls.md, pitfall by pitfall: each `### ` section names the finding that
catches it (`Finding: \\`id\\``) and has a small model in its python blocks; run after the page's
preamble (the blocks before the first pitfall) in a namespace of its own, the section must leave the
analyser's findings in `found`, among them that id. tests/test_docs.py leaves the page to this file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel_pytorch.assistant import Finding
from tests.test_docs import FENCE

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "common_pitfalls.md"
FINDING = re.compile(r"^Finding: `([a-z0-9.-]+)`$", re.M)


@dataclass(frozen=True)
class Pitfall:
    title: str
    finding: str
    blocks: tuple[str, ...]


def _python(text: str) -> list[str]:
    return [body for tag, info, body in FENCE.findall(text) if tag == "python" and "cuda" not in info.split()]


def _page() -> tuple[list[str], list[Pitfall]]:
    """(the preamble's blocks, the pitfalls in page order)."""
    preamble, *sections = re.split(r"^### ", PAGE.read_text(), flags=re.M)
    pitfalls = []
    for section in sections:
        title = section.splitlines()[0].strip()
        found = FINDING.findall(section)
        assert len(found) == 1, f"pitfall {title!r}: one 'Finding: `id`' line expected, found {found}"
        pitfalls.append(Pitfall(title, found[0], tuple(_python(section))))
    return _python(preamble), pitfalls


PREAMBLE, PITFALLS = _page()


def test_every_pitfall_has_a_model_and_its_own_finding() -> None:
    assert len(PITFALLS) >= 20
    assert all(p.blocks for p in PITFALLS), [p.title for p in PITFALLS if not p.blocks]
    findings = [p.finding for p in PITFALLS]
    assert len(set(findings)) == len(findings), "two pitfalls name one finding"


@pytest.mark.parametrize("pitfall", PITFALLS, ids=lambda p: p.finding)
def test_analyser_reports_the_pitfall(pitfall: Pitfall, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "pitfalls"}
    for i, block in enumerate([*PREAMBLE, *pitfall.blocks]):
        exec(compile(block, f"{PAGE.name}[{pitfall.finding} block {i}]", "exec"), namespace)  # ours, to run
    found = namespace.get("found")
    assert isinstance(found, list) and all(isinstance(f, Finding) for f in found), "the section leaves no `found`"
    reported = [f for f in found if f.id == pitfall.finding]
    assert reported, f"{pitfall.title}: the analyser reported {sorted({f.id for f in found})}"
    assert all(f.severity.value in ("warning", "info", "error") for f in reported)
