"""Charts are written as PNG files."""

from __future__ import annotations

from pathlib import Path

from kernel_pytorch.benchmark.plots import plot_before_after, write_plots
from kernel_pytorch.benchmark.timer import Timing
from tests.benchmark.test_results import _results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_result_plots_are_pngs(tmp_path: Path) -> None:
    r = _results()
    for row in r.rows:
        if row.ok:
            row.flops = 4 * 16384 * 4096
    paths = write_plots(r, tmp_path)
    assert {p.name for p in paths} == {"unit_rms_norm.png", "unit_roofline.png"}
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 1000


def test_before_after_png(tmp_path: Path) -> None:
    t = [Timing(2.0, 1.9, 2.2, 1.8, 2.5, 10, "x"), Timing(1.0, 0.95, 1.1, 0.9, 1.3, 10, "x")]
    p = plot_before_after(["original", "optimized"], t, tmp_path / "ba.png", title="t")
    assert p.read_bytes()[:8] == PNG_MAGIC
