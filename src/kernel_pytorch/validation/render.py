"""`ValidationResult.summary()`: the result as terminal text, one block per part, failures named with
their error, index and values. Reads the parts' records (`parts.py`); computes nothing."""

from __future__ import annotations

from kernel_pytorch.benchmark.timer import Timing
from kernel_pytorch.validation.parts import (
    CompilationReport,
    CorrectnessReport,
    DeterminismReport,
    MemoryReport,
    PerformanceReport,
)

# How many failing tensors a text summary lists before saying "and N more".
_MAX_LISTED_FAILURES = 12


def _ms(t: Timing | None) -> str:
    return "-" if t is None else f"{t.median_ms:.4g} ms [{t.q20_ms:.4g}-{t.q80_ms:.4g}]"


def _mib(b: int | None) -> str:
    if b is None:
        return "-"
    return f"{b / 2**20:.2f} MiB" if abs(b) >= 2**20 else f"{b / 2**10:.1f} KiB"


def _correctness(c: CorrectnessReport) -> list[str]:
    n_leaves = len(next(iter(c.checks.values()))) if c.checks else 0
    lines = [
        f"correctness_check: {'PASS' if c.passed else 'FAIL'} "
        f"({len(c.checks)}/{len(c.seeds)} seeds, {n_leaves} tensors each; gradients: {c.gradients}; "
        f"fp64 budget reference: {c.reference})"
    ]
    lines += [f"  error: {e}" for e in c.errors]
    rows = c.worst_by_name()
    width = max((len(n) for n, _, _ in rows), default=0)
    for name, chk, ok in rows:
        if chk.method in ("structure", "value"):
            lines.append(f"  {name:<{width}}  {'ok' if ok else 'FAIL'}  {chk.note}")
            continue
        lines.append(
            f"  {name:<{width}}  {'ok  ' if ok else 'FAIL'}  max abs {chk.max_abs_err:.3g}  "
            f"max rel {chk.max_rel_err:.3g}  [{chk.method}]"
        )
    fails = c.failures()
    for seed, chk in fails[:_MAX_LISTED_FAILURES]:
        lines.append(f"  seed {seed}: {chk.message()}")
    if len(fails) > _MAX_LISTED_FAILURES:
        lines.append(f"  ... and {len(fails) - _MAX_LISTED_FAILURES} more failures")
    lines += [f"  note: {n}" for n in c.notes]
    return lines


def _performance(p: PerformanceReport | None) -> list[str]:
    if p is None:
        return ["performance_improvement: skipped"]
    method = next((pc.original.method for pc in p.passes.values() if pc.original), "")
    lines = [f"performance_improvement: on {p.device} ({method}; median [q20-q80])"]
    for pc in p.passes.values():
        if pc.error or pc.speedup is None:
            lines.append(f"  {pc.pass_name:<8} error: {pc.error or 'no timing'}")
            continue
        lines.append(
            f"  {pc.pass_name:<8} original {_ms(pc.original)}  optimized {_ms(pc.optimized)}  "
            f"speedup {pc.speedup:.2f}x [{pc.speedup_low:.2f}-{pc.speedup_high:.2f}]"
        )
    return lines


def _memory(m: MemoryReport | None) -> list[str]:
    if m is None:
        return ["memory_efficiency: skipped"]
    lines = [f"memory_efficiency: ({m.method})"]
    for pm in m.passes.values():
        ratio = f"{pm.ratio:.2f}x" if pm.ratio is not None else "-"
        lines.append(f"  {pm.pass_name:<8} original {_mib(pm.original_bytes)}  optimized "
                     f"{_mib(pm.optimized_bytes)}  ratio {ratio}")
    return lines


def _compilation(comp: CompilationReport | None) -> list[str]:
    if comp is None:
        return ["compilation_success: skipped"]
    if comp.success:
        match = {True: "compiled results match eager", False: "compiled results DIFFER from eager",
                 None: ""}[comp.matches_eager]
        lines = [
            f"compilation_success: yes (fullgraph=True, backend {comp.backend}): {comp.graph_count} graph, "
            f"{comp.graph_break_count} graph breaks, first call {comp.compile_time_s:.2f} s; {match}"
        ]
        if comp.mismatch:
            lines.append(f"  {comp.mismatch}")
        return lines
    lines = [
        f"compilation_success: no (fullgraph=True, backend {comp.backend}): "
        f"{comp.graph_count if comp.graph_count is not None else '?'} graphs, "
        f"{comp.graph_break_count if comp.graph_break_count is not None else '?'} graph breaks"
    ]
    lines += [f"  {line}" for line in (comp.error or "").splitlines()[:4]]
    locations = comp.break_locations or [None] * len(comp.break_reasons)
    lines += [f"  break: {reason}" + (f" (at {loc})" if loc else "")
              for reason, loc in list(zip(comp.break_reasons, locations))[:5]]
    return lines


def _determinism(d: DeterminismReport | None) -> list[str]:
    if d is None:
        return ["determinism: skipped"]
    if d.deterministic:
        return [f"determinism: bitwise identical over 2 runs ({d.tensors_checked} tensors)"]
    lines = [f"determinism: NOT bitwise reproducible ({len(d.differing)} of {d.tensors_checked} differ)"]
    return lines + [f"  {x}" for x in d.differing[:5]]


def render(correctness: CorrectnessReport, performance: PerformanceReport | None, memory: MemoryReport | None,
           compilation: CompilationReport | None, determinism: DeterminismReport | None) -> list[str]:
    """The lines of `ValidationResult.summary()`: correctness, performance, memory, compilation, determinism."""
    return (_correctness(correctness) + _performance(performance) + _memory(memory) + _compilation(compilation)
            + _determinism(determinism))


__all__ = ["render"]
