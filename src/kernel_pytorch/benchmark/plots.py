"""PNG charts of benchmark results (matplotlib's Agg canvas; pyplot and its global state are not used).

* `plot_bars`: per op, one panel per pass, shapes grouped, one bar per provider: achieved GB/s with
  the q20..q80 band as error bars and the measured copy ceiling as a line (median ms when the rows
  carry no byte counts).
* `plot_roofline`: achieved TFLOP/s against arithmetic intensity under the measured roofs.
* `plot_before_after`: two or more timings side by side with error bars (e.g. original vs optimized).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernel_pytorch.benchmark.ceilings import gbps, tflops
from kernel_pytorch.benchmark.results import BenchmarkResults, Row
from kernel_pytorch.benchmark.timer import Timing


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # matplotlib is the [bench] extra
        raise ImportError("plots need matplotlib: pip install 'kernel-pytorch[bench]'") from exc
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, format="png")
    return p


def _title(results: BenchmarkResults, what: str) -> str:
    return f"{what}: {results.device}" + (" (smoke run: not speed data)" if results.smoke else "")


def _shape_label(r: Row) -> str:
    return "x".join(map(str, r.shape))


def plot_bars(results: BenchmarkResults, path: str | Path, *, op: str) -> Path:
    """Grouped bars for one op: panels = passes, groups = shapes, bars = providers.

    Args:
        results: a benchmark run.
        path: PNG to write.
        op: which op's rows to draw.
    Returns:
        The written path.
    """
    rows = [r for r in results.rows if r.op == op and r.ok and r.median_ms]
    passes = list(dict.fromkeys(r.pass_name for r in rows)) or ["(no rows)"]
    use_gbps = bool(rows) and all(r.gbps for r in rows)
    fig = _figure(max(6.0, 4.2 * len(passes)), 4.2)
    for k, pass_name in enumerate(passes):
        ax = fig.add_subplot(1, len(passes), k + 1)
        prow = [r for r in rows if r.pass_name == pass_name]
        shapes = list(dict.fromkeys(_shape_label(r) for r in prow))
        providers = list(dict.fromkeys(r.provider for r in prow))
        width = 0.8 / max(1, len(providers))
        for j, prov in enumerate(providers):
            xs, ys, lo, hi = [], [], [], []
            for i, s in enumerate(shapes):
                match = [r for r in prow if r.provider == prov and _shape_label(r) == s]
                if not match:
                    continue
                r = match[0]
                xs.append(i + (j - (len(providers) - 1) / 2) * width)
                if use_gbps and r.bytes:
                    y = r.gbps or 0.0
                    # slower times (q80) mean lower bandwidth: the band flips
                    y_lo = gbps(r.bytes, r.q80_ms) if r.q80_ms else y
                    y_hi = gbps(r.bytes, r.q20_ms) if r.q20_ms else y
                else:
                    y = r.median_ms or 0.0
                    y_lo, y_hi = r.q20_ms or y, r.q80_ms or y
                ys.append(y)
                lo.append(max(0.0, y - y_lo))
                hi.append(max(0.0, y_hi - y))
            ax.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=prov)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=20, fontsize=8)
        ax.set_title(f"{op} {pass_name}", fontsize=10)
        if use_gbps:
            ax.set_ylabel("GB/s (higher is better)")
            if results.ceilings:
                ax.axhline(results.ceilings.copy_gbps, color="black", linestyle="--", linewidth=1,
                           label="measured copy")
        else:
            ax.set_ylabel("median ms (lower is better)")
        ax.legend(fontsize=7)
    fig.suptitle(_title(results, results.name), fontsize=10)
    return _save(fig, path)


def plot_roofline(results: BenchmarkResults, path: str | Path) -> Path:
    """Log-log roofline: rows with both bytes and FLOPs as points under the measured roofs.

    Returns:
        The written path (an empty chart with a note when no row has both counts).
    """
    fig = _figure(6.5, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    pts = [r for r in results.rows if r.ok and r.bytes and r.flops and r.median_ms]
    c = results.ceilings
    if c is not None:
        lo = min([c.ridge / 1000] + [r.flops / r.bytes for r in pts])
        hi = max([c.ridge * 100] + [r.flops / r.bytes for r in pts])
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ys = [min(c.copy_gbps * 1e9 * x / 1e12, c.matmul_tflops) for x in xs]
        ax.plot(xs, ys, color="black", linewidth=1.5, label="measured roofs (copy, matmul)")
    markers = "osD^v<>ph*"
    providers = list(dict.fromkeys(r.provider for r in pts))
    for j, prov in enumerate(providers):
        mine = [r for r in pts if r.provider == prov]
        ax.scatter([r.flops / r.bytes for r in mine],
                   [tflops(r.flops, r.median_ms) for r in mine],
                   marker=markers[j % len(markers)], label=prov)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / minimum byte)")
    ax.set_ylabel("TFLOP/s (nominal FLOPs)")
    if not pts:
        ax.text(0.5, 0.5, "no rows with both byte and FLOP counts", transform=ax.transAxes, ha="center")
    ax.set_title(_title(results, f"{results.name} roofline"), fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_before_after(
    labels: Sequence[str], timings: Sequence[Timing], path: str | Path, *, title: str = ""
) -> Path:
    """Bars of median ms with q20..q80 error bars, one per timing (e.g. ["original", "optimized"])."""
    if len(labels) != len(timings):
        raise ValueError("one label per timing")
    fig = _figure(max(4.0, 1.4 * len(labels) + 2), 4.0)
    ax = fig.add_subplot(1, 1, 1)
    ys = [t.median_ms for t in timings]
    err = [[t.median_ms - t.q20_ms for t in timings], [t.q80_ms - t.median_ms for t in timings]]
    ax.bar(range(len(labels)), ys, yerr=err, capsize=4, color=[f"C{i}" for i in range(len(labels))])
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_ylabel("median ms (q20-q80 bars)")
    if title:
        ax.set_title(title, fontsize=10)
    return _save(fig, path)


def write_plots(results: BenchmarkResults, out_dir: str | Path) -> list[Path]:
    """`<name>_<op>.png` per op and `<name>_roofline.png`; returns the paths written."""
    d = Path(out_dir)
    paths = [plot_bars(results, d / f"{results.name}_{op}.png", op=op)
             for op in dict.fromkeys(r.op for r in results.rows)]
    paths.append(plot_roofline(results, d / f"{results.name}_roofline.png"))
    return paths


__all__ = ["plot_bars", "plot_before_after", "plot_roofline", "write_plots"]
