"""The profiled runs' Chrome traces: each run writes its own into a scratch folder, and `write_trace`
merges them into the one file asked for (`AnalysisOptions.chrome_trace`), the runs side by side."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from kernel_pytorch._errors import short_error
from kernel_pytorch.assistant.kernels.profiler import ProfiledRun
from kernel_pytorch.assistant.options import AnalysisOptions


class Traced(Protocol):
    """What the traces read from (and leave on) the analysis context."""

    options: AnalysisOptions
    trace_scratch: str | None  # per-run Chrome traces before they are merged


def scratch_dir(ctx: Traced) -> str | None:
    """A scratch folder for the per-run traces when a Chrome trace was asked for (merged at the end)."""
    if not ctx.options.chrome_trace:
        return None
    if ctx.trace_scratch is None:
        ctx.trace_scratch = tempfile.mkdtemp(prefix="kp_trace_")
    return ctx.trace_scratch


def write_trace(ctx: Traced, runs: Mapping[str, ProfiledRun], errors: dict[str, str]) -> str | None:
    """Every profiled run's Chrome trace in one file (`options.chrome_trace`), one process per run; the
    scratch folder removed. Returns the path written (None: none asked for, or writing failed, said in
    `errors["trace"]`)."""
    path = ctx.options.chrome_trace
    parts = [(key, run.trace) for key, run in runs.items() if run.trace]
    if not path:
        return None
    try:
        merged = merge_traces([(key, json.loads(Path(t).read_text())) for key, t in parts])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(merged, f)
    except (OSError, ValueError) as exc:
        errors["trace"] = short_error(exc)
        path = None
    finally:
        if ctx.trace_scratch is not None:
            shutil.rmtree(ctx.trace_scratch, ignore_errors=True)
            ctx.trace_scratch = None
    return path


def merge_traces(traces: list[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Several Chrome traces as one: each run's processes renamed "<run>: <process>" and given ids of
    their own, and the runs laid one after another in time (a 1 ms gap), so Perfetto or
    chrome://tracing shows them side by side.

    Args:
        traces: (run name, the trace as torch.profiler exports it: {"traceEvents": [...], ...}).
    """
    events: list[dict[str, Any]] = []
    offset = 0.0
    for i, (name, trace) in enumerate(traces):
        evs = [dict(e) for e in trace.get("traceEvents", []) if isinstance(e, dict)]
        times = [float(e["ts"]) for e in evs if isinstance(e.get("ts"), (int, float))]
        start = min(times) if times else 0.0
        end = max((float(e["ts"]) + float(e.get("dur", 0) or 0) for e in evs if isinstance(e.get("ts"), (int, float))),
                  default=start)
        shift = offset - start
        pids: dict[Any, int] = {}
        for e in evs:
            pid = e.get("pid", 0)
            pids.setdefault(pid, (i + 1) * 1_000_000 + len(pids))
            e["pid"] = pids[pid]
            if isinstance(e.get("ts"), (int, float)):
                e["ts"] = float(e["ts"]) + shift
            if e.get("ph") in ("s", "f", "t") and "id" in e:  # flow arrows: ids of their own per run
                e["id"] = f"{i}:{e['id']}"
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": f"{name}: {(e.get('args') or {}).get('name', '')}".rstrip(": ")}
        named = {e["pid"] for e in evs if e.get("ph") == "M" and e.get("name") == "process_name"}
        for old, new in pids.items():
            if new not in named:
                evs.append({"ph": "M", "name": "process_name", "pid": new, "args": {"name": f"{name}: {old}"}})
            evs.append({"ph": "M", "name": "process_sort_index", "pid": new, "args": {"sort_index": new}})
        events.extend(evs)
        offset += (end - start) + 1000.0
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"runs": [name for name, _ in traces], "producer": "kernel-pytorch analyze"}}


__all__ = ["merge_traces", "scratch_dir", "write_trace"]
