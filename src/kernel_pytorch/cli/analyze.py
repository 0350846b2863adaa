"""`kernel-pytorch analyze [FILE.py[:FACTORY]]`: the compile report of a model.

With no argument it analyses the built-in tiny Llama (`--model NAME` picks another built-in) on
the best device present. FILE.py:FACTORY names a function returning (model, example_inputs), the
inputs a tuple of positional arguments or a dict of keyword arguments; a FILE.py defining Model,
get_inputs() and get_init_inputs() works too.

--shapes sets the sizes of the recompilation sweep per dimension kind:
    --shapes "batch=1,2,4;seq=16,32"     (kinds: batch, seq, spatial)
--dims says which input dims those kinds are when the guess is wrong (built-in models know theirs):
    --dims "0:0=batch,1=seq;attention_mask:0=batch,1=seq"   (input index or keyword name first)

--backend takes a registered torch.compile backend (inductor, aot_eager, eager, ...) or a callable
named as FILE.py:NAME or module:NAME.
--fail-on error|warning makes the report a gate for CI: exit 1 when it has a finding of that
severity or worse.
--sections a,b runs only those analyses (compilation_readiness, recompilations, compile_time,
kernel_efficiency, optimization_suggestions, ...; hyphens work too); --html PATH writes one
self-contained HTML report with a roofline and a kernel-time chart; --trace PATH writes the profiled
eager and compiled runs as one Chrome trace; --train also measures forward+backward.
The terminal report is short: the headline, the top fixes, one line per finding; --verbose prints
every finding in full (evidence, every place, fix and gain), as --json, --markdown and --html do.
--generate N analyses a Hugging Face model's generate() instead of its forward: N new tokens with
the forward compiled, recompilations per decode step, the fix verified (exit 2 for a model
without generate()).

Exit status: 0 the analysis ran (whatever it found, unless --fail-on), 1 the report has a finding at
or above --fail-on, 2 the model or the arguments could not be used.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel_pytorch.cli._parser import command, details

# torch and the analyser are imported inside the functions that need them: building the parser (for
# --help or an argument error) must not pay the seconds that importing torch takes
if TYPE_CHECKING:
    import torch

_KINDS = ("batch", "seq", "spatial")
_SEVERITIES = ("error", "warning", "info")  # worst first; --fail-on takes the first two


class UsageError(ValueError):
    """An argument that cannot be used; reported on stderr with exit status 2."""


def parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """ "batch=1,2,4;seq=16,32" -> {"batch": (1, 2, 4), "seq": (16, 32)}."""
    out: dict[str, tuple[int, ...]] = {}
    for part in filter(None, (p.strip() for p in re.split(r"[;\s]+", text))):
        m = re.fullmatch(r"(\w+)=(\d+(?:,\d+)*)", part)
        if not m or m.group(1) not in _KINDS:
            raise UsageError(f"bad --shapes item {part!r}: expected KIND=N[,N...] with KIND one of {_KINDS}")
        sizes = tuple(int(s) for s in m.group(2).split(","))
        if min(sizes) < 1:
            raise UsageError(f"--shapes sizes must be >= 1, got {part!r}")
        out[m.group(1)] = sizes
    if not out:
        raise UsageError("--shapes is empty")
    return out


def parse_dims(text: str) -> dict[int | str, dict[int, str]]:
    """ "0:0=batch,1=seq;mask:0=batch" -> {0: {0: "batch", 1: "seq"}, "mask": {0: "batch"}}."""
    out: dict[int | str, dict[int, str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = re.fullmatch(r"(\w+):(\d+=\w+(?:,\d+=\w+)*)", part)
        if not m:
            raise UsageError(f"bad --dims item {part!r}: expected INPUT:DIM=KIND[,DIM=KIND...]")
        key: int | str = int(m.group(1)) if m.group(1).isdigit() else m.group(1)
        dims: dict[int, str] = {}
        for item in m.group(2).split(","):
            dim, kind = item.split("=")
            if kind not in _KINDS:
                raise UsageError(f"bad --dims kind {kind!r}: use one of {_KINDS}")
            dims[int(dim)] = kind
        out[key] = dims
    return out


def parse_sections(text: str) -> list[str]:
    """ "kernel-efficiency,compile_time" -> ["kernel_efficiency", "compile_time"], checked against the
    report's sections (the error names the valid ones)."""
    from kernel_pytorch.assistant.findings import SECTIONS

    names = [p.strip().replace("-", "_") for p in text.split(",") if p.strip()]
    bad = [n for n in names if n not in SECTIONS]
    if bad or not names:
        raise UsageError(f"unknown --sections {', '.join(bad) or repr(text)}; valid sections: {', '.join(SECTIONS)}")
    return names


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype a --dtype name stands for (None for None)."""
    from kernel_pytorch.cli._factory import DTYPES

    if name is None:
        return None
    if name not in DTYPES:
        raise UsageError(f"unknown --dtype {name!r}; use one of {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def resolve_backend(name: str) -> str | Any:
    """The torch.compile backend --backend names: a registered backend name as it is, or the callable
    a `FILE.py:NAME` / `module:NAME` spec names. Checked before any model is built."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend

    if ":" in name and not name.startswith(":"):
        from kernel_pytorch.cli._factory import FactoryError, load_callable

        try:
            return load_callable(name)
        except FactoryError as exc:
            raise UsageError(f"--backend {name}: {exc}") from exc
    try:
        lookup_backend(name)
    except Exception as exc:  # torch raises InvalidBackend (its message lists every backend)
        # torch's own list without its debugging backends, plus the two debugging ones people use
        known = ", ".join(sorted({*torch._dynamo.list_backends(), "eager", "aot_eager"}))
        raise UsageError(
            f"unknown --backend {name!r}; registered backends: {known}; or a callable as FILE.py:NAME"
        ) from exc
    return name


def load_target(args: argparse.Namespace) -> tuple[torch.nn.Module, Any, str, dict | None, str | None]:
    """(model, example inputs, report name, input dims or None, device to analyse on) for the CLI arguments.

    The device is --device when given; else, for a built-in model, the one it was built on (cuda if
    present, else cpu), and for a user factory None (the model stays where the factory put it).
    """
    if args.target and args.model:
        raise UsageError("give either FILE.py[:FACTORY] or --model NAME, not both")
    if args.target:
        from kernel_pytorch.cli._factory import FactoryError, load_factory

        try:
            model, inputs = load_factory(args.target)()
        except FactoryError as exc:
            raise UsageError(str(exc)) from exc
        return model, inputs, args.target, None, args.device or None
    import torch

    from kernel_pytorch.models import DEFAULT_DEMO, build_model, input_spec, list_models

    name = args.model or DEFAULT_DEMO
    if name not in list_models():
        raise UsageError(f"unknown model {name!r}; built-in models: {', '.join(list_models())}")
    device = args.device or _default_device()
    dtype = parse_dtype(args.dtype) or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model, inputs = build_model(name, device=device, dtype=dtype)
    return model, inputs, name, dict(enumerate(input_spec(name))), device


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    try:
        # the cheap checks first: a typo in an argument is reported before torch or the model loads
        shapes = parse_shapes(args.shapes) if args.shapes else None
        dims = parse_dims(args.dims) if args.dims else None
        dtype = parse_dtype(args.dtype)
        backend = resolve_backend(args.backend)
        sections = parse_sections(args.sections) if args.sections else None
        if args.generate is not None and args.generate < 1:
            raise UsageError(f"--generate takes a number of new tokens >= 1, got {args.generate}")
        model, inputs, name, builtin_dims, device = load_target(args)
        if args.generate is not None:
            from kernel_pytorch.assistant.recompiles.generate import has_generate, no_generate_message

            if not has_generate(model):
                raise UsageError(no_generate_message(model).replace("generation analysis", "--generate"))
    except UsageError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    except Exception as exc:  # building the model failed (no such device, out of memory, ...)
        err.print(f"[red]error:[/red] cannot build the model: {type(exc).__name__}: {exc}")
        return 2
    from kernel_pytorch.assistant import AnalysisOptions, CompilerOptimizationAssistant
    from kernel_pytorch.assistant.report.render import render_terminal, to_json, to_markdown

    dynamic = {"auto": None, "true": True, "false": False}[args.dynamic]

    start = time.perf_counter()
    # the phases on stderr, each with its time once done; nothing when stderr is no terminal or --quiet
    shown = err.is_terminal and not args.quiet
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True,
        disable=not shown,
    ) as progress:
        task = progress.add_task(f"analysing {name}", total=None)
        phase: list[Any] = [None, start]

        def step(message: str) -> None:
            now = time.perf_counter()
            if shown and phase[0] is not None:
                progress.console.print(f"[dim]  done: {phase[0]} ({now - phase[1]:.1f} s)[/dim]")
            phase[:] = [message, now]
            progress.update(task, description=f"{name}: {message}")

        options = AnalysisOptions(
            backend=backend,
            mode=args.mode,
            dynamic=dynamic,
            shapes=shapes,
            input_dims=dims if dims is not None else builtin_dims,
            measure_compile_time=not args.no_compile_time,
            cold_cache=args.cold_cache,
            kernel_profile=not args.no_profile,
            train=True if args.train else None,
            chrome_trace=args.trace,
        )
        assistant = CompilerOptimizationAssistant(options, device=device, dtype=dtype, sections=sections,
                                                  progress=step)
        # the model runs a dozen times; its own prints would bury the report
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                if args.generate is not None:
                    report = assistant.analyze_generate(model, inputs, max_new_tokens=args.generate, name=name)
                else:
                    report = assistant.analyze_component(model, inputs, name=name)
        except Exception as exc:  # the analyses catch their own errors; this is moving to --device/--dtype
            err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}")
            return 2
    lines = printed.getvalue().count("\n")
    if lines:
        err.print(f"[dim]the model printed {lines} line(s) while being analysed; not shown[/dim]")
    if not args.quiet:
        render_terminal(report, Console(), verbose=args.verbose)
    if args.json:
        Path(args.json).write_text(to_json(report))
        err.print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(to_markdown(report))
        err.print(f"wrote {args.markdown}")
    if args.html:
        from kernel_pytorch.assistant.report.html import to_html

        Path(args.html).write_text(to_html(report))
        err.print(f"wrote {args.html}")
    err.print(f"[dim]analysis took {time.perf_counter() - start:.1f} s[/dim]")
    return _gate(report, args.fail_on, err)


def failing_findings(report: Any, fail_on: str | None) -> list[Any]:
    """The findings of `report` at or above severity `fail_on` ("error" or "warning"); [] for None."""
    if fail_on is None:
        return []
    worst = _SEVERITIES[: _SEVERITIES.index(fail_on) + 1]
    return [f for f in report.findings() if f.severity.value in worst]


def _gate(report: Any, fail_on: str | None, err: Any) -> int:
    """Exit status 1 when --fail-on finds findings at or above its severity, else 0."""
    failing = failing_findings(report, fail_on)
    if not failing:
        return 0
    ids = ", ".join(sorted({f.id for f in failing}))
    err.print(f"[red]--fail-on {fail_on}:[/red] {len(failing)} finding(s) at or above {fail_on}: {ids}")
    return 1


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "analyze", details(__doc__))
    p.add_argument("target", nargs="?", metavar="FILE.py[:FACTORY]", help="the model to analyse (default: built-in)")
    p.add_argument("--model", metavar="NAME", help="a built-in model (default llama-tiny)")
    p.add_argument("--device", help="device to analyse on (default: cuda if present, else cpu)")
    p.add_argument("--dtype", metavar="DT", help="cast parameters and float inputs first (fp32, bf16, fp16, fp64)")
    p.add_argument("--shapes", metavar="SPEC", help='sweep sizes, e.g. "batch=1,2,4;seq=16,32"')
    p.add_argument("--dims", metavar="SPEC", help='which dims vary, e.g. "0:0=batch,1=seq"')
    p.add_argument(
        "--backend", default="inductor", help="backend whose compile time is measured (a name, or FILE.py:NAME)"
    )
    p.add_argument("--mode", default=None, help="torch.compile mode for that compile (e.g. max-autotune)")
    p.add_argument(
        "--dynamic", choices=("auto", "true", "false"), default="auto", help="dynamic= the model is compiled with"
    )
    p.add_argument("--no-compile-time", action="store_true", help="skip the backend compile (fast)")
    p.add_argument(
        "--generate",
        type=int,
        metavar="N",
        default=None,
        help="analyse generate() for N new tokens instead of forward: recompiles per decode step (HF models)",
    )
    p.add_argument("--cold-cache", action="store_true", help="bypass Inductor's caches for the timed compile")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the report as Markdown")
    p.add_argument("--html", metavar="PATH", help="also write the report as one self-contained HTML file")
    p.add_argument("--trace", metavar="PATH", help="write the profiled eager and compiled runs as a Chrome trace")
    p.add_argument("--sections", metavar="A,B", help="run only these analyses (default: all)")
    p.add_argument("--train", action="store_true", help="also measure forward+backward (default: if training)")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel profile and the compile verdict")
    p.add_argument("-q", "--quiet", action="store_true", help="print neither the report nor the progress")
    p.add_argument(
        "-v", "--verbose", action="store_true", help="print every finding in full (default: one line per finding)"
    )
    p.add_argument(
        "--fail-on",
        choices=_SEVERITIES[:2],
        default=None,
        help="exit 1 when the report has a finding of this severity or worse (for CI)",
    )
    p.set_defaults(func=run)
