"""bench_prefill.py's files: prefill_<device>.json (the results schema, plus "versions" and a "prefill" summary
per provider) and prefill_<device>.md (the rows, then the summary: each provider against hf-compile and
against the GEMM floors measured in the same run, and whether the target holds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kernel_pytorch.benchmark.results import BenchmarkResults

BASELINE = "hf-compile"
TARGET = "ours"
# the target: ours at least as fast as BASELINE and at most this many times the GEMM floor's time
TARGET_OVER_FLOOR = 1.10


def device_tag(name: str) -> str:
    """A short file-name tag of a device name: "NVIDIA H100 80GB HBM3" -> "h100", "cpu (x86_64, 2 threads)" -> "cpu"."""
    if name.startswith("cpu"):
        return "cpu"
    for token in name.split():
        if re.fullmatch(r"[A-Za-z]+\d+[A-Za-z]*", token) and not token.isalpha():
            return token.lower()
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def write(results: BenchmarkResults, summary: list[dict], versions: dict[str, str], out: Path) -> tuple[Path, Path]:
    """Both files under `out` (created); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    d = results.to_dict()
    d["versions"] = versions
    d["prefill"] = summary
    stem = f"{results.name}_{device_tag(results.device)}"
    js = out / f"{stem}.json"
    js.write_text(json.dumps(d, indent=2) + "\n")
    md = out / f"{stem}.md"
    md.write_text(results.to_markdown(baseline=BASELINE) + "\n" + summary_markdown(summary) + "\n")
    return js, md


def _timed(summary: list[dict], provider: str, key: str = "ms") -> dict | None:
    return next((s for s in summary if s["provider"] == provider and s.get(key)), None)


def headline(summary: list[dict]) -> list[str]:
    """The target's line: ours against hf-compile and the GEMM floor, both from this run."""
    ours, base, floor = _timed(summary, TARGET), _timed(summary, BASELINE), _timed(summary, "gemm-floor")
    if ours is None:
        s = next((e for e in summary if e["provider"] == TARGET), None)
        return [f"- {TARGET}: {s['status'] if s else 'not run'}: the target is not measured"]
    parts = [f"{TARGET} {ours['ms']:.3f} ms per prefill ({ours['tokens_per_s']:,.0f} tok/s)"]
    if base:
        parts.append(f"{base['ms'] / ours['ms']:.3f}x {BASELINE} ({base['ms']:.3f} ms)")
    if floor:
        parts.append(f"{ours['ms'] / floor['ms']:.3f}x the GEMM floor ({floor['ms']:.3f} ms)")
    sdpa = _timed(summary, "gemm+sdpa-floor")
    if sdpa:
        parts.append(f"{ours['ms'] / sdpa['ms']:.3f}x GEMMs + SDPA ({sdpa['ms']:.3f} ms)")
    checked = (ours.get("check") or {}).get("passed")
    if base and floor:
        met = base["ms"] >= ours["ms"] and ours["ms"] <= TARGET_OVER_FLOOR * floor["ms"] and checked is not False
        verdict = (f"target (at least as fast as {BASELINE}, at most {TARGET_OVER_FLOOR:.2f}x the GEMM floor, logits "
                   f"checked): {'met' if met else 'NOT met'}")
    else:
        verdict = f"target not judged ({BASELINE} or the GEMM floor was not timed)"
    return [f"- {'; '.join(parts)}; {verdict}"]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def summary_markdown(summary: list[dict]) -> str:
    """The headline, then one line per provider: ms (event-timed median and CUDA-graph replay), tokens/s,
    against hf-compile and each floor, the GEMMs' TFLOP/s, peak memory and the logits check."""
    base, floor, sdpa = (_timed(summary, p) for p in (BASELINE, "gemm-floor", "gemm+sdpa-floor"))
    lines = ["## Prefill summary", "", *headline(summary), "",
             "| provider | ms | q20-q80 ms | graph ms | tok/s | vs hf-compile | % of GEMM floor | % of GEMM+SDPA "
             "floor | GEMM TFLOP/s | peak MiB | logits err | budget | check | status |", "|" + " --- |" * 14]
    for s in summary:
        ms, c = s.get("ms"), s.get("check") or {}
        cells = [s["provider"], _f(ms, ".3f"),
                 f"{s['q20_ms']:.3f}-{s['q80_ms']:.3f}" if ms else "-", _f(s.get("graph_ms"), ".3f"),
                 _f(s.get("tokens_per_s"), ",.0f"),
                 f"{base['ms'] / ms:.3f}x" if base and ms else "-",
                 f"{100 * floor['ms'] / ms:.1f}" if floor and ms else "-",
                 f"{100 * sdpa['ms'] / ms:.1f}" if sdpa and ms else "-",
                 _f(s.get("gemm_tflops"), ".1f"), _f(s.get("peak_mib"), ".0f"),
                 _f(c.get("max_abs_err"), ".3g"), _f(c.get("allowed"), ".3g"),
                 ("ok" if c["passed"] else "FAILED") if "passed" in c else "-", s["status"]]
        lines.append("| " + " | ".join(str(x).replace("|", "/") for x in cells) + " |")
    paired = [s for s in summary if s.get("paired_ms")]
    if paired:
        pb = next((s for s in paired if s["provider"] == BASELINE), None)
        lines += ["", "## Paired", "", f"Providers timed in turns in one loop ({paired[0]['paired_method']}).", "",
                  "| provider | ms | q20-q80 ms | vs hf-compile |", "|" + " --- |" * 4]
        for s in paired:
            vs = f"{pb['paired_ms'] / s['paired_ms']:.3f}x" if pb else "-"
            lines.append(f"| {s['provider']} | {s['paired_ms']:.3f} | {s['paired_q20_ms']:.3f}-"
                         f"{s['paired_q80_ms']:.3f} | {vs} |")
    return "\n".join(lines)
