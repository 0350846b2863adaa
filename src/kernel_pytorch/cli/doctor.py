"""`kernel-pytorch doctor`: what is installed, which device, whether the Triton path is active."""

from __future__ import annotations

import argparse
import json
import platform

import torch

from kernel_pytorch import __version__
from kernel_pytorch._env import triton_status, triton_version
from kernel_pytorch.cli._parser import command


def collect(measure: bool = False) -> dict[str, object]:
    """Environment facts as a JSON-able dict; with `measure`, the copy and matmul ceilings measured now
    (and cached, for the analyses to use)."""
    info: dict[str, object] = {
        "kernel_pytorch": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version() or "not installed",
        "cuda_runtime": torch.version.cuda or "none (CPU build)",
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info["device"] = props.name
        info["capability"] = f"{props.major}.{props.minor}"
        info["sm_count"] = props.multi_processor_count
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    else:
        info["device"] = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    active, why = triton_status("cuda" if torch.cuda.is_available() else "cpu")
    info["triton_path"] = "active" if active else "inactive"
    info["triton_reason"] = why
    if measure:
        from kernel_pytorch.benchmark.ceilings import measure_ceilings

        info["ceilings"] = measure_ceilings(force=True).to_dict()  # measured now, and cached for the analyses
    return info


def _print(info: dict[str, object]) -> None:
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key:<{width}}")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key:<{width}}  {value}")


def run(args: argparse.Namespace) -> int:
    info = collect(measure=args.measure)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        _print(info)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "doctor")
    p.add_argument("--measure", action="store_true", help="also measure copy bandwidth and matmul rate")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)
