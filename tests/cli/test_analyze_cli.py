"""`kernel-pytorch analyze`: the default demo, JSON/Markdown output, FILE.py:FACTORY, exit codes."""

from __future__ import annotations

import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_pytorch.cli.analyze import UsageError, parse_dims, parse_shapes
from kernel_pytorch.cli.main import main

USER_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Chatty(nn.Module):
        def __init__(self, dim: int = 8) -> None:
            super().__init__()
            self.lin = nn.Linear(dim, dim)

        def forward(self, x):
            y = self.lin(x)
            print("shape", y.shape)  # the break
            return y


    def make():
        return Chatty(), (torch.randn(3, 8),)


    Model = Chatty


    def get_inputs():
        return [torch.randn(3, 8)]


    def get_init_inputs():
        return [8]
    """
)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str, str]:
    """`kernel-pytorch analyze --json ... --markdown ...` once: the built-in tiny Llama, Inductor compile."""
    out = tmp_path_factory.mktemp("analyze")
    json_path, md_path = out / "report.json", out / "report.md"
    capture = pytest.MonkeyPatch()
    buffer = io.StringIO()
    capture.setattr(sys, "stdout", buffer)
    try:
        code = main(["analyze", "--json", str(json_path), "--markdown", str(md_path)])
    finally:
        capture.undo()
    return code, json.loads(json_path.read_text()), md_path.read_text(), buffer.getvalue()


def test_default_run_analyses_the_tiny_llama(default_run: tuple[int, dict, str, str]) -> None:
    code, data, markdown, printed = default_run
    assert code == 0
    assert data["model"] == "llama-tiny"
    assert data["meta"]["device"] == "cpu"
    assert data["headline"]["graph_breaks"] == 0
    assert data["headline"]["fullgraph"] is True
    assert data["headline"]["recompiles_after"] == 0
    phases = next(f for f in data["sections"]["compile_time"] if f["id"] == "compile-time.phases")
    assert phases["data"]["backend"] == "inductor" and phases["data"]["total_s"] > 0
    assert "# Compile report: llama-tiny" in markdown
    assert "Compile report: llama-tiny" in printed and "Recompilations" in printed


def _user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_model.py"
    path.write_text(USER_MODEL)
    return path


def test_file_factory_form(tmp_path: Path) -> None:
    path = _user_file(tmp_path)
    out = tmp_path / "r.json"
    assert main(["analyze", f"{path}:make", "--no-compile-time", "--quiet", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (brk,) = [f for f in data["sections"]["compilation_readiness"] if f["id"] == "graph-break.print"]
    line = next(i for i, text in enumerate(USER_MODEL.splitlines(), 1) if "# the break" in text)
    assert brk["location"]["line"] == line
    assert Path(brk["location"]["file"]).resolve() == path.resolve()
    # exit code 0 although the report has warnings
    assert data["counts"]["warning"] >= 1


def test_model_get_inputs_file_form_and_shapes(tmp_path: Path) -> None:
    path = _user_file(tmp_path)
    out = tmp_path / "r.json"
    args = ["analyze", str(path), "--no-compile-time", "-q", "--shapes", "batch=3,5", "--json", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["sweep"] == {"batch": [3, 5]}


def test_builtin_by_name_with_dims(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["analyze", "--model", "gpt2-tiny", "--no-compile-time", "-q", "--shapes", "batch=2,3;seq=32,16"]
    assert main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "gpt2-tiny"
    assert data["meta"]["sweep"] == {"batch": [2, 3], "seq": [32, 16]}


@pytest.mark.parametrize(
    "argv",
    [
        ["analyze", "--model", "no-such-model"],
        ["analyze", "no/such/file.py:make"],
        ["analyze", "--shapes", "width=3"],
        ["analyze", "--dims", "0:0=height"],
        ["analyze", "--model", "llama-tiny", "--device", "no-such-device"],
    ],
)
def test_unusable_arguments_exit_2(argv: list[str]) -> None:
    assert main(argv) == 2


def test_target_and_model_together_exit_2(tmp_path: Path) -> None:
    assert main(["analyze", f"{_user_file(tmp_path)}:make", "--model", "llama-tiny"]) == 2


def test_parse_shapes_and_dims() -> None:
    assert parse_shapes("batch=1,2,4;seq=16,32") == {"batch": (1, 2, 4), "seq": (16, 32)}
    assert parse_shapes("batch=2 seq=8") == {"batch": (2,), "seq": (8,)}
    assert parse_dims("0:0=batch,1=seq;mask:0=batch") == {0: {0: "batch", 1: "seq"}, "mask": {0: "batch"}}
    with pytest.raises(UsageError):
        parse_shapes("batch=0")
    with pytest.raises(UsageError):
        parse_dims("x=batch")
