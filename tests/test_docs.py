"""Every code block in README.md and docs/*.md runs: python blocks execute (sharing one namespace per
file, in order), and `kernel-pytorch ...` lines of bash blocks run through the CLI and must exit 0."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(path.read_text()) if tag == lang]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    for i, block in enumerate(_blocks(path, "python")):
        code = compile(block, f"{path.name}[python block {i}]", "exec")
        exec(code, namespace)  # the docs are ours; running them is the point


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_cli_lines_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch.cli.main import main

    monkeypatch.chdir(tmp_path)
    for block in _blocks(path, "bash"):
        for line in block.splitlines():
            for command in line.split("&&"):
                argv = shlex.split(command.strip())
                if argv[:1] == ["kernel-pytorch"]:
                    assert main(argv[1:]) == 0, f"{path.name}: `{command.strip()}` failed"
