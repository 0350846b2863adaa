"""`kernel-pytorch convert IN OUT [--unsafe-full-pickle] [--max-shard-size SIZE]`: convert a TRUSTED
torch.save checkpoint (.bin/.pt/.pth: a state dict, or a dict holding one under "state_dict"/"model")
to the safetensors layout `kernel_pytorch.save` writes, so that `kernel_pytorch.load(OUT, model)` reads
it without pickle from then on.

This command unpickles IN: unpickling runs code from the file, so convert only files you trust. IN is
read with torch.load(weights_only=True), which takes tensors and plain containers only;
--unsafe-full-pickle lifts that restriction (a pickled nn.Module, custom classes).

Exit status: 0 converted, 2 the file could not be read or holds no state dict.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

from kernel_pytorch.cli._parser import command


def run(args: argparse.Namespace) -> int:
    from kernel_pytorch.deploy.convert import WARNING, convert

    print("warning: " + WARNING.format(src=args.src, safe=not args.unsafe_full_pickle), file=sys.stderr)
    try:
        written = convert(args.src, args.out, unsafe_full_pickle=args.unsafe_full_pickle,
                          max_shard_size=args.max_shard_size)
    except (OSError, ValueError, TypeError, RuntimeError, pickle.UnpicklingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if isinstance(exc, pickle.UnpicklingError) and not args.unsafe_full_pickle:
            print("hint: weights_only refused an object in the file; if you trust it, rerun with "
                  "--unsafe-full-pickle", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "convert", __doc__)  # the whole docstring: its first paragraph says to trust the file
    p.add_argument("src", type=Path, metavar="IN", help="the torch.save checkpoint (.bin/.pt/.pth)")
    p.add_argument("out", type=Path, metavar="OUT", help="the output directory")
    p.add_argument("--unsafe-full-pickle", action="store_true",
                   help="unpickle without weights_only's restrictions (runs code from the file: trusted files only)")
    p.add_argument("--max-shard-size", default="5GB", metavar="SIZE", help="bytes per weight file (default 5GB)")
    p.set_defaults(func=run)
