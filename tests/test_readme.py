"""The README's two top commands stay true: CI runs exactly its test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_ci_runs_the_readme_test_command() -> None:
    blocks = _bash_blocks()
    assert len(blocks) >= 2, "README must open with the install+demo and the test commands"
    test_command = blocks[1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_first_command_installs_and_runs_the_cli() -> None:
    first = _bash_blocks()[0].strip()
    assert first.startswith("pip install -e .")
    assert "kernel-pytorch" in first
