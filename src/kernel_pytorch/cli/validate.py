"""`kernel-pytorch validate ORIGINAL OPTIMIZED`: correctness, speed, memory, compile and determinism.

ORIGINAL and OPTIMIZED are factory specs (`FILE.py:NAME`, `module:NAME`, or a `FILE.py` defining
`Model`, `get_inputs()`, `get_init_inputs()`); each factory returns `(model, example_inputs)`, and the
inputs of ORIGINAL are used for both. One spec alone must name a factory returning
`(original, optimized, example_inputs)`, or a file defining both `Model` and `ModelNew`.

Exit status: 0 correct, 1 correctness failed, 2 the specs could not be loaded, a factory raised
(one line on stderr naming it), or the models could not be moved to --device / --dtype.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernel_pytorch._tree import move
from kernel_pytorch.cli._factory import (
    DTYPES,
    FactoryError,
    call,
    load_callable,
    load_factory,
    normalize_inputs,
    placement_error,
    trio_pair,
)
from kernel_pytorch.cli._parser import command, details
from kernel_pytorch.validation import ValidationOptions, validate_optimization


def load_pair(specs: list[str], seed: int = 0) -> tuple[nn.Module, nn.Module, tuple | dict, list[str]]:
    """(original, optimized, inputs, notes) from one or two factory specs.

    Both factories run under the same RNG seed, so models built the same way start with the same
    weights; when the optimized model's state_dict has exactly the original's keys and shapes, the
    original's weights are copied in as well (said in the notes).
    """
    notes: list[str] = []
    if len(specs) == 1:
        spec = specs[0]
        pair = trio_pair(spec)
        if pair is not None:
            torch.manual_seed(seed)
            original, inputs = pair[0]()
            torch.manual_seed(seed)
            optimized, _ = pair[1]()
            notes.append(f"{spec}: Model vs ModelNew")
        else:
            torch.manual_seed(seed)
            result = call(load_callable(spec), spec)
            if not (isinstance(result, (tuple, list)) and len(result) == 3):
                raise FactoryError(
                    f"{spec} must return (original, optimized, example_inputs) when given alone; "
                    "or pass two factories, each returning (model, example_inputs)"
                )
            original, optimized, inputs = result
            for name, m in (("original", original), ("optimized", optimized)):
                if not isinstance(m, nn.Module):
                    raise FactoryError(f"{spec} returned a {type(m).__name__} as the {name}; expected nn.Module")
            inputs = normalize_inputs(inputs)
    elif len(specs) == 2:
        torch.manual_seed(seed)
        original, inputs = load_factory(specs[0])()
        torch.manual_seed(seed)
        optimized, _ = load_factory(specs[1])()
    else:
        raise FactoryError("give one factory returning (original, optimized, inputs) or two factories")
    if optimized is not original:
        a, b = original.state_dict(), optimized.state_dict()
        if a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a):
            optimized.load_state_dict(a)
            notes.append("copied the original's weights into the optimized model (same state_dict keys)")
    return original, optimized, inputs, notes


def _place(original: nn.Module, optimized: nn.Module, inputs: Any, device: str | None, dtype: str | None) -> Any:
    """Both models moved to `device` and cast to `dtype` (None: as they are); returns the inputs placed alike."""
    dt = DTYPES[dtype] if dtype else None
    for m in (original, optimized):
        m.to(device=device, dtype=dt)
    return move(inputs, device, dt)


def run(args: argparse.Namespace) -> int:
    try:
        original, optimized, inputs, notes = load_pair(args.factories)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        inputs = _place(original, optimized, inputs, args.device, args.dtype)
    except Exception as exc:  # no such device, out of memory, ...
        print(placement_error("the models", exc), file=sys.stderr)
        return 2
    try:
        options = ValidationOptions(check_gradients=not args.no_grad, reference=args.reference,
                                    check_performance=not args.no_perf, check_compile=not args.no_compile,
                                    check_determinism=not args.no_determinism, compile_backend=args.backend,
                                    cpu_min_run_time=args.cpu_min_run_time)
    except (TypeError, ValueError) as exc:  # --cpu-min-run-time 0, --backend ''
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = validate_optimization(original, optimized, inputs, seeds=tuple(range(args.seeds)), options=options)
    if args.json:
        print(result.to_json())
    else:
        for n in notes:
            print(f"note: {n}")
        print(result.summary())
    if args.plot and result.performance_improvement is not None:
        from kernel_pytorch.benchmark.plots import plot_before_after

        labels, timings = [], []
        for pc in result.performance_improvement.passes.values():
            if pc.original and pc.optimized:
                labels += [f"original {pc.pass_name}", f"optimized {pc.pass_name}"]
                timings += [pc.original, pc.optimized]
        if timings:
            path = plot_before_after(labels, timings, Path(args.plot), title=f"validate on {result.device}")
            print(f"wrote {path}", file=sys.stderr)
    return 0 if result.passed else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "validate", details(__doc__))
    p.add_argument("factories", nargs="+", metavar="FACTORY",
                   help="ORIGINAL OPTIMIZED, or one factory returning both (FILE.py:NAME, module:NAME, FILE.py)")
    p.add_argument("--seeds", type=int, default=3, help="random seeds to check (default 3)")
    p.add_argument("--no-grad", action="store_true", help="compare outputs only, not gradients")
    p.add_argument("--reference", choices=("auto", "fp64", "none"), default="auto",
                   help="fp64 copy of the original for the long-reduction budget (default auto)")
    p.add_argument("--no-perf", action="store_true", help="skip timing and memory")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile(fullgraph=True) check")
    p.add_argument("--no-determinism", action="store_true", help="skip the two-run bitwise check")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--device", default=None, help="move both models and the inputs here (e.g. cuda)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="cast both models and float inputs")
    p.add_argument("--cpu-min-run-time", type=float, default=0.2, help="CPU timing seconds per measurement")
    p.add_argument("--plot", default=None, metavar="PNG", help="write a before/after bar chart")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
