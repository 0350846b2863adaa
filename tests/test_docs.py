"""Every code block in README.md and docs/**/*.md (the reference pages, the guide, the examples, the
reference sheets) runs: python blocks execute (sharing one namespace per file, in order), and
`kernel-pytorch ...` lines of bash blocks run through the CLI and must exit 0.

A block whose fence says `cuda` (```` ```python cuda ````) needs a GPU: on the CPU it is left out of
its file's run; `test_python_blocks_run_cuda` (cuda marker) runs the file again with it, every block in
order. A page whose blocks another test runs section by section (`RUN_ELSEWHERE`) is not run here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
# what a fence may say after its language: `cuda` marks a block that needs a GPU
FENCE_FLAGS = {"cuda"}
# page -> the test that runs its blocks, one section at a time, with its own assertions
RUN_ELSEWHERE = {"docs/reference/common_pitfalls.md": "tests/assistant/test_pitfalls.py"}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: Path, lang: str, *, cuda: bool = False) -> list[str]:
    """The `lang` blocks of `path` in order; those fenced `cuda` only when `cuda` is true."""
    return [body for tag, info, body in FENCE.findall(path.read_text())
            if tag == lang and (cuda or "cuda" not in info.split())]


def _has_cuda_blocks(path: Path) -> bool:
    return any("cuda" in info.split() for _, info, _ in FENCE.findall(path.read_text()))


def _run(path: Path, code_blocks: list[str]) -> None:
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    for i, block in enumerate(code_blocks):
        code = compile(block, f"{_rel(path)}[python block {i}]", "exec")
        exec(code, namespace)  # the docs are ours; running them is the point


RUN_HERE = [p for p in DOCS if _rel(p) not in RUN_ELSEWHERE]


@pytest.mark.parametrize("path", RUN_HERE, ids=_rel)
def test_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _run(path, blocks(path, "python"))


@pytest.mark.cuda
@pytest.mark.parametrize("path", [p for p in RUN_HERE if _has_cuda_blocks(p)], ids=_rel)
def test_python_blocks_run_cuda(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _run(path, blocks(path, "python", cuda=True))


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_cli_lines_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_pytorch.cli.main import main

    monkeypatch.chdir(tmp_path)
    for block in blocks(path, "bash"):
        for line in block.splitlines():
            for command in line.split("&&"):
                argv = shlex.split(command.strip())
                if argv[:1] == ["kernel-pytorch"]:
                    assert main(argv[1:]) == 0, f"{_rel(path)}: `{command.strip()}` failed"


def test_fence_flags_are_known() -> None:
    # a misspelt flag (```python cdua) would run a GPU block on the CPU, or hide it from the cuda run
    bad = [f"{_rel(p)}: ```{tag}{info}" for p in DOCS for tag, info, _ in FENCE.findall(p.read_text())
           if set(info.split()) - FENCE_FLAGS]
    assert not bad, "unknown fence flags:\n" + "\n".join(bad)


def test_pages_run_elsewhere_exist() -> None:
    for page, test in RUN_ELSEWHERE.items():
        assert (ROOT / page).is_file() and (ROOT / test).is_file(), (page, test)
