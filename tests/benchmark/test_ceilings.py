"""Ceilings: datasheet lookup, roofline arithmetic, measuring and the per-device cache."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark import ceilings as C


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ],
)
def test_datasheet_lookup(name: str, key: str) -> None:
    assert C.datasheet_for(name) is C.DATASHEET[key]


def test_unknown_devices_have_no_datasheet() -> None:
    assert C.datasheet_for("NVIDIA GeForce GTX 1080") is None
    assert C.datasheet_for("cpu (x86_64, 2 threads)") is None


def _ceilings(copy: float = 2000.0, mm: float = 500.0) -> C.Ceilings:
    return C.Ceilings(device="test", copy_gbps=copy, copy_bytes=1, matmul_tflops=mm,
                      matmul_shape=(8, 8, 8), matmul_dtype="bfloat16", torch_version="x",
                      measured_at="now", datasheet=C.DATASHEET["H100 SXM"])


def test_roofline_arithmetic() -> None:
    assert C.gbps(2e9, 1000.0) == pytest.approx(2.0)
    assert C.tflops(3e12, 500.0) == pytest.approx(6.0)
    assert C.percent_of(750.0, 3000.0) == pytest.approx(25.0)
    with pytest.raises(ValueError):
        C.percent_of(1.0, 0.0)
    ceil = _ceilings()
    # 1 GB in 1 ms = 1000 GB/s = 50% of a 2000 GB/s copy roof; 1 FLOP/byte is far below the ridge (250)
    p = C.roofline(1.0, nbytes=1e9, flops=1e9, ceilings=ceil)
    assert p.gbps == pytest.approx(1000.0) and p.pct_of_copy == pytest.approx(50.0)
    assert p.tflops == pytest.approx(1.0) and p.pct_of_matmul == pytest.approx(0.2)
    assert p.intensity == pytest.approx(1.0) and p.bound == "memory"
    assert C.roofline(1.0, nbytes=1e6, flops=1e9, ceilings=ceil).bound == "compute"
    assert C.roofline(1.0, nbytes=1e9).pct_of_copy is None


def test_ceilings_round_trip_and_labels() -> None:
    c = _ceilings()
    d = c.to_dict()
    assert d["datasheet"]["label"] == "datasheet peak, not measured"
    assert C.Ceilings.from_dict(d) == c
    assert "datasheet peaks (not measured)" in c.summary()


def test_measure_on_cpu_caches_per_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path))
    first = C.measure_ceilings("cpu", force=True)
    assert first.source == "measured" and first.copy_gbps > 0 and first.matmul_tflops > 0
    assert first.copy_bytes == C.CPU_COPY_BYTES and first.matmul_shape == (C.CPU_MATMUL_N,) * 3
    assert first.datasheet is None
    cached = C.measure_ceilings("cpu")
    assert cached.source == "cache" and cached.copy_gbps == first.copy_gbps
    stored = (tmp_path / "ceilings.json").read_text()
    assert f"torch {torch.__version__}" in stored and first.device in stored
    assert first.provenance == "measured now"
    # a cached result says when, on which host and from which file
    assert cached.provenance == (f"measured {first.measured_at} on {platform.node()}, cached in "
                                 f"{tmp_path / 'ceilings.json'}")
    assert C.cached_ceilings("cpu") == cached
    again = C.measure_ceilings("cpu", force=True)
    assert again.source == "measured" and again.measured_at >= first.measured_at


def test_the_tests_cache_outside_the_home() -> None:
    # tests/conftest.py: a run of the tests leaves nothing in the user's cache for a later analysis to read
    assert C.cache_dir() == Path(os.environ["KERNEL_PYTORCH_CACHE_DIR"])
    home = Path.home().resolve()
    for where in (C.cache_dir(), Path(os.environ["MPLCONFIGDIR"])):
        assert home not in where.resolve().parents, where


def test_only_an_entry_of_this_device_host_and_torch_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path))
    name = C.device_name("cpu")
    entry = {**_ceilings().to_dict(), "device": name}
    (tmp_path / "ceilings.json").write_text(json.dumps({
        f"{name} | torch {torch.__version__}": entry,  # keyed without a host, as earlier versions wrote
        f"{name} | another-host | torch {torch.__version__}": {**entry, "host": "another-host"},
        f"{name} | {platform.node()} | torch 0.0.1": entry,
    }))
    assert C.cached_ceilings("cpu") is None


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KERNEL_PYTORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert C.cache_dir() == tmp_path / "kernel_pytorch"


@pytest.mark.cuda
def test_measure_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNEL_PYTORCH_CACHE_DIR", str(tmp_path))
    c = C.measure_ceilings("cuda", force=True)
    assert c.copy_bytes == C.CUDA_COPY_BYTES and c.matmul_shape == (C.CUDA_MATMUL_N,) * 3
    assert c.matmul_dtype == "bfloat16"
    assert 100 < c.copy_gbps and 10 < c.matmul_tflops
    if c.datasheet is not None:  # measured roofs sit under the advertised ones
        assert c.copy_gbps < 1.05 * c.datasheet.memory_gbps
        assert c.matmul_tflops < 1.05 * c.datasheet.bf16_tflops
