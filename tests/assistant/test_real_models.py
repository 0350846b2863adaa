"""#18's acceptance on the real-models corpus (tests/assistant/real_models.py): for every model the
analysis runs, every recompile cause is classified (no `other`), every fix is verified or says why it
cannot be, every location is a real code line (the one executed, in the user's code or the model's
own classes), co-varying inputs are marked together, stderr stays quiet, printed code runs.

Each model is analysed once per session (`_analysed`) and every test reads that report. Defects
known today are `xfail(strict=True)` with the defect in the reason (`KNOWN`); a fix flips its xfail
to a pass, and strict mode makes that fail until the entry is removed.

Optional libraries: transformers (in the dev extras), torchvision and timm (not: their wheels pull a
CUDA torch into a CPU environment) are imported with `pytest.importorskip`, so their models skip with
the reason when a library is missing.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import io
import json
import linecache
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import kernel_pytorch
from kernel_pytorch.assistant import AnalysisOptions, CompilerOptimizationAssistant
from kernel_pytorch.assistant.findings import Finding, Report
from tests.assistant import real_models as rm

CORPUS_FILE = Path(rm.__file__).resolve()
PACKAGE_DIR = Path(kernel_pytorch.__file__).resolve().parent

# ---------------------------------------------------------------------------------------------------
# How each model is analysed: small sweeps (one other batch size; a sequence length where the test
# needs it), the real compile measured (with the cheap eager backend) only where a test reads it
# ---------------------------------------------------------------------------------------------------

_BATCH_ONLY = {"shapes": {"batch": (4,)}, "batch_only": True}
_WITH_COMPILE = {"measure_compile_time": True, "backend": "eager"}

OPTIONS: dict[str, dict[str, Any]] = {
    "llama": {"shapes": {"batch": (4,), "seq": (8,)}, **_WITH_COMPILE},
    **{name: _BATCH_ONLY for name in ("mistral", "qwen2", "gemma", "gpt2", "bert", "t5", "whisper")},
    "resnet18": {**_BATCH_ONLY, **_WITH_COMPILE},
    "mobilenet_v3": {**_BATCH_ONLY, **_WITH_COMPILE},
    "vit_timm": {**_BATCH_ONLY, **_WITH_COMPILE},
    "lstm": {**_BATCH_ONLY, **_WITH_COMPILE},
    "gru": {"shapes": {"batch": (4,)}, **_WITH_COMPILE},  # dims inferred: the (T, B, F) guess is tested
    "conv3d_groupnorm": {},
    "cross_entropy": {"shapes": {"batch": (4,)}},
    "qkv_attention": {"shapes": {"batch": (4,)}},
    "wrong_shape": {},
    "wrong_shape_torch": {},
    "sibling_convs": {**_BATCH_ONLY, **_WITH_COMPILE},
    "two_norms": {"shapes": {"batch": (4,), "seq": (8,)}, **_WITH_COMPILE},
    "param_free": {"shapes": {"batch": (4,)}},
    "kwargs_wrapped": {"shapes": {"batch": (4,)}, "extra": "bf16"},
    "nested_batch": {"shapes": {"batch": (4,), "seq": (8,)}},
}
assert set(OPTIONS) == set(rm.FACTORIES)

# inputs that share a dim (each (input, dim) the fix must mark together)
_LM = ("input_ids", "attention_mask", "labels")
COVARYING: dict[str, tuple[tuple[str, int], ...]] = {
    "llama": tuple((k, d) for k in _LM for d in (0, 1)),
    **{name: tuple((k, 0) for k in _LM) for name in ("mistral", "qwen2", "gemma")},
    "gpt2": (("input_ids", 0), ("attention_mask", 0)),
    "bert": tuple((k, 0) for k in ("input_ids", "attention_mask", "token_type_ids")),
    "t5": tuple((k, 0) for k in ("input_ids", "attention_mask", "decoder_input_ids")),
    "whisper": (("input_features", 0), ("decoder_input_ids", 0)),
    "cross_entropy": (("x", 0), ("targets", 0)),
    "qkv_attention": (("q", 0), ("k", 0), ("v", 0)),
}

# ids of the recompilation findings that are not one cause each
_NOT_CAUSES = {"summary", "limit", "skipped", "no-sweep", "rejected-sizes", "call-failed"}
_SPECIALISED = "Sizes 0 and 1 are always specialised"

# ---------------------------------------------------------------------------------------------------
# Defects known today: (test, model) -> what is wrong. See DEFECTS of #18 for root causes and fixes.
# ---------------------------------------------------------------------------------------------------

_HF = ("llama", "mistral", "qwen2", "gemma", "gpt2", "bert", "t5", "whisper")

KNOWN: dict[tuple[str, str], str] = {}


def _known(test: str, names: tuple[str, ...] | list[str], reason: str) -> None:
    for name in names:
        KNOWN[(test, name)] = reason


def _params(test: str, names: tuple[str, ...] | list[str]) -> list[Any]:
    """`names` as pytest params, each known defect of `test` an xfail(strict=True) with its reason."""
    out = []
    for name in names:
        reason = KNOWN.get((test, name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


# ---------------------------------------------------------------------------------------------------
# One analysis per model
# ---------------------------------------------------------------------------------------------------


@dataclass
class Analysed:
    name: str
    model: torch.nn.Module
    inputs: Any
    report: Report
    stderr: str  # what reached sys.stderr, plus torch's log records of WARNING and above
    seconds: float

    def causes(self) -> list[Finding]:
        return [f for f in self.report.recompilations if f.id.split(".", 1)[1] not in _NOT_CAUSES]

    def one(self, finding_id: str) -> Finding | None:
        return next(iter(self.report.by_id(finding_id)), None)


class _Records(logging.Handler):
    """Every record of WARNING or above, once (it is attached to several loggers of one chain)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self._seen: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if id(record) not in self._seen:
            self._seen.add(id(record))
            self.lines.append(f"{record.name}: {logging.Formatter().format(record)}")  # traceback included


@contextlib.contextmanager
def _stderr_and_torch_logs() -> Iterator[list[str]]:
    """Collect what the analysis writes to sys.stderr and what torch logs at WARNING or above.

    torch's loggers write through handlers of their own (some not propagating), holding the stream
    they were created with, so the handler goes on every torch logger rather than on sys.stderr.
    """
    out: list[str] = []
    buffer, records = io.StringIO(), _Records()
    names = ["torch", *(n for n in logging.Logger.manager.loggerDict if n.startswith("torch."))]
    loggers = [logging.getLogger(n) for n in names]
    for log in loggers:
        log.addHandler(records)
    try:
        with contextlib.redirect_stderr(buffer):
            yield out
    finally:
        for log in loggers:
            log.removeHandler(records)
        out.extend([*buffer.getvalue().splitlines(), *records.lines])


def _batch_dims(inputs: Any) -> dict[Any, dict[int, str]]:
    """Dim 0 of every tensor input the size of the example batch: a batch-only sweep."""
    items = inputs.items() if isinstance(inputs, dict) else enumerate(inputs)
    return {k: {0: "batch"} for k, v in items if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == rm.BATCH}


@functools.cache
def _analyse(name: str) -> Analysed:
    library = rm.LIBRARY.get(name)
    if library is not None:
        pytest.importorskip(library, reason=f"{name} needs {library}, which is not installed")
    torch.manual_seed(0)
    model, inputs = rm.FACTORIES[name]()
    opts = dict(OPTIONS[name])
    batch_only = opts.pop("batch_only", False)
    extra = opts.pop("extra", None)
    extra_inputs = [{**inputs, "x": inputs["x"].to(torch.bfloat16)}] if extra == "bf16" else []
    assistant = CompilerOptimizationAssistant(AnalysisOptions(
        measure_compile_time=opts.pop("measure_compile_time", False),
        kernel_profile=False,  # the corpus checks breaks and recompiles; the kernel profile has its own tests
        input_dims=_batch_dims(inputs) if batch_only else None,
        **opts,
    ))
    start = time.perf_counter()
    with _stderr_and_torch_logs() as err:
        report = assistant.analyze_component(model, inputs, name=name, extra_inputs=extra_inputs)
    return Analysed(name, model, inputs, report, "\n".join(err), time.perf_counter() - start)


def _analysed(name: str) -> Analysed:
    return _analyse(name)


ALL = tuple(rm.FACTORIES)
RUNS = tuple(n for n in ALL if not n.startswith("wrong_shape"))  # the models that run eagerly
COMPILED = tuple(n for n in ALL if "backend" in OPTIONS[n])  # compile time measured

# ---------------------------------------------------------------------------------------------------
# Locations: a real code line, the one executed, in the user's code or the model's own classes
# ---------------------------------------------------------------------------------------------------


@functools.cache
def _code_map(path: str) -> tuple[frozenset[int], tuple[tuple[int, int, str], ...]]:
    """(lines that hold code, (first, last, name) of every function) of a Python file: statements and
    the headers of compound statements (decorators and `def` included); no docstring, comment or
    blank line."""
    tree = ast.parse(Path(path).read_text())
    lines: set[int] = set()
    functions: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring or a bare string
        body = getattr(node, "body", None)
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        if isinstance(body, list) and body and isinstance(body[0], ast.AST):
            lines.update(range(first, body[0].lineno))  # the header of a compound statement
        else:
            lines.update(range(first, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append((first, node.end_lineno or node.lineno, node.name))
    return frozenset(lines), tuple(functions)


def _enclosing_function(path: str, line: int) -> str:
    spans = [(first, last, name) for first, last, name in _code_map(path)[1] if first <= line <= last]
    return min(spans, key=lambda s: s[1] - s[0])[2] if spans else "<module>"


def _model_files(model: torch.nn.Module) -> set[Path]:
    """The files defining the model's own classes (and their forwards, unwrapped)."""
    files = {CORPUS_FILE}
    for module in model.modules():
        for obj in (type(module), inspect.unwrap(type(module).forward)):
            with contextlib.suppress(TypeError, OSError):
                files.add(Path(inspect.getsourcefile(obj) or "").resolve())
    return files


def _location_problems(a: Analysed) -> list[str]:
    problems = []
    files = _model_files(a.model)
    for f in a.report.findings():
        loc = f.location
        if loc is None:
            continue
        where = f"{f.id} at {loc.file}:{loc.line}"
        path = Path(loc.file).resolve()
        if not path.is_file():
            problems.append(f"{where}: no such file")
            continue
        if path.is_relative_to(PACKAGE_DIR):
            problems.append(f"{where}: inside the analyser itself")
        elif path not in files:
            problems.append(f"{where}: neither the user's code nor a class of the model")
        if loc.line not in _code_map(str(path))[0]:
            problems.append(f"{where}: not a code line ({linecache.getline(loc.file, loc.line).strip()!r})")
        if loc.code != (linecache.getline(loc.file, loc.line).strip() or None):
            problems.append(f"{where}: shows {loc.code!r}, not the line's text")
        if loc.function and loc.function != _enclosing_function(str(path), loc.line):
            actual = _enclosing_function(str(path), loc.line)
            problems.append(f"{where}: says function {loc.function!r}, the line is in {actual!r}")
    return problems


# ---------------------------------------------------------------------------------------------------
# Known defects, by test (none left: each `_known(test, models, reason)` marks one as a strict xfail)
# ---------------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------------
# The acceptance, model by model
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", _params("test_analysis_runs", ALL))
def test_analysis_runs(name: str) -> None:
    """Exit 0 in the CLI: no analysis raised (an analyser fault becomes an analysis-error finding)."""
    a = _analysed(name)
    assert not a.report.by_id("analysis-error"), [f.evidence for f in a.report.by_id("analysis-error")]


@pytest.mark.parametrize("name", _params("test_no_unclassified_cause", RUNS))
def test_no_unclassified_cause(name: str) -> None:
    a = _analysed(name)
    other = [f"{f.id}: {f.evidence}" for f in a.report.findings() if f.id.endswith(".other")]
    assert not other


@pytest.mark.parametrize("name", _params("test_every_cause_is_verified_or_says_why", RUNS))
def test_every_cause_is_verified_or_says_why(name: str) -> None:
    """Each recompile cause has a fix re-run to 0 recompiles, or `data["unverified_reason"]`."""
    a = _analysed(name)
    bad = [
        f"{f.id}: {f.evidence}"
        for f in a.causes()
        if f.data.get("recompiles_after") != 0 and not f.data.get("unverified_reason")
    ]
    assert not bad


@pytest.mark.parametrize("name", _params("test_unverified_fix_is_not_recommended", RUNS))
def test_unverified_fix_is_not_recommended(name: str) -> None:
    """A fix the re-run did not confirm is not printed as the fix (Conv3d + GroupNorm in #18)."""
    a = _analysed(name)
    bad = [
        f"{f.id}: fix: {f.suggestion}"
        for f in a.causes()
        if f.data.get("recompiles_after") is None and "mark_dynamic(" in f.suggestion
    ]
    assert not bad


@pytest.mark.parametrize("name", _params("test_locations_are_executed_code_lines", ALL))
def test_locations_are_executed_code_lines(name: str) -> None:
    assert not _location_problems(_analysed(name))


def test_recompile_in_a_library_names_the_way_in() -> None:
    """A recompile whose guard sits in transformers' code names the model's forward too (`via`), unless
    it is that forward."""
    from kernel_pytorch.assistant.locate import definition_location, is_library_file

    a = _analysed("llama")
    entry = definition_location(a.model)
    inside = [f.location for f in a.causes() if f.location and is_library_file(f.location.file)]
    assert inside and entry is not None
    assert all(loc.via == entry or (loc.file, loc.line) == (entry.file, entry.line) for loc in inside)


@pytest.mark.parametrize("name", _params("test_co_varying_inputs_are_marked_together", list(COVARYING)))
def test_co_varying_inputs_are_marked_together(name: str) -> None:
    """The targeted fix marks every input that shares the swept dim, and is verified at 0 recompiles."""
    a = _analysed(name)
    summary = a.one("recompile.summary")
    assert summary is not None and summary.data["recompiles_before"] > 0
    targeted = summary.data["attempts"].get("targeted", {})
    wanted = [f"mark_dynamic({k}, {d})" for k, d in COVARYING[name]]
    missing = [w for w in wanted if w not in targeted.get("fix", "")]
    assert not missing, targeted
    assert targeted["recompiles"] == 0 and summary.data["recompiles_after"] == 0


@pytest.mark.parametrize("name", _params("test_stderr_stays_quiet", ALL))
def test_stderr_stays_quiet(name: str) -> None:
    a = _analysed(name)
    assert "Traceback" not in a.stderr and "ConstraintViolation" not in a.stderr, a.stderr[:2000]


@pytest.mark.parametrize("name", _params("test_regional_compilation_code_runs", COMPILED))
def test_regional_compilation_code_runs(name: str) -> None:
    """Regional compilation is advised only for repeated blocks holding a real share of the
    parameters, and the printed code runs as it is."""
    a = _analysed(name)
    for f in a.report.by_id("compile-time.regional"):
        assert f.data["param_fraction"] >= 0.25, f.title
        code = re.search(r"`(for block in [^`]+)`", f.suggestion)
        assert code is not None, f.suggestion
        exec(code.group(1), {"model": copy.deepcopy(a.model)})  # the advice, pasted as printed


@pytest.mark.parametrize("name", _params("test_text_reads_well", ALL))
def test_text_reads_well(name: str) -> None:
    a = _analysed(name)
    texts = [t for f in a.report.findings() for t in (f.title, f.evidence, f.suggestion)]
    clumsy = r"\ba (other|object|[aeiou]\w*) change|<class '| object at 0x|See the failed guard"
    bad = [t for t in texts if re.search(clumsy, t)]
    assert not bad
    assert a.report.meta["dtype"] not in (None, "None")


@pytest.mark.parametrize("name", _params("test_passing_checks_carry_no_fix", RUNS))
def test_passing_checks_carry_no_fix(name: str) -> None:
    a = _analysed(name)
    passing = [f for f in a.report.findings() if f.id == "readiness.fullgraph" and f.data.get("fullgraph") is True]
    passing += [f for f in a.report.findings() if f.id == "recompile.summary" and f.data.get("recompiles_before") == 0]
    if not passing:  # fullgraph fails here (a break or fallback; torch versions differ): nothing to check
        pytest.skip("no passing check in this report")
    assert not [f.suggestion for f in passing if f.suggestion]


@pytest.mark.parametrize("name", _params("test_specialisation_note_said_once", RUNS))
def test_specialisation_note_said_once(name: str) -> None:
    a = _analysed(name)
    assert sum(f.suggestion.count(_SPECIALISED) + f.evidence.count(_SPECIALISED) for f in a.report.findings()) <= 1


# ---------------------------------------------------------------------------------------------------
# Specific repros
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_rnn_is_classified_with_the_verified_allow_rnn_fix(name: str) -> None:
    a = _analysed(name)
    rnn = [f for f in a.report.compilation_readiness if f.data.get("kind") == "rnn"]
    assert rnn, [f.id for f in a.report.compilation_readiness]
    assert "torch._dynamo.config.allow_rnn = True" in rnn[0].suggestion
    assert rnn[0].data.get("verified") is True
    assert rnn[0].location is not None and rnn[0].location.line == rm.marker_line(name)


def test_frame_fallback_says_which_frame_why_and_what_to_do() -> None:
    a = _analysed("lstm")
    (fallback,) = a.report.by_id("readiness.frame-fallback")
    assert "LSTMTagger.forward" in fallback.title
    assert "LSTM" in fallback.evidence
    assert "allow_rnn" in fallback.suggestion


def test_nothing_compiled_is_said_so() -> None:
    a = _analysed("lstm")
    graphs = a.one("readiness.graphs")
    assert graphs is not None and graphs.data["graph_count"] == 0
    summary = a.one("recompile.summary")
    assert summary is None or not summary.title.startswith("No recompilation")
    assert not a.report.by_id("compile-time.slowest-phase") and not a.report.by_id("compile-time.regional")


def test_rnn_sequence_first_input_dims() -> None:
    a = _analysed("gru")
    assert a.report.meta["sweep"]["batch"][0] == rm.BATCH
    assert a.report.meta["sweep"]["seq"][0] == rm.SEQ


def test_eager_error_in_user_forward_is_located_at_the_user_line() -> None:
    a = _analysed("wrong_shape")
    (err,) = a.report.by_id("readiness.eager-failed")
    assert err.location is not None and err.location.line == rm.marker_line("wrong-shape")
    assert Path(err.location.file).resolve() == CORPUS_FILE


def test_eager_error_inside_torch_names_torch_op_not_the_analyser() -> None:
    a = _analysed("wrong_shape_torch")
    (err,) = a.report.by_id("readiness.eager-failed")
    assert err.location is not None
    assert not Path(err.location.file).resolve().is_relative_to(PACKAGE_DIR)
    assert Path(err.location.file).name == "linear.py"


def test_conv3d_groupnorm_fix_is_verified() -> None:
    a = _analysed("conv3d_groupnorm")
    summary = a.one("recompile.summary")
    assert summary is not None and summary.data["recompiles_after"] == 0


def test_keyword_inputs_behind_a_wrapper_are_classified_and_fixed() -> None:
    a = _analysed("kwargs_wrapped")
    kinds = {f.data.get("kind"): f for f in a.causes()}
    assert {"dynamic-dim", "python-scalar", "dtype"} <= set(kinds)
    assert kinds["dynamic-dim"].data["input"] == "x" and kinds["dynamic-dim"].data["recompiles_after"] == 0
    assert kinds["python-scalar"].data["input"] == "scale" and kinds["python-scalar"].data["recompiles_after"] == 0


def test_nested_inputs_are_swept_and_named() -> None:
    a = _analysed("nested_batch")
    assert "batch" in a.report.meta["sweep"]
    causes = a.causes()
    assert causes and {f.data.get("input") for f in causes} >= {"batch['x']"}
    assert all(f.data.get("recompiles_after") == 0 for f in causes)


def test_sections_not_run_are_said_not_analysed() -> None:
    from rich.console import Console

    from kernel_pytorch.assistant.report.render import render_terminal, to_markdown

    model, inputs = rm.FACTORIES["cross_entropy"]()
    assistant = CompilerOptimizationAssistant(AnalysisOptions(measure_compile_time=False), sections=["recompilations"])
    report = assistant.analyze_component(model, inputs)
    console = Console(file=io.StringIO(), width=200)
    render_terminal(report, console)
    text = console.file.getvalue()
    assert "No findings: Kernel" not in text and "not analysed" in text
    markdown = to_markdown(report)
    assert "## Kernel efficiency\n\nNo findings." not in markdown and "Not analysed" in markdown


# ---------------------------------------------------------------------------------------------------
# The CLI on the corpus: FILE.py:FACTORY, --generate
# ---------------------------------------------------------------------------------------------------


def test_cli_runs_a_corpus_factory(tmp_path: Path) -> None:
    from kernel_pytorch.cli.main import main

    out = tmp_path / "r.json"
    argv = ["analyze", f"{CORPUS_FILE}:cross_entropy", "--no-compile-time", "-q", "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["headline"]["recompiles_before"] == 1


def test_cli_generate_reports_recompiles_per_decode_step(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from kernel_pytorch.cli.main import main

    out = tmp_path / "r.json"
    argv = ["analyze", f"{CORPUS_FILE}:llama", "--generate", "3", "--no-compile-time", "-q", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    (gen,) = [f for f in data["sections"]["recompilations"] if f["id"].startswith("generate.")]
    assert gen["data"]["recompiles_per_step"] and gen["data"]["recompiles_after"] is not None
    # the static cache keeps every decode step after the first on one graph, verified by a second generate()
    assert gen["data"]["fix"] == 'model.generate(..., cache_implementation="static")'
    assert gen["data"]["attempts"]["static cache"]["recompiles_per_step"][2:] == [0]


def test_cli_generate_on_a_model_without_generate_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    from kernel_pytorch.cli.main import main

    try:
        code = main(["analyze", f"{CORPUS_FILE}:lstm", "--generate", "3", "--no-compile-time", "-q"])
    except SystemExit as exc:  # argparse rejects the flag today
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "generate()" in err and "unrecognized" not in err


def test_corpus_timing_is_reported() -> None:
    """Not a check: prints each analysis's seconds (run with -s) for the wall-time budget."""
    seconds = {}
    for name in ALL:
        library = rm.LIBRARY.get(name)
        with contextlib.suppress(ImportError):
            if library is not None:
                __import__(library)
            seconds[name] = round(_analyse(name).seconds, 1)
    print(f"\ncorpus analysis seconds: {seconds}; total {sum(seconds.values()):.1f} s on {os.cpu_count()} cores")
