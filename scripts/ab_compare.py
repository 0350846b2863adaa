"""The table of scripts/ab_suites.sh: for each suite's rows measured in both trees (the same op, shape,
dtype, pass and provider), the median over rounds of each tree's median ms, and new over old.

usage: python scripts/ab_compare.py AB_DIR        (AB_DIR/<old|new>/r<round>/<suite>.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def rows_of(path: Path) -> list[dict]:
    """The measured rows of one results file (a BenchmarkResults JSON)."""
    data = json.loads(path.read_text())
    return [r for r in data.get("rows", []) if r.get("status") == "ok" and r.get("median_ms")]


def table(ab: Path) -> str:
    """Markdown: suite, row key, old and new medians (ms, median over rounds), new / old."""
    times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for result in sorted(ab.glob("*/r*/*.json")):
        tree, suite = result.parts[-3], result.stem
        for r in rows_of(result):
            key = (suite, r["op"], "x".join(map(str, r["shape"])), r["dtype"], r["pass"], r["provider"])
            times[key][tree].append(r["median_ms"])
    lines = ["| suite | op | shape | dtype | pass | provider | old ms | new ms | new / old | rounds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ratios = []
    for key, by_tree in sorted(times.items()):
        if not (by_tree.get("old") and by_tree.get("new")):
            continue
        o, n = statistics.median(by_tree["old"]), statistics.median(by_tree["new"])
        ratios.append(n / o)
        lines.append("| " + " | ".join(key) + f" | {o:.4g} | {n:.4g} | {n / o:.3f} | "
                     f"{len(by_tree['old'])}/{len(by_tree['new'])} |")
    if ratios:
        lines += ["", f"{len(ratios)} rows; new / old: median {statistics.median(ratios):.3f}, "
                  f"range {min(ratios):.3f}-{max(ratios):.3f}"]
    else:
        lines += ["", "no row was measured in both trees"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
