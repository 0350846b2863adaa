"""The figures the fusion and memory estimates stand on, each labelled with where it came from.

Time per step is the report's own: the eager step the kernel profile timed for the compile verdict
(`step_time`), so an estimate priced in step time never contradicts the step the report shows; only
when the profile is off is it a warm eager forward the analyser timed itself, and says so.

Time saved by moving fewer bytes is bytes / copy bandwidth. The bandwidth is the one measured on this
device when `kernel_pytorch.benchmark.ceilings` has it cached for this device, host and torch version
(`kernel-pytorch doctor --measure` or a benchmark run measures and caches it); the analysis never
measures it itself (that takes seconds), and its label says when, where and from which file the cached
figure came. Without a cached measurement it is the GPU's datasheet peak, else an assumed figure, and
says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# where nothing was measured and no datasheet matches: round figures, labelled as assumed
ASSUMED_GPU_GBPS = 1000.0
ASSUMED_CPU_GBPS = 20.0


@dataclass(frozen=True)
class Bandwidth:
    """A copy bandwidth (bytes read + written per second, 1e9 bytes per GB) and its provenance.

    Attributes:
        gbps: the figure.
        source: "measured" (this device, host and torch version, cached ceilings), "datasheet" or
            "assumed".
        label: a sentence naming the figure and its source, for evidence text.
    """

    gbps: float
    source: str
    label: str

    def seconds(self, nbytes: float) -> float:
        """Time to move `nbytes` at this bandwidth."""
        return nbytes / (self.gbps * 1e9)


def copy_bandwidth(device: torch.device | str) -> Bandwidth:
    """The copy bandwidth estimates use on `device`: measured (cached), datasheet, else assumed."""
    from kernel_pytorch.benchmark import ceilings

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    try:
        name = ceilings.device_name(dev)
        # the cache measure_ceilings() writes; read only, so an analysis never spends seconds measuring
        cached = ceilings.cached_ceilings(dev)
    except Exception:  # an exotic device: nothing to look up
        name, cached = str(dev), None
    if cached is not None and cached.copy_gbps > 0:
        gbps = cached.copy_gbps
        return Bandwidth(gbps, "measured", f"{gbps:.0f} GB/s copy bandwidth of {name}, {cached.provenance} "
                         "(`kernel-pytorch doctor --measure` measures it again)")
    sheet = ceilings.datasheet_for(name) if dev.type == "cuda" else None
    if sheet is not None:
        return Bandwidth(
            sheet.memory_gbps,
            "datasheet",
            f"{sheet.memory_gbps:.0f} GB/s, the {sheet.name} datasheet peak (not measured: "
            "`kernel-pytorch doctor --measure` measures it)",
        )
    gbps = ASSUMED_GPU_GBPS if dev.type == "cuda" else ASSUMED_CPU_GBPS
    return Bandwidth(
        gbps,
        "assumed",
        f"{gbps:.0f} GB/s, an assumed {dev.type.upper()} copy bandwidth (not measured: "
        "`kernel-pytorch doctor --measure` measures it)",
    )


@dataclass(frozen=True)
class StepTime:
    """One step of the model, the scale estimates of time per step are put on.

    Attributes:
        ms: the step's median time.
        measured: True when it is the report's timed step (the kernel profile's eager timing).
        label: a phrase naming the figure and its source, for evidence text.
    """

    ms: float
    measured: bool
    label: str


def step_time(ctx: Any, pass_name: str = "fwd") -> StepTime | None:
    """The eager `pass_name` step ("fwd" or "fwd+bwd") of the report: the kernel profile's timing (run
    here if the profile is on and has not run yet; it is measured once per context), else, for "fwd",
    the context's warm eager forward; None when neither exists."""
    rt = ctx.__dict__.get("runtime")
    if rt is None and ctx.options.kernel_profile:
        try:
            rt = ctx.runtime
        except Exception:  # a profile that cannot run leaves the fallback
            rt = None
    timing = rt.timings.get(f"eager {pass_name}") if rt is not None else None
    if timing is not None:
        return StepTime(timing.median_ms, True, f"the {timing.median_ms:.3g} ms eager {pass_name} step the "
                        "kernel profile measured")
    warm = ctx.warm_forward_s if pass_name == "fwd" else None
    if warm is None:
        return None
    return StepTime(1e3 * warm, False, f"a {1e3 * warm:.3g} ms warm eager forward (the median of a few calls; "
                    "the kernel profile was off)")


def fmt_bytes(n: float) -> str:
    """1536 -> "1.5 KiB"; binary units, three significant figures."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float) -> str:
    """0.0000123 -> "12.3 us"; three significant figures."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


__all__ = ["Bandwidth", "StepTime", "copy_bandwidth", "fmt_bytes", "fmt_seconds", "step_time"]
