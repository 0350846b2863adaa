"""What every subcommand's parser shares: its entry under `kernel-pytorch` (the one-line help, listed
here so `main` can show every subcommand without importing them, and the description from its module
docstring) and the arguments naming the model a subcommand optimizes (a factory or a built-in model,
and where it runs). Imports argparse only: `--help` answers before torch is imported."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

# the one-line help of each subcommand
HELP: dict[str, str] = {
    "doctor": "print versions, device and whether the Triton kernels are active",
    "analyze": "compile report of a model: graph breaks, recompilations, compile time",
    "validate": "check an optimized model against the original: correctness, speed, memory, compile",
    "optimize": "swap in kernel_pytorch's modules and compile fixes, validated; print what changed",
    "bench": "run benchmark suites (correctness-gated) and write JSON, markdown and plots",
    "export": "optimize, then torch.export (and AOTInductor-compile) a model; write the files",
    "convert": "convert a trusted torch.save checkpoint to safetensors (unpickles it once)",
}


def details(doc: str | None) -> str | None:
    """A subcommand module's docstring past its first paragraph (the usage line): its --help text."""
    return doc.split("\n\n", 1)[1] if doc and "\n\n" in doc else doc


def command(sub: argparse._SubParsersAction, name: str, description: str | None = None) -> argparse.ArgumentParser:
    """The subparser of subcommand `name`, with its `HELP` line and `description` printed as written."""
    return sub.add_parser(name, help=HELP[name], description=description,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_model_arguments(p: argparse.ArgumentParser, dtypes: Iterable[str]) -> None:
    """FILE.py[:FACTORY] or --model NAME, and --device / --dtype (one of `dtypes`): what
    `cli.optimize.load_placed` reads."""
    p.add_argument("factory", nargs="?", metavar="FILE.py[:FACTORY]",
                   help="FILE.py:NAME, module:NAME or FILE.py (Model/get_inputs); default: a built-in model")
    p.add_argument("--model", metavar="NAME", help="a built-in model (default llama-tiny)")
    p.add_argument("--device", default=None, help="move the model and inputs here first (e.g. cuda)")
    p.add_argument("--dtype", choices=sorted(dtypes), default=None, help="cast the model and float inputs first")


__all__ = ["HELP", "add_model_arguments", "command", "details"]
