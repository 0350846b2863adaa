"""Entry point of `kernel-pytorch`: builds the parser from the subcommand modules and dispatches.

Only the subcommand being run is imported (its module may import torch, which takes seconds); the
others appear in `--help` by their one-line help below. So `kernel-pytorch --help` and an argument
error (`kernel-pytorch analyze --nosuchflag`) answer at once, without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from kernel_pytorch import __version__
from kernel_pytorch.cli._parser import HELP

# Each name is a module in this package defining `register(subparsers)`; the subparser sets `func`,
# called with the parsed args and returning the process exit code.
SUBCOMMANDS: tuple[str, ...] = ("doctor", "analyze", "validate", "optimize", "bench", "export", "convert")


# Lines other packages log while being imported that say nothing about the user's run: torchao's
# optional C++ extensions that do not fit this Python or torch ("Failed to load .../_C_mxfp8...so"), and
# torch's deprecation notice for torchao's Enum pytree registrations. transformers imports torchao
# whenever it is installed, so any Hugging Face model brings them; `--verbose` shows them.
_IMPORT_NOISE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torchao", ("Failed to load ",)),
    ("torch.utils._pytree", ("is an Enum subclass and is now natively supported",)),
)


class _DropImportNoise(logging.Filter):
    """Drops a logger's records whose message contains one of `parts`."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        super().__init__()
        self.parts = parts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(part in message for part in self.parts)


def _quiet_import_noise() -> None:
    """Filter `_IMPORT_NOISE` out of its loggers (once per logger), before the run imports anything."""
    for name, parts in _IMPORT_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropImportNoise) for f in logger.filters):
            logger.addFilter(_DropImportNoise(parts))


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in `argv` (the first argument that is one), or None."""
    for arg in argv:
        if arg in SUBCOMMANDS:
            return arg
        if not arg.startswith("-"):
            return None  # a positional that is no subcommand: argparse reports it
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The CLI parser. With `argv`, only the subcommand it names is imported and registered in full;
    without, every subcommand is (what a caller inspecting the whole parser wants)."""
    parser = argparse.ArgumentParser(
        prog="kernel-pytorch",
        description="Analyse, optimise, validate and benchmark PyTorch models on the GPU.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what kernel_pytorch decides")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print kernel_pytorch's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name in SUBCOMMANDS:
        if argv is None or name == chosen:
            importlib.import_module(f"kernel_pytorch.cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=HELP[name], add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (also used as the console script's status)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not {"-v", "--verbose"} & set(argv):
        _quiet_import_noise()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
