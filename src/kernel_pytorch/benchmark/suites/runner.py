"""The one runner: gate, then time, every provider of every op benchmark of a suite.

For each op (`spec.OpBench`), shape and provider (`providers.py`): the correctness gate (`gate.py`;
a provider that fails is reported as failed and not timed), then the passes

    "fwd"       under no_grad;
    "fwd+bwd"   torch.autograd.grad of every output with a fixed random upstream gradient;

(an op's `passes`: "fwd" alone for a decoding step) each timed with `time_fn` (L2 flushed between calls)
and, on CUDA, replayed from a CUDA graph over rotated input copies (launch overhead removed, each call
reading cold data); with the peak memory of one call and GB/s and TFLOP/s as % of the copy and matmul
ceilings measured in the same run.

Large shapes: an op may gate at a smaller shape (`OpBench.gate_shape`; its rows say so) where the fp64
reference of the full shape would not fit or would take minutes; the graph replays of a slow call are
fewer (`graph_timer.graph_plan`). On CUDA every pass's input copies, closures and graph, and every provider's
gate outputs (eager's, the others' yardstick, excepted) are released before the next one starts, and
the allocator's cache is emptied (`timer.free_device_memory`; Python's cycles are collected after a
failure and between shapes): a row's leftovers must not make a later row run out of memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kernel_pytorch._env import recompile_headroom
from kernel_pytorch._errors import short_error
from kernel_pytorch.benchmark.ceilings import Ceilings, device_name, measure_ceilings, roofline
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph
from kernel_pytorch.benchmark.memory import peak_memory
from kernel_pytorch.benchmark.module import pass_closure
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row
from kernel_pytorch.benchmark.suites.gate import GateResult, gate
from kernel_pytorch.benchmark.suites.providers import SAME, Impl, bind, resolve
from kernel_pytorch.benchmark.suites.spec import OpBench, Shape, Suite
from kernel_pytorch.benchmark.timer import free_device_memory, resolve_device, rotation_copies, time_fn
from kernel_pytorch.validation.compare import failures

Progress = Callable[[int, int, str], None]  # (done, total, what is running)

UPSTREAM_SEED = 99  # the timed fwd+bwd's fixed upstream gradient
GRAPH_NOTE = "launch overhead removed; inputs rotated so each call reads cold data"
GATED_SMALLER = "the full shape's fp64 reference is over the gate's budget"
FLOOR_NOTE = "a floor, not the op: timed without the correctness gate"
SMOKE_NOTE = ("smoke run (--quick): one small shape per op, shortest timing; it checks that the pipeline "
              "runs, the numbers are not speedups")


def shapes_for(spec: OpBench, device: torch.device, quick: bool) -> tuple[Shape, ...]:
    """The spec's default shapes on this device (its quick shape with `quick`)."""
    key = "cuda" if device.type == "cuda" else "cpu"
    if quick:
        return (spec.quick_shapes[key],)
    return spec.cuda_shapes if key == "cuda" else spec.cpu_shapes


def run(
    suite: Suite,
    *,
    device: torch.device | str | None = None,
    providers: tuple[str, ...] | None = None,
    ops: tuple[str, ...] | None = None,
    shapes: tuple[Shape, ...] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    quick: bool = False,
    ceilings: Ceilings | None = None,
    progress: Progress | None = None,
) -> BenchmarkResults:
    """Run a suite and return its results (the caller writes them).

    Args:
        suite: the op benchmarks to run.
        device: CUDA device or "cpu" (default: current CUDA device, else CPU).
        providers: subset of `suite.providers`. Default: all on CUDA; on CPU all but "compile",
            whose compile time would dominate a small CPU run (ask for it explicitly).
        ops: subset of `suite.ops`, run in the order given (default: all).
        shapes: override every op's shape list (default: its CUDA or CPU shapes).
        dtype: input dtype (bf16 by default).
        quick: smoke-test mode: each op's quick shape, shortest CPU timing; results marked as smoke.
        ceilings: use these instead of measuring them in this run.
        progress: called as progress(done, total, description) before each step.
    Raises:
        ValueError: an unknown provider or op.
    """
    dev = resolve_device(device)
    on_cuda = dev.type == "cuda"
    known = suite.providers
    default = known if on_cuda else tuple(p for p in known if p != "compile")
    chosen = tuple(providers) if providers else default
    for p in chosen:
        if p not in known:
            raise ValueError(f"unknown provider {p!r}; known: {', '.join(known)}")
    specs = [suite.spec(o) for o in (ops if ops is not None else suite.ops)]
    # eager first: its results are the budget's yardstick for the others' gates
    order = ("eager",) + tuple(p for p in chosen if p != "eager")
    plan = [(s, shapes or shapes_for(s, dev, quick)) for s in specs]
    timing = (dict(warmup_ms=25.0, rep_ms=100.0) if on_cuda
              else dict(cpu_min_run_time=0.02 if quick else 0.1))
    total = 1 + sum(len(shape_list) for _, shape_list in plan) * len(order)
    done = 0

    def step(what: str) -> None:
        nonlocal done
        if progress is not None:
            progress(done, total, what)
        done += 1

    started = time.perf_counter()
    step("measuring copy and matmul ceilings")
    ceil = ceilings or measure_ceilings(dev, force=True)
    results = BenchmarkResults(name=suite.name, device=device_name(dev), ceilings=ceil, smoke=quick)
    if quick:
        results.notes.append(SMOKE_NOTE)
    results.notes.append(
        f"dtype {str(dtype).removeprefix('torch.')}; GB/s counts minimum bytes (each input read once, each "
        "output written once, weights included); % copy is of the copy ceiling measured in this run"
    )
    ones = [s.name for s in suite.specs if s.unit_upstream]
    results.notes.append("fwd runs under no_grad; fwd+bwd uses torch.autograd.grad with a fixed upstream gradient"
                         + (f" (of ones for {', '.join(ones)}: a loss's, as loss.backward() passes; the "
                            "correctness gate draws a random one)" if ones else ""))
    if not on_cuda:
        results.notes.append("CPU run: small shapes, CPU kernels; these numbers say nothing about GPU speed")
        if "compile" not in chosen:
            results.notes.append("torch.compile not measured on CPU unless asked for (--providers ...,compile)")
    # every CUDA shape also gets CUDA-graph replay rows: the kernels' own time, without the host
    # overhead of eager dispatch and autograd (which dominates launch-bound shapes, and on a slow
    # host CPU even fwd+bwd at large shapes)
    # one compiled function per op sees every shape in both grad modes: more than Dynamo's default
    # 8 cache entries per code object, after which it would silently run eager
    try:
        _run_plan(plan, order, chosen, dev, dtype, ceil, timing, on_cuda, results, step)
    except KeyboardInterrupt:
        # a run stopped by Ctrl-C or a time limit (SIGINT) keeps the rows it finished, said so
        entries = len({(r.op, tuple(r.shape), r.provider) for r in results.rows})
        results.notes.append(f"{PARTIAL_NOTE} after {entries} (op, shape, provider) entries; the rows "
                             "missing were not measured")
    # compile times and first-call kernel builds included: how long the whole run took
    results.notes.append(f"suite wall time {time.perf_counter() - started:.0f} s")
    if progress is not None:
        progress(total, total, "done")
    return results


def _row(spec: OpBench, shape: Shape, dtype: torch.dtype, provider: str, pass_name: str, **kw: Any) -> Row:
    return Row(op=spec.name, shape=shape.sizes, config=shape.config, dtype=str(dtype).removeprefix("torch."),
               provider=provider, pass_name=pass_name, **kw)


def _run_plan(plan: list, order: tuple[str, ...], chosen: tuple[str, ...], dev: torch.device, dtype: torch.dtype,
              ceil: Ceilings, timing: dict[str, Any], on_cuda: bool, results: BenchmarkResults,
              step: Callable[[str], None]) -> None:
    """Every (op, shape, provider) of `plan` measured into `results`, in order."""
    with recompile_headroom(64):
        for spec, shape_list in plan:
            resolved = {p: resolve(spec, p, dev) for p in order}
            for shape in shape_list:
                eager_result = None
                for provider in order:
                    step(f"{spec.name} {shape.label} {provider}")
                    impl, status, note = resolved[provider]
                    # only eager's gate outputs are kept (the others' yardstick)
                    rows, gated = measure(spec, provider, impl, status, note, shape, dtype, dev, ceil,
                                          eager_result, timing, timed=provider in chosen, graph=on_cuda,
                                          keep_gate=provider == "eager")
                    if provider == "eager":
                        eager_result = gated
                    del gated
                    for r in rows:
                        results.add(r)
                eager_result = None
                if on_cuda:
                    free_device_memory(dev)


def measure(
    spec: OpBench, provider: str, impl: Impl | None, status: str, note: str, shape: Shape, dtype: torch.dtype,
    dev: torch.device, ceil: Ceilings, eager_result: GateResult | None, timing: dict[str, float],
    *, timed: bool, graph: bool, keep_gate: bool = True,
) -> tuple[list[Row], GateResult | None]:
    """Gate, then time, one provider at one shape.

    Args:
        timed: False for eager run only as the others' yardstick (gated, no rows).
        graph: also time CUDA-graph replays (the runner asks for them on every CUDA shape), and release
            each pass's memory before the next (`free_device_memory`).
        keep_gate: return the gate's outputs and gradients (False: dropped before the timing, so they
            do not sit in device memory while it runs).
    Returns:
        (rows, the provider's gate outputs and gradients, or None when it did not run or `keep_gate`
        is False); with `timed=False` (eager run only as the yardstick) no rows.
    """
    passes = spec.passes
    if status == SAME:  # the provider runs exactly another provider's code here: no rows
        return [], None
    if status != "ok" or impl is None:
        return [_row(spec, shape, dtype, provider, p, status=status, note=note) for p in passes], None
    gshape = spec.gate_shape(shape) if spec.gate_shape is not None else shape
    where = "" if gshape == shape else f"correctness gated at {gshape.label} ({GATED_SMALLER})"
    floor = any(e.name == provider and e.floor for e in spec.extras)
    if floor:  # not the op: nothing to gate
        gshape, where = shape, FLOOR_NOTE
    try:
        checks, result = ([], None) if floor else gate(spec, impl, gshape, dtype, dev, eager_result)
    except Exception as exc:
        note = short_error(exc, 300, lines=1)
        del exc
        if graph:  # the failed gate's tensors (an out-of-memory at a large shape) go now
            free_device_memory(dev)
        return [_row(spec, shape, dtype, provider, p, status="error", note=note) for p in passes], None
    bad = failures(checks)
    if bad:
        msg = "; ".join(c.message() for c in bad[:2])
        at = f" at {gshape.label}" if where else ""
        return [_row(spec, shape, dtype, provider, p, status="failed", note=f"correctness{at}: {msg}")
                for p in passes], result
    if not keep_gate:
        result = None
    if not timed:
        return [], result
    note = "; ".join(n for n in (note, where) if n)
    es = torch.empty((), dtype=dtype).element_size()
    out: list[Row] = []
    for pass_name in passes:
        first = len(out)
        row = _row(spec, shape, dtype, provider, pass_name, note=note)
        row.bytes = spec.pass_bytes(shape, es, pass_name)
        row.flops = spec.pass_flops(shape, pass_name)
        fns: list[Callable[[], Any]] = []
        try:
            # the graph replay has no L2 flush between calls: rotate input copies instead
            fns = _pass_fns(spec, impl, shape, dtype, dev, pass_name, rotation_copies(row.bytes, dev) if graph else 1)
            t_main = time_fn(fns[0], device=dev, **timing)
            row.set_timing(t_main)
            row.set_roofline(roofline(t_main.median_ms, nbytes=row.bytes, flops=row.flops, ceilings=ceil))
            mem = peak_memory(fns[0], dev)
            row.peak_mem_bytes, row.peak_mem_method = mem.peak_bytes, mem.method
            out.append(row)
            if graph:
                out.append(_graph_row(spec, shape, dtype, provider, pass_name, fns, dev, row, ceil))
        except Exception as exc:
            row.status, row.note = "error", short_error(exc, 300, lines=1)
            out.append(row)
        finally:
            fns.clear()  # the copies and their closures go before the next pass draws its own
            if graph:  # a failure's traceback may hold tensors in reference cycles: collect only then
                free_device_memory(dev, collect=not all(r.ok for r in out[first:]))
    return out, result


def _pass_fns(spec: OpBench, impl: Impl, shape: Shape, dtype: torch.dtype, dev: torch.device, pass_name: str,
              copies: int) -> list[Callable[[], Any]]:
    """One pass closure per rotated input copy (copy c drawn with seed c)."""
    fns = []
    for c in range(copies):
        bound = bind(spec, impl, spec.make_inputs(shape, dtype, dev, c), grad=pass_name != "fwd")
        fns.append(pass_closure(bound.call, bound.wrt, pass_name, seed=UPSTREAM_SEED, ones=spec.unit_upstream))
    return fns


def _graph_row(spec: OpBench, shape: Shape, dtype: torch.dtype, provider: str, pass_name: str,
               fns: list[Callable[[], Any]], dev: torch.device, base: Row, ceil: Ceilings) -> Row:
    row = _row(spec, shape, dtype, provider, f"{pass_name} (cuda graph)", bytes=base.bytes, flops=base.flops)
    try:
        # fewer calls per graph and fewer replays where one call is slow (base: its eager timing)
        t = time_cuda_graph(fns, device=dev, call_ms=base.median_ms)
    except Exception as exc:
        row.status, row.note = "error", short_error(exc, 300, lines=1)
        return row
    row.set_timing(t)
    row.set_roofline(roofline(t.median_ms, nbytes=row.bytes, flops=row.flops, ceilings=ceil))
    row.note = GRAPH_NOTE
    return row


__all__ = ["GATED_SMALLER", "GRAPH_NOTE", "SMOKE_NOTE", "Progress", "measure", "run", "shapes_for"]
