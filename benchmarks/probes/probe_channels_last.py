"""channels_last against NCHW on convolution nets: eager and compiled, forward and forward+backward, in one
process (the measurement behind docs/examples/cnn_optimization.md's channels_last section).

    python benchmarks/probes/probe_channels_last.py --out results/channels_last.md          # a GPU
    python benchmarks/probes/probe_channels_last.py --device cpu --tiny --out /tmp/cl.md     # the pipeline

Models: the built-in resnet50 (torchvision's module names) and torchvision's convnext_tiny (random weights, train mode),
batch 64 x 3 x 224 x 224 in bf16 (`--tiny`: the built-in resnet-tiny at 32 x 32, fp32). Each model is built
once per layout (weights and images converted with `.to(memory_format=...)`), eager and under
`torch.compile` (default mode), and timed with `kernel_pytorch.benchmark.benchmark_module`: CUDA events with
the L2 flushed and CUDA-graph replay, peak memory per pass; every variant's forward is checked against the
NCHW eager model's (`tolerances.compare_reordered`: the same math, its sums in another order) before it is
timed. The table gives each variant's time against NCHW eager and, for channels_last, against NCHW under the
same compile setting.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from kernel_pytorch.benchmark import benchmark_module  # noqa: E402
from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.models import build_model  # noqa: E402
from kernel_pytorch.tolerances import compare_reordered  # noqa: E402

LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def _torchvision(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    return build


def models(tiny: bool) -> dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]]:
    """name -> (builder, image shape)."""
    if tiny:
        return {"resnet-tiny": (lambda: build_model("resnet-tiny")[0], (4, 3, 32, 32))}
    shape = (64, 3, 224, 224)
    return {"resnet50": (lambda: build_model("resnet50")[0], shape),
            "convnext_tiny": (_torchvision("convnext_tiny"), shape)}


def measure(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...], dev: torch.device,
            dtype: torch.dtype, cuda_graph: bool) -> list[dict]:
    """Rows of one model: (layout, compiled) x pass, each with its median ms, q20-q80, graph ms and peak."""
    torch.manual_seed(0)
    images = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dev, dtype)
    base = build().to(dev, dtype).train()
    with torch.no_grad():
        reference = base.eval()(images).float()
    state = base.state_dict()
    rows = []
    for layout, fmt in LAYOUTS.items():
        for compiled in (False, True):
            torch._dynamo.reset()
            model = build().to(dev, dtype)
            model.load_state_dict(state)
            model = model.to(memory_format=fmt).train()
            x = images.to(memory_format=fmt)
            fn = torch.compile(model) if compiled else model
            label = f"{layout}{' + compile' if compiled else ''}"
            try:
                with torch.no_grad():
                    model.eval()
                    check = compare_reordered(fn(x).float(), reference)
                    model.train()
                if not check.passed:
                    raise AssertionError(f"forward differs from NCHW eager: {check}")
                t0 = time.perf_counter()
                result = benchmark_module(fn, (x,), device=dev, cuda_graph=cuda_graph)
                for pass_name, p in result.passes.items():
                    rows.append({"model": name, "variant": label, "layout": layout, "compiled": compiled,
                                 "pass": pass_name, "ms": p.timing.median_ms if p.timing else None,
                                 "q20": p.timing.q20_ms if p.timing else None,
                                 "q80": p.timing.q80_ms if p.timing else None,
                                 "graph_ms": p.graph_timing.median_ms if p.graph_timing else None,
                                 "peak_mib": p.memory.peak_mib if p.memory else None,
                                 "error": p.error or p.graph_error, "seconds": time.perf_counter() - t0})
            except Exception as exc:  # noqa: BLE001 (one variant failing is its row)
                rows.append({"model": name, "variant": label, "layout": layout, "compiled": compiled, "pass": "-",
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"})
    return rows


def table(rows: list[dict], header: str) -> str:
    """Markdown: each row against NCHW eager, and channels_last against NCHW with the same compile setting."""
    def find(model: str, layout: str, compiled: bool, pass_name: str) -> dict | None:
        return next((r for r in rows if (r["model"], r["layout"], r["compiled"], r["pass"]) ==
                     (model, layout, compiled, pass_name) and r.get("ms")), None)

    lines = [header, "", "| model | pass | variant | median ms (q20-q80) | CUDA graph ms | peak MiB | vs NCHW eager "
             "| channels_last vs NCHW | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("ms"):
            lines.append(f"| {r['model']} | {r['pass']} | {r['variant']} | - | - | - | - | - | {r.get('error', '')} |")
            continue
        eager = find(r["model"], "nchw", False, r["pass"])
        same = find(r["model"], "nchw", r["compiled"], r["pass"])
        vs_eager = f"{eager['ms'] / r['ms']:.2f}x" if eager else "-"
        vs_layout = f"{same['ms'] / r['ms']:.2f}x" if same and r["layout"] == "channels_last" else "-"
        graph = f"{r['graph_ms']:.3f}" if r.get("graph_ms") else "-"
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") is not None else "-"
        lines.append(f"| {r['model']} | {r['pass']} | {r['variant']} | {r['ms']:.3f} ({r['q20']:.3f}-{r['q80']:.3f}) "
                     f"| {graph} | {peak} | {vs_eager} | {vs_layout} | {r.get('error') or ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="the built-in resnet-tiny, fp32: the pipeline")
    parser.add_argument("--models", default=None, help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    dev = torch.device(args.device)
    dtype = torch.float32 if args.tiny or dev.type != "cuda" else torch.bfloat16
    chosen = models(args.tiny)
    if args.models:
        unknown = set(args.models.split(",")) - set(chosen)
        if unknown:
            parser.error(f"--models: unknown {sorted(unknown)}; known: {', '.join(chosen)}")
        chosen = {k: v for k, v in chosen.items() if k in args.models.split(",")}
    rows: list[dict] = []
    header = (f"# channels_last against NCHW ({device_name(dev)}, {time.strftime('%Y-%m-%d')}, torch "
              f"{torch.__version__}, {str(dtype).removeprefix('torch.')}, train mode)")
    for name, (build, shape) in chosen.items():
        try:
            rows += measure(name, build, shape, dev, dtype, cuda_graph=dev.type == "cuda")
        except ImportError as exc:
            rows.append({"model": name, "variant": "-", "layout": "-", "compiled": False, "pass": "-",
                         "error": f"not importable: {exc}"})
        text = table(rows, header)
        print(text, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
    return 0 if all(r.get("ms") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
