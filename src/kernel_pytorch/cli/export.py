"""`kernel-pytorch export [FILE.py[:FACTORY]] --out DIR [--aoti]`: optimize a model, export it with
`torch.export` and write the program (and, with --aoti, an AOTInductor package).

FACTORY is a factory spec as for `optimize` (`FILE.py:NAME`, `module:NAME`, or a `FILE.py` defining
`Model`, `get_inputs()`, `get_init_inputs()`) returning `(model, example_inputs)`; without one,
`--model NAME` names a built-in model (default llama-tiny). The model is optimized (validated), put in
eval mode, exported with the batch and sequence dims dynamic as the analyser infers them (`--dynamic
static` for fixed shapes), and the program is checked against eager on inputs of other sizes.

Writes `DIR/model.pt2` (`torch.export.save`; `kernel_pytorch.deploy.load_program` reads it) and, with
`--aoti`, `DIR/model_aoti.pt2` (`kernel_pytorch.deploy.load_package` loads it, on the device it was
compiled for). Prints each path written.

Exit status: 0 written, 1 the export failed or does not match eager, 2 the factory could not be loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from kernel_pytorch._errors import short_error
from kernel_pytorch.cli._factory import DTYPES
from kernel_pytorch.cli._parser import add_model_arguments, command, details
from kernel_pytorch.cli.optimize import load_placed
from kernel_pytorch.deploy.export import ExportMismatch, aoti_package, export, our_ops
from kernel_pytorch.optimize import optimize


def run(args: argparse.Namespace) -> int:
    if (loaded := load_placed(args)) is None:
        return 2
    model, inputs, target = loaded
    model, report = optimize(model, inputs, validate=not args.no_validate, seeds=(0,))
    print(report.summary())
    model.eval()
    dynamic: Any = "auto" if args.dynamic == "auto" else None
    try:
        program = export(model, inputs, dynamic=dynamic)
    except ExportMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"error: torch.export of {target} failed: {short_error(exc, 2000, lines=8)}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ops = our_ops(program)
    print(f"exported {target}: {len(ops)} kernel_pytorch op(s) in the graph ({', '.join(ops) or 'none'})")
    torch.export.save(program, out / "model.pt2")
    print(f"wrote {out / 'model.pt2'}")
    if args.aoti:
        try:
            path = aoti_package(program, inputs, out / "model_aoti.pt2")
        except Exception as exc:
            print(f"error: AOTInductor compile failed: {short_error(exc, 2000, lines=8)}", file=sys.stderr)
            return 1
        print(f"wrote {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "export", details(__doc__))
    add_model_arguments(p, DTYPES)
    p.add_argument("--out", required=True, metavar="DIR", help="write model.pt2 (and model_aoti.pt2) here")
    p.add_argument("--aoti", action="store_true", help="also compile an AOTInductor package (minutes on CPU)")
    p.add_argument("--dynamic", choices=("auto", "static"), default="auto",
                   help="auto: batch/seq dims dynamic as the analyser infers them; static: fixed shapes")
    p.add_argument("--no-validate", action="store_true", help="skip optimize()'s validation")
    p.set_defaults(func=run)
