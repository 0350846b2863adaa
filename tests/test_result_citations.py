"""Every result file README.md, docs/, src/, benchmarks/ and scripts/ cite exists: a path under
benchmarks/results/ (or a probe's `probes/<topic>/...`) names a committed file, and every relative
markdown link in the docs (outside fenced code) resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("*.py")),
           *sorted((ROOT / "benchmarks").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.md")),
           *sorted((ROOT / "scripts").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.sh"))]
CITED = re.compile(r"(?:benchmarks/results/|(?<![\w/.-])probes/)[\w./-]*\.(?:md|json|jsonl|log|txt|csv|png|html)\b")
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)")
FENCED = re.compile(r"^```.*?^```", re.S | re.M)  # code, not prose: `kernel[grid](x, y)` is no link


def test_cited_result_files_exist() -> None:
    missing = []
    for src in SOURCES:
        # a path broken over a line ("benchmarks/results/probes/\nrope/x.log") is joined first
        text = re.sub(r"(results/|probes/|/)\n[#>\s]*", r"\1", src.read_text(encoding="utf-8"))
        for m in CITED.finditer(text):
            cited = m.group(0)
            path = ROOT / cited if cited.startswith("benchmarks/") else RESULTS / cited
            if not path.is_file():
                missing.append(f"{src.relative_to(ROOT)}: {cited}")
    assert not missing, "cited result files that do not exist:\n" + "\n".join(missing)


def test_markdown_links_resolve() -> None:
    broken = []
    for src in SOURCES:
        if src.suffix != ".md":
            continue
        for m in LINK.finditer(FENCED.sub("", src.read_text(encoding="utf-8"))):
            if not (src.parent / m.group(1)).exists():
                broken.append(f"{src.relative_to(ROOT)}: {m.group(1)}")
    assert not broken, "markdown links that do not resolve:\n" + "\n".join(broken)
