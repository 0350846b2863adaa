"""The one results schema every benchmark writes: JSON on disk, a markdown table beside it.

    {
      "schema": 1, "name": "norm", "date": "...", "device": "NVIDIA H100 80GB HBM3",
      "torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3", "cuda": "13.0",
      "ceilings": {... Ceilings.to_dict() ...},
      "smoke": false,   # true for a --quick run: one small shape, short timing; not speed data
      "notes": ["..."],
      "rows": [ {"op": "rms_norm", "shape": [16384, 4096], "config": "Llama-3-8B ...", "dtype": "bfloat16",
                 "provider": "ours", "pass": "fwd", "status": "ok", "median_ms": ..., "q20_ms": ...,
                 "q80_ms": ..., "gbps": ..., "pct_of_copy": ..., "peak_mem_bytes": ..., ...}, ... ]
    }

A row is one shape x provider x pass. `status` is "ok" for a timed row; anything else ("failed:
correctness", "not installed", "not available", "error") carries no numbers, only the reason in `note`.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from kernel_pytorch._env import triton_version
from kernel_pytorch._tree import record
from kernel_pytorch.benchmark.ceilings import Ceilings, RooflinePoint, _now
from kernel_pytorch.benchmark.timer import Timing

SCHEMA_VERSION = 1
# how the note of an interrupted run begins (`BenchmarkResults.partial`)
PARTIAL_NOTE = "PARTIAL: interrupted"
OK = "ok"
SMOKE_HEADING = ("**Smoke run (--quick): one small shape, shortest timing. These numbers check that the "
                 "pipeline runs; they are not speedups.**")


@dataclass
class Row:
    """One measured (or not measurable) shape x provider x pass."""

    op: str
    shape: list[int]
    config: str  # the real model configuration this shape comes from
    dtype: str
    provider: str
    pass_name: str  # "fwd", "fwd+bwd", "fwd (cuda graph)", ... ; "pass" in JSON
    status: str = OK
    note: str = ""
    median_ms: float | None = None
    q20_ms: float | None = None
    q80_ms: float | None = None
    reps: int | None = None
    timing_method: str = ""
    bytes: int | None = None  # minimum bytes moved
    flops: int | None = None  # nominal FLOPs
    gbps: float | None = None
    tflops: float | None = None
    pct_of_copy: float | None = None  # % of the copy ceiling measured in the same run
    pct_of_matmul: float | None = None
    peak_mem_bytes: int | None = None
    peak_mem_method: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK

    def set_timing(self, t: Timing) -> None:
        self.median_ms, self.q20_ms, self.q80_ms = t.median_ms, t.q20_ms, t.q80_ms
        self.reps, self.timing_method = t.reps, t.method

    def set_roofline(self, p: RooflinePoint) -> None:
        """Achieved GB/s, TFLOP/s and % of the copy ceiling (rows leave pct_of_matmul unset)."""
        self.gbps, self.tflops, self.pct_of_copy = p.gbps, p.tflops, p.pct_of_copy

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_name")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        d = dict(d)
        d["pass_name"] = d.pop("pass")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class BenchmarkResults:
    """A whole benchmark run: environment, ceilings and rows (fields in the order the JSON lists them,
    the rows last)."""

    name: str
    device: str
    date: str = field(default_factory=_now)
    torch: str = field(default_factory=lambda: torch.__version__)
    triton: str | None = field(default_factory=triton_version)
    python: str = field(default_factory=platform.python_version)
    cuda: str | None = field(default_factory=lambda: torch.version.cuda)
    ceilings: Ceilings | None = None
    smoke: bool = False  # a smoke run (--quick): checks the pipeline, says nothing about speed
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    schema: int = SCHEMA_VERSION

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    @property
    def partial(self) -> bool:
        """The run was interrupted: its notes hold the PARTIAL_NOTE line, and rows are missing."""
        return any(n.startswith(PARTIAL_NOTE) for n in self.notes)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, **record(self)}  # schema first: readers check it before the rest

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchmarkResults:
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"results schema {d.get('schema')!r}; this version reads {SCHEMA_VERSION}")
        return cls(
            name=d["name"],
            device=d["device"],
            torch=d["torch"],
            triton=d.get("triton"),
            python=d.get("python", ""),
            cuda=d.get("cuda"),
            date=d["date"],
            ceilings=Ceilings.from_dict(d["ceilings"]) if d.get("ceilings") else None,
            rows=[Row.from_dict(r) for r in d["rows"]],
            notes=list(d.get("notes", [])),
            schema=d["schema"],
            smoke=bool(d.get("smoke", False)),  # absent from files written before the flag
        )

    def save(self, path: str | Path) -> Path:
        """Write the JSON file (parents created); returns its path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> BenchmarkResults:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def find(self, **match: Any) -> list[Row]:
        """Rows whose attributes equal all of `match` (e.g. op="rms_norm", provider="ours")."""
        return [r for r in self.rows if all(getattr(r, k) == v for k, v in match.items())]

    def speedup_vs(self, row: Row, baseline: str = "eager") -> float | None:
        """baseline median / row median for the same op, shape, dtype and pass (None if either is missing)."""
        if not row.ok or row.median_ms is None:
            return None
        for b in self.rows:
            if (b.provider == baseline and b.ok and b.op == row.op and b.shape == row.shape
                    and b.dtype == row.dtype and b.pass_name == row.pass_name and b.median_ms):
                return b.median_ms / row.median_ms
        return None

    def to_markdown(self, baseline: str = "eager") -> str:
        """The run as markdown: environment, ceilings, then one table per op."""
        out = [f"# {self.name}: {self.device}", ""]
        if self.smoke:
            out += [SMOKE_HEADING, ""]
        out.append(
            f"torch {self.torch}, triton {self.triton or 'not installed'}, python {self.python}, "
            f"CUDA {self.cuda or 'none'}; {self.date}"
        )
        out.append("")
        if self.ceilings:
            c = self.ceilings
            out.append(
                f"Ceilings ({c.source} {c.measured_at}): copy {c.copy_gbps:.0f} GB/s "
                f"({c.copy_bytes / 2**20:.0f} MiB copy, read + write), {c.matmul_dtype} matmul "
                f"{c.matmul_tflops:.1f} TFLOP/s ({'x'.join(map(str, c.matmul_shape))})."
            )
            if c.datasheet:
                out.append(
                    f"Datasheet peaks for {c.datasheet.name} (datasheet, not measured): "
                    f"{c.datasheet.memory_gbps:.0f} GB/s, {c.datasheet.bf16_tflops:.0f} bf16 TFLOP/s."
                )
            out.append("")
        for note in self.notes:
            out.append(f"- {note}")
        if self.notes:
            out.append("")
        ops = list(dict.fromkeys(r.op for r in self.rows))
        for op in ops:
            out += [f"## {op}", "", _header(baseline), _rule()]
            for r in self.rows:
                if r.op == op:
                    out.append(_line(r, self.speedup_vs(r, baseline)))
            out.append("")
        return "\n".join(out)

    def write(self, out_dir: str | Path) -> tuple[Path, Path]:
        """Write `<out_dir>/<name>.json` and `<out_dir>/<name>.md`; returns both paths."""
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        js = self.save(d / f"{self.name}.json")
        md = d / f"{self.name}.md"
        md.write_text(self.to_markdown() + "\n")
        return js, md


_COLUMNS = ("shape", "config", "pass", "provider", "median ms", "q20-q80 ms", "GB/s", "% copy",
            "peak MiB", "vs {b}", "status")


def _header(baseline: str) -> str:
    return "| " + " | ".join(c.format(b=baseline) for c in _COLUMNS) + " |"


def _rule() -> str:
    return "|" + "|".join(" --- " for _ in _COLUMNS) + "|"


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _line(r: Row, vs: float | None) -> str:
    status = r.status if not r.note else f"{r.status}: {r.note}"
    band = f"{r.q20_ms:.4g}-{r.q80_ms:.4g}" if r.q20_ms is not None and r.q80_ms is not None else "-"
    mem = r.peak_mem_bytes / 2**20 if r.peak_mem_bytes is not None else None
    cells = [
        "x".join(map(str, r.shape)),
        r.config,
        r.pass_name,
        r.provider,
        _f(r.median_ms, ".4g"),
        band,
        _f(r.gbps, ".0f"),
        _f(r.pct_of_copy, ".1f"),
        _f(mem, ".1f"),
        _f(vs, ".2f") + ("x" if vs is not None else ""),
        status.replace("|", "/").replace("\n", " "),
    ]
    return "| " + " | ".join(cells) + " |"


__all__ = ["OK", "PARTIAL_NOTE", "SCHEMA_VERSION", "SMOKE_HEADING", "BenchmarkResults", "Row"]
