"""The report's charts as self-contained images: a roofline of the profiled kernels and a kernel-time
breakdown per profiled run, read from the `kernel.summary` findings' data (any report carrying them).

Each chart is an inline SVG string generated here (no dependency, no network); with matplotlib
installed (the [bench] extra) `chart_images(..., prefer="png")` draws PNGs instead, embedded as data
URIs. Nothing here measures anything.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from typing import Any

from kernel_pytorch.assistant.findings import Report

COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def kernel_runs(report: Report) -> list[dict[str, Any]]:
    """The `kernel.summary` data of every profiled run (run, kernels, kernel_ms, ceilings, ...)."""
    return [dict(f.data) for f in report.kernel_efficiency if f.id == "kernel.summary"]


def roofline_points(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kernels with both FLOPs and bytes attributed: {run, name, intensity (FLOP/B), tflops, ms}."""
    out = []
    for run in runs:
        for k in run.get("kernels", ()):
            if k.get("intensity") and k.get("tflops"):
                out.append({"run": run["run"], "name": k["name"], "intensity": k["intensity"],
                            "tflops": k["tflops"], "ms": k["ms"]})
    return out


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(title)}" '
            'font-family="sans-serif" font-size="11">' + "".join(body) + "</svg>")


def breakdown_svg(runs: Sequence[dict[str, Any]], top: int = 8) -> str:
    """Horizontal bars: per run, its top kernels' ms per step and the rest as "other"."""
    rows: list[tuple[str, str, float, str]] = []  # (run, label, ms, color)
    for i, run in enumerate(runs):
        ks = list(run.get("kernels", ()))
        for k in ks[:top]:
            rows.append((run["run"], f"{k['name'][:48]} [{k['where']}]", float(k["ms"]), COLORS[i % len(COLORS)]))
        rest = float(run.get("kernel_ms", 0.0)) - sum(float(k["ms"]) for k in ks[:top])
        if rest > 1e-6:
            rows.append((run["run"], "other kernels", rest, "#BBBBBB"))
    if not rows:
        return _svg(420, 40, ['<text x="10" y="24">no profiled run</text>'], "kernel time")
    width, left, bar, gap = 860, 330, 14, 4
    biggest = max(ms for _, _, ms, _ in rows) or 1.0
    body, y, last = [], 10, None
    for run, label, ms, color in rows:
        if run != last:
            y += 8
            body.append(f'<text x="6" y="{y + 10}" font-weight="bold">{_esc(run)} (ms per step)</text>')
            y += 18
            last = run
        w = max(1.0, (width - left - 90) * ms / biggest)
        body.append(f'<text x="{left - 6}" y="{y + bar - 3}" text-anchor="end">{_esc(label)}</text>')
        body.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar}" fill="{color}"/>')
        body.append(f'<text x="{left + w + 4:.1f}" y="{y + bar - 3}">{ms:.3g}</text>')
        y += bar + gap
    return _svg(width, y + 10, body, "kernel time per step")


def roofline_svg(runs: Sequence[dict[str, Any]]) -> str:
    """Log-log: achieved TFLOP/s against FLOPs per byte, under the measured roofs when there are any."""
    pts = roofline_points(runs)
    ceil = next((r.get("ceilings") for r in runs if r.get("ceilings")), None)
    width, height, left, bottom, top, right = 640, 380, 60, 40, 20, 20
    if not pts:
        return _svg(420, 40, ['<text x="10" y="24">no kernel with attributable FLOPs and bytes</text>'], "roofline")
    xs = [p["intensity"] for p in pts]
    ys = [p["tflops"] for p in pts]
    if ceil:
        ys.append(ceil["matmul_tflops"])
        xs.append(ceil["matmul_tflops"] * 1e3 / ceil["copy_gbps"])  # the ridge
    x0, x1 = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)) + 1e-9)
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)) + 1e-9)
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)

    def px(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (math.log10(y) - y0) / (y1 - y0) * (height - top - bottom)

    body = [f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
            'fill="none" stroke="#888"/>']
    for e in range(x0, x1 + 1):
        body.append(f'<text x="{px(10.0**e):.1f}" y="{height - bottom + 14}" text-anchor="middle">1e{e}</text>')
    for e in range(y0, y1 + 1):
        body.append(f'<text x="{left - 4}" y="{py(10.0**e) + 4:.1f}" text-anchor="end">1e{e}</text>')
    body.append(f'<text x="{(left + width) / 2}" y="{height - 6}" text-anchor="middle">FLOPs per byte</text>')
    body.append(f'<text x="12" y="{(top + height) / 2}" transform="rotate(-90 12 {(top + height) / 2})" '
                'text-anchor="middle">achieved TFLOP/s</text>')
    if ceil:
        ridge = ceil["matmul_tflops"] * 1e3 / ceil["copy_gbps"]
        xa = 10.0**x0
        roof = ceil["matmul_tflops"]
        pts_line = [(xa, ceil["copy_gbps"] * xa / 1e3), (ridge, roof), (10.0**x1, roof)]
        path = " ".join(f"{px(x):.1f},{py(max(y, 10.0**y0)):.1f}" for x, y in pts_line)
        body.append(f'<polyline points="{path}" fill="none" stroke="#C44E52" stroke-width="2"/>')
        body.append(f'<text x="{width - right - 4}" y="{py(ceil["matmul_tflops"]) - 4:.1f}" text-anchor="end" '
                    f'fill="#C44E52">measured roofs: {ceil["copy_gbps"]:.0f} GB/s, {ceil["matmul_tflops"]:.0f} '
                    f'TFLOP/s {_esc(ceil["matmul_dtype"])}</text>')
    else:
        body.append(f'<text x="{left + 6}" y="{top + 14}" fill="#C44E52">no roofs: device ceilings are '
                    "measured on CUDA only</text>")
    run_names = list(dict.fromkeys(p["run"] for p in pts))
    for p in pts:
        color = COLORS[run_names.index(p["run"]) % len(COLORS)]
        body.append(f'<circle cx="{px(p["intensity"]):.1f}" cy="{py(p["tflops"]):.1f}" r="4" fill="{color}" '
                    f'fill-opacity="0.8"><title>{_esc(p["run"])}: {_esc(p["name"])} {p["tflops"]:.3g} TFLOP/s, '
                    f'{p["ms"]:.3g} ms</title></circle>')
    for i, name in enumerate(run_names):
        y = top + 30 + 14 * i
        body.append(f'<circle cx="{width - 150}" cy="{y - 4}" r="4" fill="{COLORS[i % len(COLORS)]}"/>')
        body.append(f'<text x="{width - 142}" y="{y}">{_esc(name)}</text>')
    return _svg(width, height, body, "roofline")


def _png_charts(runs: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The two charts drawn by matplotlib, as <img> tags with PNG data URIs (raises without it)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def img(fig: Any, alt: str) -> str:
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'

    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.add_subplot()
    pts = roofline_points(runs)
    for i, name in enumerate(dict.fromkeys(p["run"] for p in pts)):
        mine = [p for p in pts if p["run"] == name]
        ax.scatter([p["intensity"] for p in mine], [p["tflops"] for p in mine], color=COLORS[i % 8], label=name)
    ceil = next((r.get("ceilings") for r in runs if r.get("ceilings")), None)
    if ceil and pts:
        ridge = ceil["matmul_tflops"] * 1e3 / ceil["copy_gbps"]
        lo = min(min(p["intensity"] for p in pts), ridge) / 2
        hi = max(max(p["intensity"] for p in pts), ridge) * 2
        ax.plot([lo, ridge, hi], [ceil["copy_gbps"] * lo / 1e3, ceil["matmul_tflops"], ceil["matmul_tflops"]],
                color="#C44E52", label="measured roofs")
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte", ylabel="achieved TFLOP/s",
           title="roofline" + ("" if ceil else " (no roofs: ceilings are measured on CUDA only)"))
    if pts:
        ax.legend(fontsize=8)
    roof = img(fig, "roofline")
    rows = [(r["run"], k) for r in runs for k in list(r.get("kernels", ()))[:8]]
    fig = Figure(figsize=(8, 0.3 * len(rows) + 1), dpi=100)
    ax = fig.add_subplot()
    names = [f"{run}: {k['name'][:40]}" for run, k in rows]
    ax.barh(range(len(rows)), [k["ms"] for _, k in rows],
            color=[COLORS[[r["run"] for r in runs].index(run) % 8] for run, _ in rows])
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="ms per step", title="kernel time per step")
    return {"roofline": roof, "breakdown": img(fig, "kernel time per step")}


def chart_images(report: Report, prefer: str = "auto") -> dict[str, str]:
    """{"roofline": html, "breakdown": html}: inline SVG, or PNG <img> tags when `prefer` is "png" or
    "auto" and matplotlib is installed. Empty when the report has no profiled run."""
    runs = kernel_runs(report)
    if not runs:
        return {}
    if prefer in ("auto", "png"):
        try:
            return _png_charts(runs)
        except Exception:  # matplotlib missing (an optional extra) or failing: the SVG needs nothing
            if prefer == "png":
                raise
    return {"roofline": roofline_svg(runs), "breakdown": breakdown_svg(runs)}


__all__ = ["breakdown_svg", "chart_images", "kernel_runs", "roofline_points", "roofline_svg"]
