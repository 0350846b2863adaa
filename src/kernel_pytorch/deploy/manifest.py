"""The JSON manifest written beside a saved model (`kernel_pytorch.json`): what `optimize()` changed,
how the model was compiled, which input dims are dynamic, the versions it was saved with, and every
tensor's file, dtype and shape. `load()` reads it to rebuild the optimized model; `version_differences`
compares it with what is installed.

Layout (format version 1; a save with quantized weights is version 2, adding `quantization`):

    {"format": "kernel_pytorch.deploy", "format_version": 1,
     "versions": {"kernel_pytorch": "0.1.0", "torch": "2.13.0", "triton": "3.9.0", "transformers": null},
     "swaps": [{"path": "layers.0.norm", "rule": "torch_rms_norm", "family": "norm",
                "before": "RMSNorm", "after": "RMSNorm"}],
     "compile": {"steps": [...], "compiled": ["layers.0", ...], "options": {...}},
     "dynamic_dims": {"input_ids": [0, 1]},
     "tensors": {"lm_head.weight": {"dtype": "float32", "shape": [512, 64], "file": "model.safetensors"}},
     "aliases": {"tok_embeddings.weight": "lm_head.weight"},
     "files": {"model.safetensors": 123456},
     "sha256": {"model.safetensors": "9f86d0..."},
     "report": {...} or null, "metadata": {...},
     "quantization": {"scheme": "int8", "torchao": "0.18.0", "tensors": {...}},
     "sharding": {"world_size": 8, "rank": 0, "gathered_with": "...", "dtensors": 290, "fsdp": true}}

`aliases` maps a state_dict key that was not written to the key holding the same tensor (tied
embeddings, shared modules): it is loaded from that tensor. `files` maps each weight file to its size
in bytes, and `sha256` each to its sha256 (hex), which `load()` checks unless given `verify=False` (a
manifest written before checksums were recorded has none: its files are checked by size and header
only). `quantization` (absent or null for an unquantized model) records the scheme given to
`deploy.quantize`, the torchao version, and per quantized key its subclass, outer dtype and shape, the
written keys of its parts and torchao's description of it (deploy/_quantized.py); a model quantized by
the kernel_pytorch backend has "backend": "kernel_pytorch" there, the group size and int4's packing,
and per layer its scheme, group size, float dtype and shape and the keys of its parts
(deploy/_packed.py). `sharding` (absent for a model saved whole) records that the model was sharded when
saved (FSDP, DTensor parameters): the full tensors were gathered onto rank `rank` of `world_size`
processes, which wrote them, so the files are a whole model's and load into an unsharded one as any save
does; `dtensors` counts the tensors gathered from DTensors and `fsdp` says whether the model held FSDP
modules.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

FORMAT = "kernel_pytorch.deploy"
FORMAT_VERSION = 2  # 2 adds `quantization`; a save without it is still written as 1
MANIFEST_NAME = "kernel_pytorch.json"
# the packages whose versions decide whether a saved model rebuilds the same way
PACKAGES: tuple[str, ...] = ("kernel_pytorch", "torch", "triton", "transformers")


class ManifestError(ValueError):
    """A manifest that cannot be read or is of a format this version does not know."""


def installed_versions() -> dict[str, str | None]:
    """package -> installed version (None where it is not installed), without importing the packages."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        if name == "kernel_pytorch":
            import kernel_pytorch

            out[name] = kernel_pytorch.__version__
        elif name == "torch":
            out[name] = torch.__version__
        else:
            out[name] = _version(name)
    return out


def _version(name: str) -> str | None:
    """The installed version of package `name` (None when it is not installed), without importing it."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module is not None else None
    if version is None:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = None
    return str(version) if version is not None else None


def dtype_name(dtype: torch.dtype) -> str:
    """"float32" for torch.float32."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """torch.float32 for "float32"; ManifestError for a name torch does not have."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ManifestError(f"unknown dtype {name!r} in the manifest")
    return dtype


@dataclass
class Manifest:
    """The manifest's content. `swaps` are the kept changes of `optimize()` as dicts (path, rule,
    family, before, after); `tensors` maps each written key to {"dtype", "shape", "file"}."""

    versions: dict[str, str | None] = field(default_factory=installed_versions)
    swaps: list[dict[str, str]] = field(default_factory=list)
    compile: dict[str, Any] = field(default_factory=dict)
    dynamic_dims: dict[str, list[int]] = field(default_factory=dict)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    sharding: dict[str, Any] | None = None  # how a sharded model's full tensors were gathered (module docstring)
    format_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        # readers of version 1 would miss the quantized keys: a quantized save is version 2, which they refuse
        version = max(self.format_version, 2 if self.quantization else 1)
        return {"format": FORMAT, "format_version": version, "versions": self.versions,
                "swaps": self.swaps, "compile": self.compile, "dynamic_dims": self.dynamic_dims,
                "tensors": self.tensors, "aliases": self.aliases, "files": self.files,
                "sha256": self.sha256, "report": self.report, "metadata": self.metadata,
                **({"quantization": self.quantization} if self.quantization else {}),
                **({"sharding": self.sharding} if self.sharding else {})}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST_NAME
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "the manifest") -> Manifest:
        """Check the format and version, then build; ManifestError says what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"{where} is not a kernel_pytorch manifest (no \"format\": \"{FORMAT}\")")
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise ManifestError(f"{where} has format version {version!r}; this kernel_pytorch "
                                f"({installed_versions()['kernel_pytorch']}) reads versions 1 to {FORMAT_VERSION}: "
                                "upgrade kernel_pytorch to load it")
        for key, kind in (("swaps", list), ("compile", dict), ("dynamic_dims", dict), ("tensors", dict),
                          ("aliases", dict), ("files", dict)):
            if key in data and not isinstance(data[key], kind):
                raise ManifestError(f"{where} has a malformed \"{key}\" (want a JSON "
                                    f"{'array' if kind is list else 'object'}, got {type(data[key]).__name__})")
        try:
            manifest = cls(versions=dict(data["versions"]), swaps=list(data["swaps"]), compile=dict(data["compile"]),
                           dynamic_dims={k: list(v) for k, v in data["dynamic_dims"].items()},
                           tensors=dict(data["tensors"]), aliases=dict(data["aliases"]), files=dict(data["files"]),
                           sha256=dict(data.get("sha256") or {}),
                           report=data.get("report"), metadata=dict(data.get("metadata") or {}),
                           quantization=_quantization(data.get("quantization"), where),
                           sharding=_sharding(data.get("sharding"), where), format_version=version)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ManifestError(f"{where} is malformed: {type(exc).__name__}: {exc}") from exc
        _check_entries(manifest, where)
        return manifest

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        """The manifest in `directory`; ManifestError when it is missing, not JSON or not ours."""
        path = Path(directory) / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(f"{directory} has no {MANIFEST_NAME}: not a model saved by kernel_pytorch.save "
                                "(a plain safetensors file loads with safetensors.torch.load_model)")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path} cannot be read as JSON: {exc}") from exc
        return cls.from_dict(data, str(path))


_SWAP_FIELDS = ("path", "rule", "before", "after")
_HEX = frozenset("0123456789abcdef")


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _check_entries(manifest: Manifest, where: str) -> None:
    """ManifestError naming the first entry of the wrong form: a swap without its path, rule, before and
    after (strings), a tensor without its dtype, shape and file, a file size or checksum of the wrong type,
    an alias or compiled path that is not a string."""
    for i, swap in enumerate(manifest.swaps):
        if not isinstance(swap, dict) or not all(isinstance(swap.get(f), str) for f in _SWAP_FIELDS):
            raise ManifestError(f"{where} has a malformed swap (entry {i} of \"swaps\": {swap!r}); each swap "
                                f"needs {', '.join(_SWAP_FIELDS)} as strings")
    for key, info in manifest.tensors.items():
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("file"), str)
                and isinstance(info.get("shape"), list) and all(isinstance(d, int) for d in info["shape"])):
            raise ManifestError(f"{where} has a malformed entry for tensor {key!r}: {info!r} "
                                "(want dtype and file as strings, shape as a list of ints)")
    for name, size in manifest.files.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError(f"{where} records the size of {name!r} as {size!r}, not a number of bytes")
    for name, digest in manifest.sha256.items():
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
            raise ManifestError(f"{where} records the sha256 of {name!r} as {digest!r}, not 64 hex digits")
    if not _is_str_map(manifest.aliases):
        raise ManifestError(f"{where} has malformed \"aliases\" (want key -> key, both strings)")
    compiled = manifest.compile.get("compiled", [])
    if not isinstance(compiled, list) or not all(isinstance(c, str) for c in compiled):
        raise ManifestError(f"{where} has a malformed \"compile\" (want \"compiled\" as a list of module paths)")
    if not isinstance(manifest.compile.get("options") or {}, dict):
        raise ManifestError(f"{where} has malformed compile options (want an object)")


def _quantization(value: Any, where: str) -> dict[str, Any] | None:
    if not value:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("tensors"), dict) or "scheme" not in value:
        raise ManifestError(f"{where} has a malformed \"quantization\" (want scheme, torchao, tensors)")
    return dict(value)


def _sharding(value: Any, where: str) -> dict[str, Any] | None:
    if not value:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("world_size"), int):
        raise ManifestError(f"{where} has a malformed \"sharding\" (want world_size, rank, gathered_with)")
    return dict(value)


def version_differences(manifest: Manifest, installed: dict[str, str | None] | None = None) -> list[str]:
    """One line per package whose installed version differs from the one the model was saved with,
    e.g. "torch: saved with 2.13.0, installed 2.11.0". Empty when everything matches."""
    installed = installed_versions() if installed is None else installed
    saved_with = dict(manifest.versions)
    if manifest.quantization and manifest.quantization.get("backend", "torchao") == "torchao":
        # torchao decides how its quantized weights are rebuilt
        saved_with["torchao"] = manifest.quantization.get("torchao")
        if "torchao" not in installed:
            installed = {**installed, "torchao": _version("torchao")}
    lines = []
    for name in sorted(set(saved_with) | set(installed)):
        saved, now = saved_with.get(name), installed.get(name)
        if saved != now:
            lines.append(f"{name}: saved with {saved or 'none'}, installed {now or 'none'}")
    return lines


def describe_differences(manifest: Manifest, installed: dict[str, str | None] | None = None) -> str:
    """`version_differences` as one message ("" when there are none): what differs and what it risks."""
    lines = version_differences(manifest, installed)
    if not lines:
        return ""
    return ("the saved model was written with other versions than those installed:\n  " + "\n  ".join(lines)
            + "\nthe weights load the same; the swapped modules and compiled code come from the installed versions")


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "ManifestError", "describe_differences",
           "dtype_from_name", "dtype_name", "installed_versions", "version_differences"]
