"""Measured roofs (copy bandwidth, matmul rate), datasheet peaks, and roofline arithmetic.

Results are reported against what the device demonstrably does, not what its datasheet promises:

* copy: `dst.copy_(src)` of 1 GiB on CUDA (64 MiB on CPU), counting bytes read + bytes written.
* matmul: an 8192^3 bf16 matmul on CUDA (1024^3 fp32 on CPU), 2*M*N*K FLOPs.

Measurements are cached per device name, host and torch version in `ceilings.json` under the user
cache dir (`$KERNEL_PYTORCH_CACHE_DIR`, else `$XDG_CACHE_HOME/kernel_pytorch`, else
`~/.cache/kernel_pytorch`); `measure_ceilings(force=True)` measures again. A result read back says so
(`source="cache"`, `origin`: the file, the host and when it was measured), so a figure an earlier process
left is never mistaken for one measured now. The datasheet table is for context only and is labelled as
such wherever it is printed.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kernel_pytorch.benchmark.timer import resolve_device, time_fn

CUDA_COPY_BYTES = 2**30
CUDA_MATMUL_N = 8192
CPU_COPY_BYTES = 64 * 2**20
CPU_MATMUL_N = 1024


@dataclass(frozen=True)
class DatasheetPeak:
    """A vendor's advertised peaks (dense, no sparsity). Context, never a measurement."""

    name: str
    memory_gbps: float
    bf16_tflops: float
    source: str


# NVIDIA datasheet / architecture whitepaper figures, dense bf16 tensor-core rate (fp32 accumulate).
DATASHEET: dict[str, DatasheetPeak] = {
    "H100 SXM": DatasheetPeak("H100 SXM5 80GB", 3350.0, 989.4, "NVIDIA H100 datasheet (HBM3)"),
    "H100 PCIe": DatasheetPeak("H100 PCIe 80GB", 2000.0, 756.0, "NVIDIA H100 datasheet (HBM2e)"),
    "H100 NVL": DatasheetPeak("H100 NVL 94GB", 3900.0, 835.0, "NVIDIA H100 datasheet"),
    "H200": DatasheetPeak("H200 SXM 141GB", 4800.0, 989.4, "NVIDIA H200 datasheet (HBM3e)"),
    "A100 SXM 80GB": DatasheetPeak("A100 SXM4 80GB", 2039.0, 312.0, "NVIDIA A100 datasheet"),
    "A100 SXM 40GB": DatasheetPeak("A100 SXM4 40GB", 1555.0, 312.0, "NVIDIA A100 datasheet"),
    "A100 PCIe 80GB": DatasheetPeak("A100 PCIe 80GB", 1935.0, 312.0, "NVIDIA A100 datasheet"),
    "A100 PCIe 40GB": DatasheetPeak("A100 PCIe 40GB", 1555.0, 312.0, "NVIDIA A100 datasheet"),
    "L4": DatasheetPeak("L4 24GB", 300.0, 121.0, "NVIDIA L4 datasheet"),
    "RTX 4090": DatasheetPeak("GeForce RTX 4090", 1008.0, 165.2, "NVIDIA Ada whitepaper (fp32 accumulate)"),
}


def datasheet_for(device_name: str) -> DatasheetPeak | None:
    """The datasheet entry matching a `torch.cuda.get_device_name()` string, or None.

    Examples: "NVIDIA H100 80GB HBM3" -> H100 SXM, "NVIDIA A100-SXM4-40GB" -> A100 SXM 40GB.
    """
    n = device_name.upper().replace("-", " ")
    if "H200" in n:
        return DATASHEET["H200"]
    if "H100" in n:
        if "NVL" in n:
            return DATASHEET["H100 NVL"]
        if "PCIE" in n:
            return DATASHEET["H100 PCIe"]
        return DATASHEET["H100 SXM"]  # the SXM part reports itself as "H100 80GB HBM3"
    if "A100" in n:
        form = "PCIe" if "PCIE" in n else "SXM"
        size = "40GB" if "40GB" in n else "80GB"
        return DATASHEET[f"A100 {form} {size}"]
    if "L4" in n.split():
        return DATASHEET["L4"]
    if "4090" in n:
        return DATASHEET["RTX 4090"]
    return None


@dataclass(frozen=True)
class Ceilings:
    """What one device measurably sustains: copy bandwidth and matmul throughput."""

    device: str
    copy_gbps: float  # (bytes read + bytes written) / time, 1e9 bytes per GB
    copy_bytes: int  # size of the copied buffer
    matmul_tflops: float
    matmul_shape: tuple[int, int, int]
    matmul_dtype: str
    torch_version: str
    measured_at: str  # ISO 8601, UTC
    source: str = "measured"  # "measured" in this process, or "cache" when read back
    datasheet: DatasheetPeak | None = None
    origin: str = ""  # for source "cache": the cache file and the host that measured it; "" when measured now

    @property
    def provenance(self) -> str:
        """"measured now", or "measured <when> on <host>, cached in <file>" for a cached result."""
        if self.source != "cache":
            return "measured now"
        return f"measured {self.measured_at} {self.origin}" if self.origin else f"measured {self.measured_at}, cached"

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOPs per byte) where the copy and matmul roofs meet."""
        return self.matmul_tflops * 1e12 / (self.copy_gbps * 1e9)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["matmul_shape"] = list(self.matmul_shape)
        if self.datasheet is not None:
            d["datasheet"] = {**asdict(self.datasheet), "label": "datasheet peak, not measured"}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ceilings:
        ds = d.get("datasheet")
        sheet = DatasheetPeak(**{k: ds[k] for k in DatasheetPeak.__dataclass_fields__}) if ds else None
        return cls(
            device=d["device"],
            copy_gbps=float(d["copy_gbps"]),
            copy_bytes=int(d["copy_bytes"]),
            matmul_tflops=float(d["matmul_tflops"]),
            matmul_shape=tuple(int(v) for v in d["matmul_shape"]),  # type: ignore[arg-type]
            matmul_dtype=d["matmul_dtype"],
            torch_version=d["torch_version"],
            measured_at=d["measured_at"],
            source=d.get("source", "measured"),
            datasheet=sheet,
            origin=str(d.get("origin", "")),
        )

    def summary(self) -> str:
        text = (
            f"{self.device}: copy {self.copy_gbps:.0f} GB/s, {self.matmul_dtype} matmul "
            f"{self.matmul_tflops:.1f} TFLOP/s ({self.provenance})"
        )
        if self.datasheet is not None:
            text += (
                f"; datasheet peaks (not measured): {self.datasheet.memory_gbps:.0f} GB/s, "
                f"{self.datasheet.bf16_tflops:.0f} bf16 TFLOP/s"
            )
        return text


def _now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def device_name(device: torch.device | str | None = None) -> str:
    """Human name of a device: the CUDA product name, or the CPU with its thread count."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def cache_dir() -> Path:
    """Directory of kernel_pytorch's user cache (created on first write, not here)."""
    explicit = os.environ.get("KERNEL_PYTORCH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel_pytorch"


def cache_file() -> Path:
    """The JSON file of measured ceilings, one entry per device name, host and torch version."""
    return cache_dir() / "ceilings.json"


def _host() -> str:
    return platform.node() or "an unnamed host"


def _cache_key(name: str) -> str:
    return f"{name} | {_host()} | torch {torch.__version__}"


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_ceilings(device: torch.device | str | None = None) -> Ceilings | None:
    """The ceilings an earlier `measure_ceilings` cached for this device, host and torch version, or None;
    measures nothing. The result has `source="cache"` and its `origin` (file, host)."""
    dev = resolve_device(device)
    name = device_name(dev)
    cached = _read_cache().get(_cache_key(name))
    if not isinstance(cached, dict):
        return None
    origin = f"on {_host()}, cached in {cache_file()}"  # the key holds the host
    try:
        return Ceilings.from_dict({**cached, "source": "cache", "origin": origin})
    except (KeyError, TypeError, ValueError):
        return None  # an old or damaged entry: as if none were cached


def _write_cache(key: str, ceilings: Ceilings) -> None:
    data = _read_cache()
    data[key] = ceilings.to_dict()
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)  # atomic: two processes measuring at once never leave half a file
    except OSError:
        pass  # a read-only home still gets its numbers, just not cached


def measure_copy_gbps(device: torch.device | str | None = None, nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    Args:
        device: where to measure (default: current CUDA device, else CPU).
        nbytes: buffer size (default 1 GiB on CUDA, 64 MiB on CPU).
    """
    dev = resolve_device(device)
    n = nbytes or (CUDA_COPY_BYTES if dev.type == "cuda" else CPU_COPY_BYTES)
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    # a 1 GiB copy dwarfs any cache, so no flush is needed (and one would only add noise)
    t = time_fn(lambda: dst.copy_(src), device=dev, flush_l2=False, rep_ms=200.0, cpu_min_run_time=0.1)
    return gbps(2 * n, t.median_ms)


def measure_matmul_tflops(
    device: torch.device | str | None = None, n: int | None = None, dtype: torch.dtype | None = None
) -> tuple[float, int, torch.dtype]:
    """Square matmul throughput in TFLOP/s (2*n^3 FLOPs per call).

    Args:
        device: where to measure.
        n: matrix size (default 8192 on CUDA, 1024 on CPU).
        dtype: default bf16 on CUDA, fp32 on CPU (CPU bf16 matmul is an emulation on many parts).
    Returns:
        (TFLOP/s, n, dtype).
    """
    dev = resolve_device(device)
    n = n or (CUDA_MATMUL_N if dev.type == "cuda" else CPU_MATMUL_N)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    t = time_fn(lambda: a @ b, device=dev, flush_l2=False, rep_ms=200.0, cpu_min_run_time=0.1)
    return tflops(2 * n**3, t.median_ms), n, dtype


def measure_ceilings(device: torch.device | str | None = None, *, force: bool = False) -> Ceilings:
    """The device's copy and matmul ceilings, from the cache unless `force` (then measured and cached).

    Args:
        device: CUDA device or "cpu" (default: current CUDA device, else CPU).
        force: measure even if a cached result exists for this device, host and torch version.
    Returns:
        `Ceilings`; `.source` says whether it was measured now or read from the cache, `.provenance`
        says it in words (for a cached one: when, on which host, from which file).
    """
    dev = resolve_device(device)
    name = device_name(dev)
    if not force and (cached := cached_ceilings(dev)) is not None:
        return cached
    copy = measure_copy_gbps(dev)
    tflops, n, dtype = measure_matmul_tflops(dev)
    result = Ceilings(
        device=name,
        copy_gbps=copy,
        copy_bytes=CUDA_COPY_BYTES if dev.type == "cuda" else CPU_COPY_BYTES,
        matmul_tflops=tflops,
        matmul_shape=(n, n, n),
        matmul_dtype=str(dtype).removeprefix("torch."),
        torch_version=torch.__version__,
        measured_at=_now(),
        source="measured",
        datasheet=datasheet_for(name) if dev.type == "cuda" else None,
    )
    _write_cache(_cache_key(name), result)
    return result


# ---- roofline arithmetic -------------------------------------------------------------------------


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes) for `nbytes` moved in `ms` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Achieved throughput in TFLOP/s for `flops` operations in `ms` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def percent_of(value: float, ceiling: float) -> float:
    """`value` as a percentage of `ceiling`."""
    if ceiling <= 0:
        raise ValueError("ceiling must be positive")
    return 100.0 * value / ceiling


@dataclass(frozen=True)
class RooflinePoint:
    """Where one measured call sits against the ceilings."""

    gbps: float | None
    tflops: float | None
    pct_of_copy: float | None
    pct_of_matmul: float | None
    intensity: float | None  # FLOPs per byte
    bound: str  # "memory", "compute" or "unknown": which roof is lower at this intensity

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline(
    ms: float, *, nbytes: float | None = None, flops: float | None = None, ceilings: Ceilings | None = None
) -> RooflinePoint:
    """Achieved GB/s and TFLOP/s of one call and their % of the measured ceilings.

    Args:
        ms: median time of the call in milliseconds.
        nbytes: minimum bytes the call must move (each input read once, each output written once).
        flops: floating-point operations the call performs.
        ceilings: the device's measured ceilings (percentages are None without them).
    """
    bw = gbps(nbytes, ms) if nbytes else None
    rate = tflops(flops, ms) if flops else None
    pct_copy = percent_of(bw, ceilings.copy_gbps) if bw is not None and ceilings else None
    pct_mm = percent_of(rate, ceilings.matmul_tflops) if rate is not None and ceilings else None
    intensity = flops / nbytes if flops and nbytes else None
    bound = "unknown"
    if intensity is not None and ceilings is not None:
        bound = "memory" if intensity < ceilings.ridge else "compute"
    return RooflinePoint(bw, rate, pct_copy, pct_mm, intensity, bound)


__all__ = [
    "DATASHEET",
    "Ceilings",
    "DatasheetPeak",
    "RooflinePoint",
    "cache_dir",
    "cache_file",
    "cached_ceilings",
    "datasheet_for",
    "device_name",
    "gbps",
    "measure_ceilings",
    "measure_copy_gbps",
    "measure_matmul_tflops",
    "percent_of",
    "roofline",
    "tflops",
]
