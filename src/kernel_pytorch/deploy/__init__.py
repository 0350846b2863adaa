"""Shipping an optimized model: save and load without pickle (`saving.py`, `loading.py`, the JSON
manifest in `manifest.py`), and the one-time conversion of a trusted torch.save checkpoint
(`convert.py`).

    kernel_pytorch.save(model, "out", report=report)        # safetensors + kernel_pytorch.json
    model = kernel_pytorch.load("out", make_model)           # the original architecture, re-optimized

This layer sits above `optimize` (it re-applies its rules by name) and below the CLI
(docs/architecture.md).
"""

from __future__ import annotations

from kernel_pytorch.deploy._files import LoadError, PickleRefusedError
from kernel_pytorch.deploy.convert import convert
from kernel_pytorch.deploy.loading import load
from kernel_pytorch.deploy.manifest import Manifest, ManifestError, describe_differences, version_differences
from kernel_pytorch.deploy.saving import save, save_state_dict

__all__ = [
    "LoadError",
    "Manifest",
    "ManifestError",
    "PickleRefusedError",
    "convert",
    "describe_differences",
    "load",
    "save",
    "save_state_dict",
    "version_differences",
]
