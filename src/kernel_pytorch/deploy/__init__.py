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

__all__ = [
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
]
