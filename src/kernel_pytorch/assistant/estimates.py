"""The figures the fusion and memory estimates stand on, each labelled with where it came from.

Time saved by moving fewer bytes is bytes / copy bandwidth. The bandwidth is the one measured on this
device when `kernel_pytorch.benchmark.ceilings` has it cached for this device, host and torch version
(`kernel-pytorch doctor --measure` or a benchmark run measures and caches it); the analysis never
measures it itself (that takes seconds), and its label says when, where and from which file the cached
figure came. Without a cached measurement it is the GPU's datasheet peak, else an assumed figure, and
says so.
"""

from __future__ import annotations

from dataclasses import dataclass

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


__all__ = ["Bandwidth", "copy_bandwidth", "fmt_bytes", "fmt_seconds"]
