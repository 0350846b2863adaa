"""Shipping an optimized model: `torch.export` programs and AOTInductor packages (`export.py`), and
deterministic weight-only quantization with torchao (`quantize.py`)."""

from __future__ import annotations

from kernel_pytorch.deploy.export import (
    ExportCheck,
    ExportMismatch,
    aoti_package,
    check_program,
    dynamic_dims,
    export,
    fresh_inputs,
    load_package,
    load_program,
    our_ops,
)
from kernel_pytorch.deploy.quantize import (
    QUANT_TOLERANCES,
    QuantDeterminism,
    QuantValidation,
    available_schemes,
    quant_determinism,
    quantize,
    validate_quantized,
)

__all__ = [
    "QUANT_TOLERANCES",
    "ExportCheck",
    "ExportMismatch",
    "aoti_package",
    "check_program",
    "dynamic_dims",
    "export",
    "fresh_inputs",
    "load_package",
    "load_program",
    "our_ops",
    "QuantDeterminism",
    "QuantValidation",
    "available_schemes",
    "quant_determinism",
    "quantize",
    "validate_quantized",
]
