"""What shipping the built-in Llama 8-layer/2048 (bf16, CUDA) costs: checkpoint files, the AOTInductor
package against torch.compile and eager, and quantized checkpoints.

    python benchmarks/bench_deploy.py --out benchmarks/results                 # H100: deploy.{json,md}, <= --budget-s
    python benchmarks/bench_deploy.py --quick --device cpu --out /tmp/deploy   # llama-tiny, fp32: checks the pipeline
    python benchmarks/bench_deploy.py --quick --sections files,quant           # without the AOTI build (~20 s less)

Sections (`--sections`, run in the order given; default files,aoti,compile,quant):
  files    `kernel_pytorch.save` (safetensors + manifest) of the optimize()d model against
           `torch.save(state_dict)`: size on disk, save time, load time (`kernel_pytorch.load` into a fresh
           model against `torch.load(weights_only=True)` + `load_state_dict`), median of `--reps`.
  aoti     forward latency under torch.no_grad at each `--shapes` entry of the optimized model in eager and
           of its AOTInductor package (`deploy.aoti_package`: export, build and load times, file size; its
           output checked against eager with the tolerance table before it is timed).
  compile  the same forwards through `torch.compile(model, dynamic=False)` (the first call timed as the
           compile). Forward rows: the timer's CUDA-event loop and CUDA-graph replay, peak memory per call.
  quant    int8 and fp8 weight-only checkpoints (`deploy.quantize`, then kernel_pytorch.save/load): size and
           save/load time beside bf16; "torchao not installed" without torchao. Decode speed is not here.

The run keeps to `--budget-s` of wall time counted from the script's start: a section or step that would
start after it, or an AOTI build or torch.compile that would start with less than its expected time
left, is recorded as "skipped: budget". Results are written after every row, so an interrupted run (Ctrl-C,
`timeout -s INT`) keeps what finished, marked PARTIAL (exit code 130). A section that fails records its
error and the next one runs (exit code 1).
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # the budget counts the imports too

import argparse  # noqa: E402
import copy  # noqa: E402
import importlib.metadata  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import kernel_pytorch  # noqa: E402
from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.benchmark.results import BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.sections import SectionRunner  # noqa: E402
from kernel_pytorch.benchmark.timer import free_device_memory, resolve_device  # noqa: E402
from kernel_pytorch.deploy import measure  # noqa: E402
from kernel_pytorch.models import build_model, example_inputs  # noqa: E402

SECTIONS = ("files", "aoti", "compile", "quant")
SCHEMES = ("int8", "fp8")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@dataclass
class Run:
    """The run's settings, its section runner (results written after every row, the budget) and the
    optimized model."""

    preset: str
    device: torch.device
    dtype: torch.dtype
    quick: bool
    reps: int
    shapes: list[tuple[int, int]]
    aoti_min_s: float
    compile_min_s: float
    scratch: Path
    runner: SectionRunner
    inputs: list[tuple[str, list[int], torch.Tensor]] = field(default_factory=list)
    _optimized: tuple[torch.nn.Module, Any] | None = None
    _reference: torch.nn.Module | None = None

    @property
    def config(self) -> str:
        """The preset and its parameter count, once the model is built."""
        if self._optimized is None:
            return self.preset
        n = sum(p.numel() for p in self._optimized[0].parameters())
        return f"{self.preset} ({n / 1e9:.2f}B params)" if n >= 1e8 else f"{self.preset} ({n / 1e6:.2f}M params)"

    @property
    def dt(self) -> str:
        return str(self.dtype).split(".")[-1]

    @property
    def cpu_time_s(self) -> float:
        """CPU timing: seconds blocked_autorange measures for."""
        return 0.05 if self.quick else 0.2

    @property
    def results(self) -> BenchmarkResults:
        return self.runner.results

    def left(self) -> float:
        return self.runner.left()

    def add(self, row: Row) -> Row:
        return self.runner.add(row)

    def row(self, op: str, provider: str, pass_name: str, shape: list[int] | None = None, **kw: Any) -> Row:
        return Row(op=op, shape=shape or [], config=self.config, dtype=kw.pop("dtype", self.dt), provider=provider,
                   pass_name=pass_name, **kw)

    def skip(self, op: str, provider: str, pass_name: str, need: str = "", shape: list[int] | None = None) -> None:
        self.runner.skip(self.row(op, provider, pass_name, shape), need)

    def fresh(self) -> torch.nn.Module:
        """The original architecture, built on the device in the dtype (what a load starts from)."""
        return build_model(self.preset, self.device, self.dtype)[0].eval()

    def optimized(self) -> tuple[torch.nn.Module, Any]:
        """(model, report): the preset optimize()d once (swaps, validated on one short batch; no compile
        steps: the aoti section compiles the whole model itself)."""
        if self._optimized is None:
            from kernel_pytorch.optimize import optimize

            model = self.fresh()
            ids = example_inputs(self.preset, self.device, batch_size=1, seq_len=min(128, self.shapes[0][1]))
            (model, report), took = measure.timed(lambda: optimize(model, ids, compile=False, seeds=(0,)), self.device)
            if not report.passed:
                raise RuntimeError(f"optimize() did not validate: {report.summary(validation=False)}")
            self.results.notes.append(f"model: {self.preset} optimize()d in {took:.1f} s "
                                      f"({len(report.applied())} swaps kept, no compile steps), eval mode")
            self._optimized = (model.eval(), report)
        return self._optimized

    def reference(self) -> torch.nn.Module:
        """The optimized model in higher precision (a copy, built once: fp32 for a bf16/fp16 model, fp64 for
        an fp32 one): the reference compiled forwards are judged against, with eager's own error as the
        yardstick (`_check`)."""
        if self._reference is None:
            import copy

            wide = torch.float64 if self.dtype == torch.float32 else torch.float32
            self._reference = copy.deepcopy(self.optimized()[0]).to(wide)
        return self._reference


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**28 else f"{n / 2**20:.3g} MiB"


def checkpoint_rows(run: Run, t: measure.CheckpointTiming, provider: str, dtype: str,
                    extra: dict[str, str] | None = None) -> None:
    """Two rows (save, load) of one measured checkpoint format; bytes = the files' size, GB/s over it."""
    for pass_name, timing in (("save", t.save), ("load", t.load)):
        row = run.row(f"checkpoint {pass_name}", provider, pass_name, dtype=dtype)
        row.set_timing(timing)
        row.bytes, row.gbps = t.bytes, t.bytes / 1e9 / (timing.median_ms / 1e3)
        row.note = f"{_gib(t.bytes)} in {t.files} file(s), {row.gbps:.3g} GB/s"
        if pass_name == "load":
            row.note += "; loaded == saved: " + {True: "yes", False: "NO", None: "not checked"}[t.equal]
            if t.equal is False:
                run.runner.errors.append(f"{provider}: the loaded weights differ from the saved ones")
        row.note += (extra or {}).get(pass_name, "")
        run.add(row)


def section_files(run: Run) -> None:
    model, report = run.optimized()
    formats = (measure.safetensors_format(report), measure.torch_save_format(run.device))
    for fmt in formats:
        if run.left() <= 0:
            run.skip("checkpoint save", fmt.name, "save")
            continue
        t = measure.time_checkpoint(model, fmt, run.fresh, run.scratch / "files", run.reps)
        shutil.rmtree(run.scratch / "files", ignore_errors=True)
        checkpoint_rows(run, t, fmt.name, run.dt)
    run.results.notes.append(
        f"files: median of {run.reps} saves and loads each; save = the write calls without fsync; load = into a "
        f"freshly built model (not timed), until the weights are on {run.device.type}; torch.load with "
        "weights_only=True and map_location=the device. The page cache was WARM: each load read files written "
        "just before (dropping the cache needs root), so these are not cold-disk load times")


def forward_rows(run: Run, op: str, shape: list[int], provider: str, ft: measure.ForwardTiming, note: str) -> None:
    row = run.row(op, provider, "fwd (no_grad)", shape, note=note)
    row.set_timing(ft.timing)
    row.peak_mem_bytes, row.peak_mem_method = ft.memory.peak_bytes, ft.memory.method
    run.add(row)
    graph = run.row(op, provider, "fwd (cuda graph)", shape)
    if ft.graph is not None:
        graph.set_timing(ft.graph)
    else:
        graph.status, graph.note = "not available", ft.graph_error
    run.add(graph)


def _no_grad(fn: Callable[..., Any], ids: torch.Tensor) -> Callable[[], Any]:
    def call() -> Any:
        with torch.no_grad():
            return fn(ids)
    return call


def forward_inputs(run: Run) -> list[tuple[str, list[int], torch.Tensor]]:
    """(op, shape, input_ids) for each `--shapes` entry, drawn once."""
    if not run.inputs:
        run.inputs = [(f"forward {b}x{t}", [b, t], example_inputs(run.preset, run.device, batch_size=b, seq_len=t,
                                                                   seed=1)[0]) for b, t in run.shapes]
    return run.inputs


def time_provider(run: Run, provider: str, fn: Callable[..., Any], op: str, shape: list[int], ids: torch.Tensor,
                  note: str) -> None:
    call = _no_grad(fn, ids)
    call()
    forward_rows(run, op, shape, provider, measure.time_forward(call, run.device, cpu_min_run_time=run.cpu_time_s),
                 note)


def eager_rows(run: Run) -> None:
    """The optimized model in eager at every shape, once per run: the baseline the other rows are read against."""
    if any(r.provider == "eager" for r in run.results.rows):
        return
    model, _ = run.optimized()
    for op, shape, ids in forward_inputs(run):
        time_provider(run, "eager", model, op, shape, ids, "the optimized model, eager")
    run.results.notes.append(
        "forward rows: under torch.no_grad, logits (B, T, vocab) out; 'fwd (no_grad)' = the timer's CUDA-event "
        "loop on a GPU (L2 flushed, host launch cost included; each row names its method), 'fwd (cuda graph)' = "
        "CUDA-graph replay (no host cost); "
        "peak = allocator peak of one call above what was allocated before (weights not counted)")


def _check(run: Run, provider: str, runner: Callable[..., Any], op: str, shape: list[int], ids: torch.Tensor,
           whole: bool) -> str | None:
    """A compiled forward's logits against the optimized model in higher precision (`Run.reference`: fp32
    for a bf16 model), allowed `tolerances.fp64_budget` (2 x the bf16 eager model's own error + a floor),
    as validate judges long reductions: a whole model compiled by Inductor rounds in other places than
    eager does, so it is held to eager's distance from the higher-precision result, not to eager's bits.
    All the logits, or (for large shapes, whose fp64 comparison on the host would take GBs) the last
    sequence's last 16 positions, which a wrongly specialised batch or sequence dim would get wrong.
    Returns the check's message for the timed row's note, or None after recording a failed row."""
    from kernel_pytorch.tolerances import fp64_budget

    model, _ = run.optimized()
    with torch.no_grad():
        got, want, hi = runner(ids), model(ids), run.reference()(ids)
    what = "logits vs the model in higher precision"
    if not whole:
        got, want, hi = got[-1:, -16:], want[-1:, -16:], hi[-1:, -16:]
        what = "last sequence's last 16 positions vs the model in higher precision"
    check = fp64_budget(got, want, hi.double())
    if check.passed:
        return check.message(what)
    run.runner.errors.append(f"{provider} {op}: {check.message(what)}")
    run.add(run.row(op, provider, "fwd (no_grad)", shape, status="failed: correctness", note=check.message(what)))
    return None


def section_aoti(run: Run) -> None:
    from kernel_pytorch.deploy import aoti_package, export, load_package, try_package

    model, _ = run.optimized()
    eager_rows(run)
    forwards = forward_inputs(run)
    pkg = "AOTInductor package"
    if run.left() < run.aoti_min_s:
        run.skip(pkg, "aoti", "export+build", f"; an AOTI build needs about {run.aoti_min_s:.0f} s")
        return
    # batch 2, not 1: export specialises a dim whose example size is 1, and the package would then take
    # only batch 1
    example = example_inputs(run.preset, run.device, batch_size=2, seq_len=min(128, run.shapes[0][1]), seed=2)
    program, export_s = measure.timed(lambda: export(model, example), run.device)
    path, build_s = measure.timed(lambda: aoti_package(program, None, run.scratch / "model.pt2"), run.device)
    size = measure.dir_bytes(path)
    # a loader that crashes would end this run: a fresh process tries the package first
    fresh, fresh_s = measure.timed(lambda: try_package(path), run.device)
    for pass_name, s, note in (("export", export_s, "torch.export (dynamic dims: auto), checked against eager"),
                               ("build", build_s, f"aoti_compile_and_package; file {_gib(size)}"),
                               ("load (fresh process)", fresh_s, f"kernel_pytorch.deploy.try_package: "
                                f"{fresh.summary()} (the time includes starting Python and importing torch)")):
        ok = pass_name != "load (fresh process)" or fresh.ok
        row = run.row(pkg, "aoti", pass_name, list(example[0].shape), median_ms=s * 1e3 if ok else None, reps=1,
                      timing_method="wall clock, once", note=note, status="ok" if ok else "failed: load")
        row.bytes = size if pass_name == "build" else None
        run.add(row)
    if not fresh.ok:
        run.runner.errors.append(f"aoti: {fresh.summary()}")
        for op, shape, _ in forwards:
            run.add(run.row(op, "aoti", "fwd (no_grad)", shape, status="failed: load", note=fresh.summary()))
        return
    runner, load_s = measure.timed(lambda: load_package(path), run.device)
    run.add(run.row(pkg, "aoti", "load", list(example[0].shape), median_ms=load_s * 1e3, reps=1,
                    timing_method="wall clock, once", note="aoti_load_package, in this process"))
    for i, (op, shape, ids) in enumerate(forwards):
        if run.left() <= 0:
            run.skip(op, "aoti", "fwd (no_grad)", shape=shape)
            continue
        checked = _check(run, "aoti", runner, op, shape, ids, whole=i == 0)
        if checked is not None:
            time_provider(run, "aoti", runner, op, shape, ids, checked)
    run.results.notes.append("aoti: one package, exported with dynamic batch and sequence dims, serves every shape; "
                             "its logits are checked at each shape before it is timed, against the optimized model "
                             "in higher precision (fp32 for bf16) within 2 x the eager model's error + a floor "
                             "(tolerances.fp64_budget)")


def section_compile(run: Run) -> None:
    model, _ = run.optimized()
    eager_rows(run)
    # static shapes: each shape gets its own graph, the best a compiled model does at that shape
    compiled = torch.compile(model, dynamic=False)
    forwards = forward_inputs(run)
    try:
        for op, shape, ids in forwards:
            if run.left() < run.compile_min_s:
                run.skip(op, "torch.compile", "fwd (no_grad)", f"; a compile needs about {run.compile_min_s:.0f} s",
                         shape)
                continue
            _, first_s = measure.timed(_no_grad(compiled, ids), run.device)
            checked = _check(run, "torch.compile", compiled, op, shape, ids, whole=op == forwards[0][0])
            if checked is None:
                continue
            note = f"torch.compile(model, dynamic=False), default mode; first call (compile) {first_s:.1f} s; {checked}"
            time_provider(run, "torch.compile", compiled, op, shape, ids, note)
    finally:
        torch._dynamo.reset()


def section_quant(run: Run) -> None:
    try:
        import torchao  # noqa: F401
    except ImportError:
        run.add(run.row("checkpoint save", "kernel_pytorch.save int8/fp8", "save", status="not installed",
                        note="torchao not installed"))
        return
    from kernel_pytorch.deploy import quantize

    model, report = run.optimized()
    bf16 = {r.pass_name: r for r in run.results.rows
            if r.provider == "kernel_pytorch.save" and r.op.startswith("checkpoint") and r.ok}
    for scheme in SCHEMES:
        provider = f"kernel_pytorch.save {scheme}"
        if run.left() <= 0:
            run.skip("checkpoint save", provider, "save")
            continue
        quantized = quantize(copy.deepcopy(model), scheme)
        # loads into the original architecture: load re-applies the swaps and quantizes it as saved
        t = measure.time_checkpoint(quantized, measure.safetensors_format(report, provider), run.fresh,
                                    run.scratch / scheme, run.reps)
        shutil.rmtree(run.scratch / scheme, ignore_errors=True)
        extra = {}
        if "save" in bf16 and bf16["save"].bytes:
            extra["save"] = f"; {t.bytes / bf16['save'].bytes:.2f}x the size of the {run.dt} checkpoint"
        if "load" in bf16 and bf16["load"].median_ms:
            extra["load"] = f"; {t.load.median_ms / bf16['load'].median_ms:.2f}x the {run.dt} checkpoint's load time"
        checkpoint_rows(run, t, provider, f"{scheme} weights", extra)
        del quantized
        free_device_memory(run.device)
    run.results.notes.append(
        "quant: weight-only int8/fp8 with torchao (deploy.quantize) on the optimized model, saved with "
        "kernel_pytorch.save; its load builds the original model, re-applies the swaps, quantizes it as saved "
        "and checks every quantized part on a copy before loading (all timed). Decode speed is measured elsewhere")


SECTION_FNS: dict[str, Callable[[Run], None]] = {"files": section_files, "aoti": section_aoti,
                                                 "compile": section_compile, "quant": section_quant}


def run_sections(run: Run, sections: list[str]) -> int:
    """The named sections in order (`SectionRunner.run`: budget, errors, SIGINT), the device's memory
    handed back after each; returns the exit code."""

    def section(name: str) -> Callable[[], None]:
        def go() -> None:
            try:
                SECTION_FNS[name](run)
            finally:
                free_device_memory(run.device)
        return go

    return run.runner.run([(name, section(name)) for name in sections], lambda name: run.row(name, "-", "-"))


def _shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, t = part.lower().split("x")
        out.append((int(b), int(t)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="llama-tiny, fp32, 2 repetitions: checks the pipeline")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available; --quick: cpu)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/deploy-<time>)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, in order: {SECTIONS}")
    parser.add_argument("--budget-s", type=float, default=150.0, help="wall-time budget from the script's start")
    parser.add_argument("--reps", type=int, default=None, help="saves/loads per checkpoint format (default 3; quick 2)")
    parser.add_argument("--shapes", default=None, help="BxT forward shapes (default 1x512,8x2048; quick 1x32,2x64)")
    parser.add_argument("--aoti-min-s", type=float, default=None,
                        help="start the AOTI build only with this much budget left (default 60; quick 30)")
    parser.add_argument("--compile-min-s", type=float, default=None,
                        help="start torch.compile only with this much budget left (default 30; quick 10)")
    parser.add_argument("--scratch", default=None, help="where the checkpoints are written (default: a temp dir)")
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    dev = resolve_device(args.device or ("cpu" if args.quick else None))
    preset = "llama-tiny" if args.quick else "llama-8l-2048"
    dtype = torch.bfloat16 if dev.type == "cuda" and not args.quick else torch.float32
    out = Path(args.out) if args.out else Path("bench-results") / f"deploy-{time.strftime('%Y%m%d-%H%M%S')}"
    scratch = Path(tempfile.mkdtemp(prefix="kp-deploy-", dir=args.scratch))
    results = BenchmarkResults(name="deploy", device=device_name(dev), smoke=args.quick)
    results.notes.append(f"versions: torch {torch.__version__}, triton {results.triton or 'not installed'}, "
                         f"transformers {_version('transformers')}, torchao {_version('torchao')}, "
                         f"kernel_pytorch {kernel_pytorch.__version__}")
    if args.quick:
        results.notes.append("QUICK run: llama-tiny in fp32 on the CPU, few repetitions: checks the pipeline, "
                             "not deployment numbers")
    runner = SectionRunner(results, out, args.budget_s, start=_T0)
    run = Run(preset=preset, device=dev, dtype=dtype, quick=args.quick, reps=args.reps or (2 if args.quick else 3),
              shapes=_shapes(args.shapes or ("1x32,2x64" if args.quick else "1x512,8x2048")),
              aoti_min_s=args.aoti_min_s if args.aoti_min_s is not None else
              (30.0 if args.quick else 60.0),
              compile_min_s=args.compile_min_s if args.compile_min_s is not None else (10.0 if args.quick else 30.0),
              scratch=scratch, runner=runner)
    try:
        code = run_sections(run, sections)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {out / 'deploy.json'} and {out / 'deploy.md'} (exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
