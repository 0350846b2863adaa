"""Measuring what shipping costs: checkpoint size and save/load time, and a deployed forward's latency.

    fmt = safetensors_format(report)                       # or torch_save_format(device)
    m = time_checkpoint(model, fmt, fresh_model, directory, reps=3)
    m.bytes, m.save.median_ms, m.load.median_ms, m.equal   # size on disk, timings, loaded == saved
    f = time_forward(lambda: runner(ids), device)          # Timing, CUDA-graph Timing (or why not), peak memory

Save times are the write calls' wall time without fsync (the bytes land in the page cache, as a user's
save does); load times read files that were just written, so the page cache is warm. Load time is
measured into a model built beforehand (its construction is not timed) and ends when the weights are on
the model's device. `benchmarks/bench_deploy.py` runs these on the built-in Llama.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernel_pytorch._errors import short_error
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph
from kernel_pytorch.benchmark.memory import MemoryMeasurement, peak_memory
from kernel_pytorch.benchmark.module import infer_device
from kernel_pytorch.benchmark.timer import Timing, free_device_memory, summarize, time_fn
from kernel_pytorch.deploy.loading import load
from kernel_pytorch.deploy.saving import save

WALL_METHOD = "wall clock per call, device synchronised"


@dataclass(frozen=True)
class CheckpointFormat:
    """One way of writing a model to a directory and reading it back into a freshly built model."""

    name: str
    save: Callable[[nn.Module, Path], Any]  # (model, directory) -> anything
    load: Callable[[Path, nn.Module], Any]  # (directory, fresh model) -> anything; loads in place


def safetensors_format(report: Any = None, name: str = "kernel_pytorch.save") -> CheckpointFormat:
    """`kernel_pytorch.save` (safetensors + manifest, `report`'s swaps) and `kernel_pytorch.load`."""
    return CheckpointFormat(name, lambda model, d: save(model, d, report=report), lambda d, model: load(d, model))


def torch_save_format(device: torch.device | str, name: str = "torch.save") -> CheckpointFormat:
    """`torch.save(model.state_dict())` and `torch.load(weights_only=True, map_location=device)` +
    `load_state_dict`, the pickle-based baseline."""

    def write(model: nn.Module, d: Path) -> None:
        d.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), d / "model.pt")

    def read(d: Path, model: nn.Module) -> None:
        model.load_state_dict(torch.load(d / "model.pt", weights_only=True, map_location=device))

    return CheckpointFormat(name, write, read)


def dir_bytes(path: str | Path) -> int:
    """Bytes on disk of a file, or of every file under a directory (apparent sizes)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plain(t: torch.Tensor) -> torch.Tensor:
    # a quantized tensor subclass (torchao) is compared by the values it stands for
    return t.dequantize() if type(t) is not torch.Tensor and hasattr(t, "dequantize") else t


def same_weights(a: nn.Module, b: nn.Module) -> bool | None:
    """Every state_dict tensor of `a` bitwise equal to `b`'s under the same key (dtype and shape too);
    None when a tensor could not be compared (a subclass without dequantize, say)."""
    sa, sb = a.state_dict(), b.state_dict()
    if list(sa) != list(sb):
        return False
    try:
        for k, t in sa.items():
            if not isinstance(t, torch.Tensor):
                continue
            t, u = _plain(t), _plain(sb[k])
            if t.dtype != u.dtype or t.shape != u.shape or not torch.equal(t, u.to(t.device)):
                return False
    except Exception:  # noqa: BLE001 (an uncomparable subclass is "not checked", not a failed benchmark)
        return None
    return True


@dataclass(frozen=True)
class CheckpointTiming:
    """A checkpoint format measured on one model: size, save and load time, and whether the loaded
    weights equal the saved ones (checked after the last load)."""

    name: str
    bytes: int
    files: int
    save: Timing
    load: Timing
    equal: bool | None


def time_checkpoint(model: nn.Module, fmt: CheckpointFormat, fresh: Callable[[], nn.Module], directory: str | Path,
                    reps: int = 3) -> CheckpointTiming:
    """Save `model` with `fmt` `reps` times into `directory` (emptied first each time) and load it into
    `reps` fresh models from `fresh()` (built outside the timed region); median of each.

    Args:
        model: the model to save (on its device; its weights are not changed).
        fmt: how to save and load (`safetensors_format`, `torch_save_format`).
        fresh: builds the model to load into (the original architecture, on the device, in the dtype).
        directory: scratch directory for the files; left holding the last save.
        reps: repetitions of each (at least 1).
    """
    d = Path(directory)
    device = infer_device(model, ())
    saves, loads = [], []
    equal: bool | None = None
    n = max(1, reps)
    for i in range(n):
        shutil.rmtree(d, ignore_errors=True)
        _sync(device)
        t = time.perf_counter()
        fmt.save(model, d)
        saves.append((time.perf_counter() - t) * 1e3)
        target = fresh()
        _sync(device)
        t = time.perf_counter()
        fmt.load(d, target)
        _sync(device)
        loads.append((time.perf_counter() - t) * 1e3)
        if i == n - 1:
            equal = same_weights(model, target)
        del target
        free_device_memory(device, collect=False)
    files = sum(1 for f in d.rglob("*") if f.is_file()) if d.is_dir() else 1
    return CheckpointTiming(fmt.name, dir_bytes(d), files, summarize(saves, WALL_METHOD + " (no fsync)"),
                            summarize(loads, WALL_METHOD + " (page cache warm)"), equal)


@dataclass(frozen=True)
class ForwardTiming:
    """One forward callable timed: the do_bench-style timing, CUDA-graph replay (or why not) and the
    peak memory of one call."""

    timing: Timing
    graph: Timing | None
    graph_error: str
    memory: MemoryMeasurement


def time_forward(fn: Callable[[], Any], device: torch.device | str, *, graph: bool = True,
                 rep_ms: float = 100.0, cpu_min_run_time: float = 0.2) -> ForwardTiming:
    """Time `fn` (a forward under torch.no_grad, already warm) with `time_fn`, then, on CUDA and with
    `graph`, replayed from a CUDA graph (a capture that fails is reported, not raised), then its peak
    memory."""
    dev = torch.device(device)
    timing = time_fn(fn, device=dev, rep_ms=rep_ms, cpu_min_run_time=cpu_min_run_time)
    replay, why = None, ""
    if dev.type != "cuda":
        why = "no CUDA graphs on cpu"
    elif graph:
        try:
            replay = time_cuda_graph(fn, device=dev, call_ms=timing.median_ms)
        except Exception as exc:  # a package or kernel that cannot be captured: say so, keep the rest
            why = short_error(exc, 300)
    memory = peak_memory(fn, dev)
    return ForwardTiming(timing, replay, why, memory)


def timed(fn: Callable[[], Any], device: torch.device | str) -> tuple[Any, float]:
    """(fn(), seconds it took, device synchronised): for one-off steps such as a build or a first call."""
    dev = torch.device(device)
    _sync(dev)
    t = time.perf_counter()
    out = fn()
    _sync(dev)
    return out, time.perf_counter() - t


__all__ = [
    "CheckpointFormat",
    "CheckpointTiming",
    "ForwardTiming",
    "dir_bytes",
    "safetensors_format",
    "same_weights",
    "time_checkpoint",
    "time_forward",
    "timed",
    "torch_save_format",
]
