"""`kernel-pytorch bench [SUITE ...] [--out DIR]`: run benchmark suites, write JSON, markdown and PNGs.

Without --out each suite writes to a fresh `bench-results/<suite>-<device>-<timestamp>/` under the
current directory; an --out that already holds a suite's results (the committed
benchmarks/results/, say) is refused unless --overwrite is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kernel_pytorch.benchmark.suites import ALIASES, output_paths, run_suite, suite_names
from kernel_pytorch.benchmark.timer import resolve_device

DEFAULT_ROOT = "bench-results"


def _progress_bar():
    """A rich progress bar on stderr and the callback that drives it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=False,
    )
    task = {"id": None}

    def update(done: int, total: int, what: str) -> None:
        if task["id"] is None:
            task["id"] = bar.add_task(what, total=total)
        bar.update(task["id"], completed=done, total=total, description=what[:40])

    def reset() -> None:
        task["id"] = None

    return bar, update, reset


def fresh_dir(root: Path, suite: str, device: str | None) -> Path:
    """`root/<suite>-<device>-<timestamp>`, suffixed when that exists already (never an old directory)."""
    try:
        dev = str(resolve_device(device)).replace(":", "")
    except (RuntimeError, ValueError):  # a bad --device: the suite run reports it
        dev = "".join(c for c in str(device) if c.isalnum()) or "device"
    base = root / f"{suite}-{dev}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _out_dirs(args: argparse.Namespace, names: list[str]) -> dict[str, Path] | str:
    """Where each suite writes, or why not (an --out holding earlier results, without --overwrite)."""
    if args.out is None:
        return {n: fresh_dir(Path(DEFAULT_ROOT), n, args.device) for n in names}
    out = Path(args.out)
    clash = [p for n in names for p in output_paths(n, out)]
    if clash and not args.overwrite:
        shown = ", ".join(p.name for p in clash[:4]) + (", ..." if len(clash) > 4 else "")
        return (f"{out} already holds results ({shown}), perhaps committed ones: not overwriting them. "
                "Pass --overwrite to replace them, or leave out --out to write to a fresh directory "
                f"under {DEFAULT_ROOT}/.")
    return {n: out for n in names}


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(suite_names()))
        return 0
    names = [ALIASES.get(n, n) for n in args.suites] or suite_names()
    unknown = [n for n in names if n not in suite_names()]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(suite_names())}", file=sys.stderr)
        return 2
    dirs = _out_dirs(args, names)
    if isinstance(dirs, str):
        print(dirs, file=sys.stderr)
        return 2
    providers = tuple(p for p in args.providers.split(",") if p) if args.providers else None
    options = {"device": args.device, "providers": providers, "quick": args.quick}
    failed_ours = []
    bar, update, reset = _progress_bar()
    with bar:
        outputs = []
        for name in names:
            reset()
            try:
                outputs.append(run_suite(name, dirs[name], plots=not args.no_plots, progress=update, **options))
            except ValueError as exc:  # a bad provider or op name
                bar.stop()
                print(f"{name}: {exc}", file=sys.stderr)
                return 2
            if outputs[-1].results.partial:
                break  # interrupted (Ctrl-C, a time limit): its rows are written; start no other suite
    for out in outputs:
        r = out.results
        counts: dict[str, int] = {}
        for row in r.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        smoke = " [smoke run: not speed data]" if r.smoke else ""
        partial = " [PARTIAL: interrupted]" if r.partial else ""
        print(f"{r.name}: {len(r.rows)} rows on {r.device} ({summary}){smoke}{partial}")
        for f in out.files:
            print(f"  wrote {f}")
        failed_ours += [row for row in r.rows if row.provider == "ours" and row.status == "failed"]
    if failed_ours and args.strict:
        for row in failed_ours:
            print(f"FAILED ours {row.op} {row.shape} {row.pass_name}: {row.note}", file=sys.stderr)
        return 1
    # interrupted: what ran is written, but the run is not complete (130: the shell's code for SIGINT)
    return 130 if any(o.results.partial for o in outputs) else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="run benchmark suites (correctness-gated) and write JSON, markdown and plots",
        description="Run benchmark suites. Each provider is checked against the reference first; "
        "ceilings (copy bandwidth, matmul rate) are measured in the same run.",
    )
    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help=f"suites to run (default: all: {', '.join(suite_names())})")
    p.add_argument("--out", default=None,
                   help=f"output directory (default: a fresh {DEFAULT_ROOT}/<suite>-<device>-<timestamp>/)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a suite's results already in --out (e.g. the committed benchmarks/results)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--providers", default=None, help="comma-separated subset, e.g. ours,eager")
    p.add_argument("--quick", action="store_true",
                   help="one small shape per op, short timing: a smoke test, labelled as such in the results")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG charts")
    p.add_argument("--strict", action="store_true", help="exit 1 when one of our kernels fails its correctness gate")
    p.add_argument("--list", action="store_true", help="list the suites and exit")
    p.set_defaults(func=run)
