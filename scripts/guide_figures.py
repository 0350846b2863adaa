"""The guide's figures, drawn from the committed H200 suite results (benchmarks/results/<suite>_h200.json).

    python scripts/guide_figures.py [--out docs/guide/figures]

writes
    roofline_h200.png   every op of the suites at its first (real-model) shape, forward and backward in
                        CUDA-graph replay: ours, torch.compile and eager PyTorch under the roofs measured
                        in those runs (TFLOP/s against FLOPs per minimum byte)
    pct_copy_h200.png   the memory-bound ops' share of the measured copy ceiling, same rows
    memory_timeline_<device>.png   one training step of the e2e model (HF Llama, forward, backward and
                        AdamW), the bytes allocated over the step on top of weights and optimizer state,
                        per provider, from benchmarks/results/memory_timeline_<device>.json (written by
                        benchmarks/probes/probe_e2e_memory.py --timeline; drawn when that file exists)

Each point is a row of a result file; the figure's note names the files. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SUITES = ("norm", "mlp", "rope", "cross_entropy", "attention")
PROVIDERS = {"ours": ("o", "C0"), "compile": ("s", "C1"), "eager": ("^", "C2")}
# forward only for a decode step (it has no backward); forward and backward elsewhere
PASSES = {"attention_decode": "fwd (cuda graph)"}
FWD_BWD = "fwd+bwd (cuda graph)"
# ops whose FLOPs per byte put them under the matmul roof: left out of the copy-ceiling bars
# labels that would overlap a neighbour's (points, from the marker)
LABEL_OFFSETS = {"gated_mlp": (-45, 8), "fused_linear_cross_entropy": (8, -14)}
GEMM_OPS = {"gated_mlp", "fused_linear_cross_entropy", "attention", "attention_block", "attention_documents"}


def load_rows(results: Path = RESULTS, device: str = "h200") -> tuple[list[dict], list[dict], list[str]]:
    """(rows, ceilings, file names): per op, its first shape's rows of the pass above, for our providers."""
    rows, ceilings, files = [], [], []
    for suite in SUITES:
        path = results / f"{suite}_{device}.json"
        data = json.loads(path.read_text())
        ceilings.append(data["ceilings"])
        files.append(path.name)
        first: dict[str, list[int]] = {}
        for row in data["rows"]:
            first.setdefault(row["op"], row["shape"])
            if (row["shape"] == first[row["op"]] and row["provider"] in PROVIDERS and row["status"] == "ok"
                    and row["pass"] == PASSES.get(row["op"], FWD_BWD) and row["bytes"] and row["flops"]):
                rows.append(row)
    return rows, ceilings, files


def _tflops(row: dict) -> float:
    return row["flops"] / (row["median_ms"] * 1e-3) / 1e12


def plot_roofline(rows: list[dict], ceilings: list[dict], files: Sequence[str], path: Path) -> Path:
    """TFLOP/s against FLOPs per minimum byte, under the median of the runs' measured roofs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy = statistics.median(c["copy_gbps"] for c in ceilings)
    matmul = statistics.median(c["matmul_tflops"] for c in ceilings)
    fig, ax = plt.subplots(figsize=(8.5, 5.5), dpi=110)
    xs = [10 ** (i / 50) for i in range(-100, 251)]
    ax.plot(xs, [min(copy * 1e9 * x / 1e12, matmul) for x in xs], color="black", lw=1.5,
            label=f"measured roofs: copy {copy:.0f} GB/s, bf16 matmul {matmul:.0f} TFLOP/s")
    for provider, (marker, colour) in PROVIDERS.items():
        mine = [r for r in rows if r["provider"] == provider]
        ax.scatter([r["flops"] / r["bytes"] for r in mine], [_tflops(r) for r in mine], marker=marker,
                   color=colour, label={"compile": "torch.compile", "eager": "eager PyTorch"}.get(provider, provider),
                   zorder=3, alpha=0.85)
    # the memory-bound ops crowd around 1 FLOP/byte: one label for them (the bars show each)
    crowd = [r for r in rows if r["provider"] == "ours" and 0.3 < r["flops"] / r["bytes"] < 10
             and r["op"] != "attention_decode"]
    for r in rows:
        if r["provider"] == "ours" and r not in crowd:
            ax.annotate(r["op"], (r["flops"] / r["bytes"], _tflops(r)), fontsize=7,
                        xytext=LABEL_OFFSETS.get(r["op"], (5, -10)), textcoords="offset points")
    if crowd:
        ax.annotate("norms, activations, RoPE, cross-entropy\n(pct_copy_h200.png)",
                    (min(r["flops"] / r["bytes"] for r in crowd), max(_tflops(r) for r in crowd)),
                    fontsize=7, xytext=(-40, 45), textcoords="offset points",
                    arrowprops={"arrowstyle": "->", "lw": 0.6})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (nominal FLOPs per minimum byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("kernel_pytorch on the H200: forward + backward, CUDA-graph replay (decode: forward)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.text(0.01, 0.01, "from benchmarks/results/" + ", ".join(files), fontsize=6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_pct_copy(rows: list[dict], files: Sequence[str], path: Path) -> Path:
    """Bars: the memory-bound ops' % of the copy ceiling measured in their run, per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows if r["op"] not in GEMM_OPS))
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    width = 0.27
    for j, provider in enumerate(PROVIDERS):
        pct = {r["op"]: r["pct_of_copy"] for r in rows if r["provider"] == provider}
        ax.bar([i + (j - 1) * width for i in range(len(ops))], [pct.get(op, 0.0) for op in ops], width,
               color=PROVIDERS[provider][1],
               label={"compile": "torch.compile", "eager": "eager PyTorch"}.get(provider, provider))
    ax.axhline(100, color="black", lw=0.8)
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("% of the measured copy ceiling")
    ax.set_title("Memory-bound ops on the H200 (minimum bytes / time; forward + backward, CUDA-graph replay)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "from benchmarks/results/" + ", ".join(files), fontsize=6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


TIMELINE_LABELS = {"eager": "eager HF", "torch.compile": "torch.compile",
                   "ours+compile@noreuse": "optimize() + compile", "liger": "Liger (eager)"}


def plot_memory_timeline(source: Path, path: Path) -> Path:
    """GiB allocated over one training step (ms from its first allocation), a line per provider, its peak
    marked; a provider whose recording failed is named in the note."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(source.read_text())
    fig, ax = plt.subplots(figsize=(8.5, 4.5), dpi=110)
    failed = []
    for variant, record in data["variants"].items():
        if "timeline" not in record:
            failed.append(variant)
            continue
        line = record["timeline"]
        gib = [b / 2**30 for b in line["nbytes"]]
        label = (f"{TIMELINE_LABELS.get(variant, variant)}: peak +{line['peak'] / 2**30:.1f} GiB, "
                 f"step {record['step_ms']:.0f} ms")
        (drawn,) = ax.plot(line["t_ms"], gib, lw=1.2, label=label)
        top = max(range(len(gib)), key=gib.__getitem__)
        ax.plot([line["t_ms"][top]], [gib[top]], marker="o", color=drawn.get_color(), ms=4)
    ax.set_xlabel("time in the step (ms, the allocator's clock)")
    ax.set_ylabel("GiB allocated on top of weights + optimizer state")
    ax.set_title(f"One training step of the e2e model on the {data['device']}: memory over time", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    note = f"from benchmarks/results/{source.name} ({data['date']}, torch {data['torch']})"
    if failed:
        note += "; not recorded: " + ", ".join(failed)
    fig.text(0.01, 0.01, note, fontsize=6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def write_figures(out: Path, results: Path = RESULTS) -> list[Path]:
    """The figures into `out` (a memory timeline for each committed timeline file); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows, ceilings, files = load_rows(results)
    paths = [plot_roofline(rows, ceilings, files, out / "roofline_h200.png"),
             plot_pct_copy(rows, files, out / "pct_copy_h200.png")]
    for source in sorted(results.glob("memory_timeline_*.json")):
        paths.append(plot_memory_timeline(source, out / source.with_suffix(".png").name))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "guide" / "figures")
    args = parser.parse_args(argv)
    for path in write_figures(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
