"""kernel_pytorch: drop-in Triton kernels, compile diagnostics and honest benchmarks for PyTorch.

    import kernel_pytorch as kp
    y = kp.functional.rms_norm(x, weight)          # Triton on CUDA, reference on CPU
    norm = kp.nn.RMSNorm(4096)                      # a torch.nn.RMSNorm that runs our kernel
    report = kp.validate_optimization(model, fast_model, inputs)   # right? faster? compiles?
    report = kp.CompilerOptimizationAssistant().analyze_component(model, inputs)  # graph breaks, recompiles
    model, report = kp.optimize(model, example_inputs)   # swap in our modules, validated
    kp.save(model, "out", report=report); model = kp.load("out", make_model)   # safetensors, no pickle

The public names load on first use (PEP 562), so `import kernel_pytorch` alone does not import torch:
the `kernel-pytorch` command answers `--help` and argument errors at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "functional": ("kernel_pytorch.functional", None),
    "nn": ("kernel_pytorch.nn", None),
    "optim": ("kernel_pytorch.optim", None),
    "CompilerOptimizationAssistant": ("kernel_pytorch.assistant", "CompilerOptimizationAssistant"),
    "AnalysisOptions": ("kernel_pytorch.assistant", "AnalysisOptions"),
    "validate_optimization": ("kernel_pytorch.validation", "validate_optimization"),
    "optimize": ("kernel_pytorch.optimize", "optimize"),
    "save": ("kernel_pytorch.deploy", "save"),
    "load": ("kernel_pytorch.deploy", "load"),
}

if TYPE_CHECKING:
    from kernel_pytorch import functional, nn, optim
    from kernel_pytorch.assistant import AnalysisOptions, CompilerOptimizationAssistant
    from kernel_pytorch.deploy import load, save
    from kernel_pytorch.optimize import optimize
    from kernel_pytorch.validation import validate_optimization


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kernel_pytorch' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["AnalysisOptions", "CompilerOptimizationAssistant", "__version__", "functional", "load", "nn", "optim",
           "optimize", "save", "validate_optimization"]
