"""`kernel-pytorch optimize [FILE.py[:FACTORY]] [--model NAME] [--save DIR]`: optimize a model, print
what changed and the validation of the result against the original.

FACTORY is a factory spec (`FILE.py:NAME`, `module:NAME`, or a `FILE.py` defining `Model`,
`get_inputs()`, `get_init_inputs()`) returning `(model, example_inputs)`; without one, `--model NAME`
names a built-in model (default llama-tiny). The model is optimized with `kernel_pytorch.optimize` on
those inputs, validated, and the report printed. A factory's file may also define `get_extra_inputs()`,
a list of calls of other shapes (other batch sizes, sequence lengths): they go to optimize() as
`extra_inputs`, which marks the dims that vary dynamic where that recompiles less (the report's
`mark_dynamic` step; `--save` writes them to the manifest's `dynamic_dims`).

`--save DIR` writes the optimized model with `kernel_pytorch.save`: `DIR/model.safetensors` (the
weights under the original model's state_dict keys, which optimize() keeps; shards and
`model.safetensors.index.json` past 5GB) and `DIR/kernel_pytorch.json`, the manifest (the kept swaps, the
compile steps and options, versions, tensors, the report, and the factory under "metadata"). To load:
`kernel_pytorch.load(DIR, make)` with the factory function builds the model, re-applies the swaps and
loads the weights, without pickle (after `--dtype`, cast the built model the same way first).

Exit status: 0 the returned model passed validation, 1 it did not (only when the unchanged model
already fails against a copy of itself), 2 the factory could not be loaded, raised (one line on stderr
naming it) or could not be moved to --device / --dtype, or --save failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernel_pytorch._tree import move
from kernel_pytorch.cli._factory import DTYPES, FactoryError, load_extra_inputs, load_factory, placement_error
from kernel_pytorch.cli._parser import add_model_arguments, command, details
from kernel_pytorch.optimize import CompileOptions, OptimizeReport, optimize


def save(model: nn.Module, report: OptimizeReport, directory: Path, factory: str,
         compile_options: CompileOptions | None = None) -> list[Path]:
    """Write the optimized model with `kernel_pytorch.save` (safetensors + the manifest, the factory in
    its metadata) to `directory`; returns the files written."""
    from kernel_pytorch.deploy import save as save_model

    return save_model(model, directory, report=report, compile_options=compile_options,
                      metadata={"factory": factory})


def _components(text: str) -> Any:
    if text in ("auto", "none"):
        return text
    return [c.strip() for c in text.split(",") if c.strip()]


def _rewrite(text: str | None) -> Any:
    """--rewrite: absent (none), given alone (every family) or a comma list of families."""
    if text is None:
        return False
    if text == "all":
        return True
    return [f.strip() for f in text.split(",") if f.strip()]


def load(args: argparse.Namespace) -> tuple[nn.Module, Any, str]:
    """(model, example inputs, what it is) from the factory or the built-in model the args name."""
    if args.factory and args.model:
        raise FactoryError("give either FILE.py[:FACTORY] or --model NAME, not both")
    torch.manual_seed(0)
    if args.factory:
        model, inputs = load_factory(args.factory)()
        return model, inputs, args.factory
    from kernel_pytorch.models import DEFAULT_DEMO, build_model, list_models

    name = args.model or DEFAULT_DEMO
    if name not in list_models():
        raise FactoryError(f"unknown model {name!r}; built-in models: {', '.join(list_models())}")
    model, inputs = build_model(name)
    return model, inputs, name


def load_placed(args: argparse.Namespace) -> tuple[nn.Module, Any, str] | None:
    """`load`, then the model and inputs moved to --device / cast to --dtype; None (the error printed)
    when the factory or model cannot be loaded (the caller exits 2)."""
    try:
        model, inputs, target = load(args)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    try:
        if args.device or args.dtype:
            model.to(device=args.device, dtype=DTYPES[args.dtype] if args.dtype else None)
        return model, _placed(args, inputs), target
    except Exception as exc:  # no such device, out of memory, ...
        print(placement_error("the model", exc), file=sys.stderr)
        return None


def _placed(args: argparse.Namespace, inputs: Any) -> Any:
    """`inputs` moved to --device and their floating tensors cast to --dtype (as given where neither is)."""
    if not (args.device or args.dtype):
        return inputs
    return move(inputs, args.device, DTYPES[args.dtype] if args.dtype else None)


def _extra_inputs(args: argparse.Namespace) -> list[Any] | None:
    """The factory file's `get_extra_inputs()` calls, placed as the example inputs are; None (the error
    printed) when they cannot be loaded."""
    if not args.factory:
        return []
    try:
        calls = load_extra_inputs(args.factory)
        return [_placed(args, c) for c in calls]
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except Exception as exc:  # no such device, out of memory, ...
        print(placement_error("the extra inputs", exc), file=sys.stderr)
    return None


def run(args: argparse.Namespace) -> int:
    if (loaded := load_placed(args)) is None or (extra := _extra_inputs(args)) is None:
        return 2
    model, inputs, target = loaded
    compile_mode: Any = {"auto": "auto", "on": True, "off": False}[args.compile]
    options = CompileOptions(backend=args.backend) if args.backend else None
    try:
        model, report = optimize(model, inputs, extra_inputs=extra, components=_components(args.components),
                                 compile=compile_mode, validate=not args.no_validate, compile_options=options,
                                 seeds=tuple(range(args.seeds)), tf32=args.tf32, rewrite=_rewrite(args.rewrite))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.summary())
    if args.save:
        try:
            written = save(model, report, Path(args.save), target, options)
        except (OSError, RuntimeError, TypeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    return 0 if report.passed else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "optimize", details(__doc__))
    add_model_arguments(p, DTYPES)
    p.add_argument("--components", default="auto",
                   help="auto, none, or a comma list of rule names / families (e.g. norm,hf_rms_norm)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="regional compilation: auto (where measured faster, CUDA only), on, off")
    p.add_argument("--backend", default=None, help="torch.compile backend for --compile on (default inductor)")
    p.add_argument("--tf32", action="store_true",
                   help="opt in to TF32 for fp32 matmuls on CUDA (process-wide; kept if faster and within tolerance)")
    p.add_argument("--rewrite", nargs="?", const="all", default=None, metavar="FAMILIES",
                   help="also rewrite hand-written patterns in forwards (all families, or a list of: "
                        "norm,activation,rope,cross_entropy)")
    p.add_argument("--no-validate", action="store_true", help="skip validation (changes are then unchecked)")
    p.add_argument("--seeds", type=int, default=2, help="validation seeds (default 2)")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="save the optimized model (safetensors + manifest) with kernel_pytorch.save")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
