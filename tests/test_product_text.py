"""The product speaks of itself: README.md, docs/, src/, benchmarks/ and scripts/ (file names and text) hold no
narrative of how the work went: no numbered work periods ("session 12", "fourteenth session", "_session"),
no numbered device calls or GPU rounds ("call 4", "first GPU round"), no "the issue" or "issue 13", no `_runN`
result files. A result is placed by date, device and commit; how the work went lives in commit messages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("README.md", "docs", "src", "benchmarks", "scripts")
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "bench-results"}

_ORDINAL = (r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th)")
NARRATION: dict[str, re.Pattern[str]] = {
    "a numbered work period": re.compile(rf"session[\s_-]*\d+|\b(?:{_ORDINAL})\s+session\b|_session", re.I),
    # "call 4", "calls 2-3", "call1_e2e.md"; not a measured quantity such as "first call 14.0 s" or "40 calls 16%"
    "a numbered device call": re.compile(r"\bcalls?[\s_-]?\d+(?![\d.%])|\bGPU rounds?\b", re.I),
    "the issue": re.compile(r"\bthe issue\b|\bissue's\b|\bissue\s*#?\d+", re.I),
    "a _runN result": re.compile(r"_run\d+", re.I),
}

# (path relative to the root, the exact match) -> why the word is about the product, not the work
ALLOWED: dict[tuple[str, str], str] = {}


def _files() -> list[Path]:
    found = []
    for name in SCOPE:
        top = ROOT / name
        if top.is_file():
            found.append(top)
            continue
        for path in top.rglob("*"):
            parts = path.relative_to(ROOT).parts
            # build outputs (an editable install's egg-info) are not the product's text
            if path.is_file() and not SKIP_DIRS.intersection(parts) and not any(p.endswith(".egg-info") for p in parts):
                found.append(path)
    return sorted(found)


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary: plots, compressed traces
    return data.decode("utf-8", errors="replace")


def _hits(rel: str, text: str, where: str) -> list[str]:
    out = []
    for kind, pattern in NARRATION.items():
        for m in pattern.finditer(text):
            if (rel, m.group(0)) not in ALLOWED:
                out.append(f"{where}: {kind}: {m.group(0)!r}")
    return out


def test_scope_is_there() -> None:
    files = _files()
    assert len(files) > 100 and ROOT / "README.md" in files and ROOT / "docs" / "performance.md" in files


def test_no_narration_in_file_names_or_text() -> None:
    hits = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        hits += _hits(rel, rel, f"{rel} (file name)")
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            hits += _hits(rel, line, f"{rel}:{number}")
    assert not hits, "narration of the work in the product:\n" + "\n".join(hits[:200])


def test_patterns_catch_narration_and_spare_product_words() -> None:
    def caught(s: str) -> bool:
        return any(p.search(s) for p in NARRATION.values())

    for s in ("session 12", "session14", "decode_h200_session10.md", "the fifteenth session", "call 4",
              "call1_e2e.md", "calls 2-3", "first GPU round", "the issue's target", "issue 13's target",
              "e2e_h200_run4.json"):
        assert caught(s), s
    for s in ("First call 14.0 s (compile)", "after 40 calls 16% zeros", "a directory of the test session",
              "the next block's load is issued", "run once", "recall 4x", "known issues"):
        assert not caught(s), s
