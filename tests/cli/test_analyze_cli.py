"""`kernel-pytorch analyze`: the default demo, JSON/Markdown output, FILE.py:FACTORY, exit codes,
--backend and --fail-on, and argument errors that answer without importing torch."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_pytorch.cli.analyze import UsageError, parse_dims, parse_shapes
from kernel_pytorch.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

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
    """`kernel-pytorch analyze --json ... --markdown ... --html ... --trace ...` once: the built-in tiny
    Llama, Inductor compile, every section."""
    out = tmp_path_factory.mktemp("analyze")
    json_path, md_path = out / "report.json", out / "report.md"
    html_path, trace_path = out / "report.html", out / "trace.json"
    capture = pytest.MonkeyPatch()
    buffer = io.StringIO()
    capture.setattr(sys, "stdout", buffer)
    try:
        code = main(["analyze", "--json", str(json_path), "--markdown", str(md_path), "--html", str(html_path),
                     "--trace", str(trace_path)])
    finally:
        capture.undo()
    data = json.loads(json_path.read_text())
    data["_html"], data["_trace"] = html_path.read_text(), json.loads(trace_path.read_text())
    return code, data, md_path.read_text(), buffer.getvalue()


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


def test_default_run_profiles_kernels_gives_a_verdict_and_ranks_suggestions(default_run: tuple) -> None:
    code, data, markdown, printed = default_run
    kernels = data["sections"]["kernel_efficiency"]
    runs = {f["data"]["run"] for f in kernels if f["id"] == "kernel.summary"}
    assert runs == {"eager fwd", "compiled fwd"}  # the built-in model is in eval mode: forward only
    (verdict,) = [f for f in kernels if f["id"] == "verdict.compile"]
    assert verdict["data"]["passes"][0]["measured"]
    assert data["headline"]["compile_verdict"] == verdict["data"]["verdict"]
    # the tiny Llama repeats K/V to the query heads (a finding of its own, at its SDPA line)
    (gqa,) = [f for f in kernels if f["id"] == "kernel.sdpa-repeat-kv"]
    assert gqa["location"]["file"].endswith("llama.py") and "enable_gqa=True" in gqa["suggestion"] + gqa["evidence"]
    suggestions = data["sections"]["optimization_suggestions"]
    ranks = [f["data"]["rank"] for f in suggestions if f["id"].startswith("suggestion.")]
    assert ranks == list(range(1, len(ranks) + 1)) and ranks
    page = data["_html"]
    assert page.startswith("<!DOCTYPE html>") and "Kernel time per step" in page and "Roofline" in page
    assert "## Optimization suggestions" in markdown and "#1: " in markdown
    assert set(data["_trace"]["otherData"]["runs"]) == {"eager fwd", "compiled fwd"}


def test_default_report_is_short_and_agrees_with_its_measurements(default_run: tuple) -> None:
    code, data, markdown, printed = default_run
    # the terminal: the headline, the top fixes, one line per finding (details: --verbose, JSON, HTML)
    assert len(printed.splitlines()) < 120 and "Top fixes" in printed
    assert "no difference (" not in printed  # the verdict's words agree with its ratio
    suggestions = data["sections"]["optimization_suggestions"]
    ranked = [f for f in suggestions if f["id"].startswith("suggestion.")]
    # recompilations outrank speed, speed outranks memory; no gain is a cost read as a share of the step
    kinds = [f["data"]["kind"] for f in ranked]
    assert kinds == sorted(kinds, key=["correctness", "graph break", "recompilation", "speed", "compile time",
                                       "memory", "other"].index)
    assert all(f["data"]["score"] is None or f["data"]["score"] < 1 for f in ranked if f["data"]["kind"] == "speed")
    # the GQA fix measured slower on the CPU is tried, never suggested
    sdpa = next(f for f in data["sections"]["kernel_efficiency"] if f["id"] == "kernel.sdpa-repeat-kv")
    tried = {f["data"]["source_id"] for f in suggestions if f["id"].startswith("tried.")}
    assert ("kernel.sdpa-repeat-kv" in tried) == sdpa["data"]["fix_slower"]
    if sdpa["data"]["fix_slower"]:
        assert not {"kernel.sdpa-repeat-kv", "fusion.gqa-repeat"} & {f["data"]["source_id"] for f in ranked}
    # the recompute of activation checkpointing is priced in the step the report measured
    ckpt = next(f for f in data["sections"]["memory_bottlenecks"] if f["id"] == "memory.checkpointing")
    (verdict,) = [f for f in data["sections"]["kernel_efficiency"] if f["id"] == "verdict.compile"]
    assert ckpt["data"]["step_ms"] == verdict["data"]["passes"][0]["eager_ms"]
    # the kernel summary compares the ops' time with the step as profiled
    for s in (f for f in data["sections"]["kernel_efficiency"] if f["id"] == "kernel.summary"):
        assert s["data"]["kernel_ms"] <= s["data"]["profiled_step_ms"] * 1.05
    assert "(below)" not in json.dumps(data) and "G['" not in json.dumps(data)


def test_verbose_prints_every_finding_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--sections", "compilation_readiness", "--no-compile-time", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "traced" in out and "Every finding in full" not in out


def test_unknown_sections_exit_2_naming_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--sections", "compile_time,kernels"]) == 2
    assert "valid sections: compilation_readiness" in capsys.readouterr().err


def test_sections_runs_only_those(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    path = _user_file(tmp_path)
    args = ["analyze", f"{path}:make", "-q", "--sections", "compilation-readiness", "--json", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["sections_run"] == ["compilation_readiness"]


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
        ["analyze", "--generate", "0"],
        ["analyze", "--model", "llama-tiny", "--generate", "2"],  # the built-in Llama has no generate()
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


@pytest.mark.parametrize("backend", ["nosuchbackend", "no/such/file.py:backend"])
def test_unknown_backend_exits_2_before_building_the_model(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "--backend", backend, "--no-compile-time"]) == 2
    err = capsys.readouterr().err
    assert "--backend" in err and "analysing" not in err


def test_unknown_dtype_exits_2() -> None:
    assert main(["analyze", "--dtype", "fp7", "--no-compile-time"]) == 2


def test_backend_as_a_callable(tmp_path: Path) -> None:
    path = _user_file(tmp_path)
    backend = tmp_path / "my_backend.py"
    backend.write_text("def passthrough(gm, example_inputs):\n    return gm.forward\n")
    out = tmp_path / "r.json"
    argv = ["analyze", f"{path}:make", "-q", "--backend", f"{backend}:passthrough", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["backend"] == "passthrough"


def test_fail_on_gates_on_severity(tmp_path: Path) -> None:
    path = _user_file(tmp_path)
    args = ["analyze", f"{path}:make", "--no-compile-time", "-q"]
    # the print() is a graph break (a warning), and nothing is an error
    assert main([*args, "--fail-on", "warning"]) == 1
    assert main([*args, "--fail-on", "error"]) == 0
    assert main(args) == 0


def test_fail_on_rejects_other_values() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["analyze", "--fail-on", "info"])
    assert exc.value.code == 2


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("argv", [["--help"], ["analyze", "--nosuchflag"], ["analyze", "--help"], ["bogus"]])
def test_argument_errors_and_help_do_not_import_torch(argv: list[str]) -> None:
    """Importing torch takes seconds; --help and a mistyped flag must answer at once."""
    code = (
        "import sys\nfrom kernel_pytorch.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    print('exit', e.code)\n"
        "print('torch imported:', 'torch' in sys.modules)"
    )
    result = _python(code)
    assert "torch imported: False" in result.stdout, result.stdout + result.stderr
    assert ("exit 0" if "--help" in argv else "exit 2") in result.stdout


def test_listed_help_matches_each_subcommand() -> None:
    from kernel_pytorch.cli._parser import HELP
    from kernel_pytorch.cli.main import SUBCOMMANDS, build_parser

    parser = build_parser()  # every subcommand imported and registered
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(helps) == set(SUBCOMMANDS) == set(HELP)
    assert helps == HELP
