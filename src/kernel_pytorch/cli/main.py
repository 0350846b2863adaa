"""Entry point of `kernel-pytorch`: builds the parser from the subcommand modules and dispatches."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Each name is a module in this package defining `register(subparsers)`; the subparser sets `func`,
# called with the parsed args and returning the process exit code.
SUBCOMMANDS: tuple[str, ...] = ("doctor", "analyze", "validate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-pytorch",
        description="Analyse, optimise, validate and benchmark PyTorch models on the GPU.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what kernel_pytorch decides")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"kernel_pytorch.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (also used as the console script's status)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
