"""kernel_pytorch: drop-in Triton kernels, compile diagnostics and honest benchmarks for PyTorch.

    import kernel_pytorch as kp
    y = kp.functional.rms_norm(x, weight)          # Triton on CUDA, reference on CPU
    norm = kp.nn.RMSNorm(4096)                      # a torch.nn.RMSNorm that runs our kernel
    report = kp.validate_optimization(model, fast_model, inputs)   # right? faster? compiles?
    report = kp.CompilerOptimizationAssistant().analyze_component(model, inputs)  # graph breaks, recompiles
"""

from kernel_pytorch import functional, nn
from kernel_pytorch.assistant import CompilerOptimizationAssistant
from kernel_pytorch.validation import validate_optimization

__version__ = "0.1.0"

__all__ = ["CompilerOptimizationAssistant", "__version__", "functional", "nn", "validate_optimization"]
