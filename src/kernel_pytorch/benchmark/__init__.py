"""Measuring honestly: a timer (CUDA events or torch.utils.benchmark), measured ceilings, roofline
arithmetic, one results schema, plots, and `benchmark_module`.

These measurement tools sit below `kernel_pytorch.validation` (which uses them) and never import it.
The suites (`benchmark.suites`: op specs and their runner, whose gate uses validation's comparisons)
sit above it, and this package does not import them."""

from kernel_pytorch.benchmark.ceilings import Ceilings, measure_ceilings, roofline
from kernel_pytorch.benchmark.graph_timer import time_cuda_graph
from kernel_pytorch.benchmark.memory import MemoryMeasurement, peak_memory
from kernel_pytorch.benchmark.module import ModuleBenchmark, benchmark_module
from kernel_pytorch.benchmark.timer import Timing, speedup, time_fn

__all__ = [
    "Ceilings",
    "MemoryMeasurement",
    "ModuleBenchmark",
    "Timing",
    "benchmark_module",
    "measure_ceilings",
    "peak_memory",
    "roofline",
    "speedup",
    "time_cuda_graph",
    "time_fn",
]
