"""Shipping an optimized model.

- save and load without pickle (`saving.py`, `loading.py`, the JSON manifest in `manifest.py`), and the
  one-time conversion of a trusted torch.save checkpoint (`convert.py`);
- `torch.export` programs and AOTInductor packages (`export.py`);
- deterministic weight-only quantization with torchao or our own kernels (`quantize.py`), and how far
  it moves a language model's predictions (`quant_accuracy.py`).

    kernel_pytorch.save(model, "out", report=report)        # safetensors + kernel_pytorch.json
    model = kernel_pytorch.load("out", make_model)           # the original architecture, re-optimized
    program = kernel_pytorch.deploy.export(model, inputs)    # our ops as kernel_pytorch::* nodes

This layer sits above `optimize` (it re-applies its rules by name) and below the CLI
(docs/architecture.md).
"""

from __future__ import annotations

from kernel_pytorch.deploy._files import LoadError, PickleRefusedError
from kernel_pytorch.deploy.convert import convert
from kernel_pytorch.deploy.export import (
    ExportCheck,
    ExportMismatch,
    PackageLoad,
    aoti_package,
    check_program,
    dynamic_dims,
    export,
    fresh_inputs,
    load_package,
    load_program,
    our_ops,
    share_cxx_runtime,
    try_package,
)
from kernel_pytorch.deploy.loading import load
from kernel_pytorch.deploy.manifest import Manifest, ManifestError, describe_differences, version_differences
from kernel_pytorch.deploy.quant_accuracy import QuantAgreement, linear_weight_bytes, quantized_agreement
from kernel_pytorch.deploy.quantize import (
    QuantDeterminism,
    QuantValidation,
    available_schemes,
    quant_determinism,
    quant_rtol,
    quantize,
    validate_quantized,
)
from kernel_pytorch.deploy.saving import save, save_state_dict

__all__ = [
    "ExportCheck",
    "ExportMismatch",
    "LoadError",
    "Manifest",
    "ManifestError",
    "PackageLoad",
    "PickleRefusedError",
    "QuantAgreement",
    "QuantDeterminism",
    "QuantValidation",
    "aoti_package",
    "available_schemes",
    "check_program",
    "convert",
    "describe_differences",
    "dynamic_dims",
    "export",
    "fresh_inputs",
    "linear_weight_bytes",
    "load",
    "load_package",
    "load_program",
    "our_ops",
    "quant_determinism",
    "quant_rtol",
    "quantize",
    "quantized_agreement",
    "save",
    "save_state_dict",
    "share_cxx_runtime",
    "try_package",
    "validate_quantized",
    "version_differences",
]
