"""The files of a saved model: their names (one `model.safetensors`, or shards and the index HF
writes), shard sizes, their sha256 and permission bits, reading and checking safetensors headers without
reading the data, and the refusal of pickle checkpoints. Errors here name the file and the tensor."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path

import torch

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# safetensors' dtype codes (the header's "dtype") -> torch dtypes; fp8 where this torch has it
_CODES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "C64": "complex64",
}


class LoadError(ValueError):
    """A saved model that cannot be loaded as asked: missing, truncated or corrupted files, keys,
    shapes or dtypes that do not match the model, unknown rules. Raised before the model is changed."""


class PickleRefusedError(LoadError):
    """A pickle-based checkpoint (torch.save, .bin/.pt/.pth): kernel_pytorch never unpickles."""


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes in `size`: an int, or "5GB", "500MB", "64KiB" (decimal and binary units, as HF takes)."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"max_shard_size {size!r}: give bytes (int) or a size like '5GB', '500MB', '64KiB'")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive (got {size!r})")
    return value


def shard_names(count: int) -> list[str]:
    """["model.safetensors"] for one file, else HF's "model-00001-of-00003.safetensors" ..."""
    if count == 1:
        return [WEIGHTS_NAME]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def is_weight_file(name: str) -> bool:
    """Whether `name` is one of the file names `save` writes (so a new save may replace it)."""
    return name in (WEIGHTS_NAME, INDEX_NAME) or bool(_SHARD.match(name))


def write_index(directory: Path, weight_map: dict[str, str], total_size: int) -> Path:
    """`model.safetensors.index.json` as HF writes it: {"metadata": {"total_size"}, "weight_map"}."""
    path = directory / INDEX_NAME
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path.write_text(json.dumps(index, indent=2) + "\n")
    return path


def sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path]) -> dict[str, str]:
    """{file name: hex sha256} of `paths`, hashed in parallel threads (hashlib releases the GIL while it
    hashes), so the shards of a large checkpoint take about the time of the largest one."""
    if len(paths) <= 1:
        return {p.name: sha256(p) for p in paths}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return dict(zip((p.name for p in paths), pool.map(sha256, paths)))


def umask_mode(directory: Path) -> int:
    """The permission bits `open()` gives a new file in `directory` (0o644 under a umask of 022), found by
    creating and removing an empty file there: the process umask is read without changing it."""
    probe = directory / f".kernel_pytorch-mode-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
        probe.unlink()


def _looks_pickled(path: Path) -> bool:
    """A torch.save zip archive ("PK\\x03\\x04") or a bare pickle (protocol 2+ starts with 0x80)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def _refusal(path: Path) -> PickleRefusedError:
    return PickleRefusedError(
        f"{path} is a pickle-based checkpoint (torch.save / .bin / .pt / .pth): kernel_pytorch never "
        "unpickles, since unpickling runs arbitrary code. If you trust the file, convert it once with "
        f"`kernel-pytorch convert {path} OUT_DIR` (or kernel_pytorch.deploy.convert), then load OUT_DIR")


def refuse_pickle(path: Path, manifest_name: str) -> None:
    """Raise PickleRefusedError when `path` is a pickle checkpoint (by its suffix or its first bytes),
    or a directory without `manifest_name` holding one (an HF `pytorch_model.bin` directory)."""
    if path.is_file():
        if path.suffix.lower() in PICKLE_SUFFIXES or _looks_pickled(path):
            raise _refusal(path)
        return
    if path.is_dir() and not (path / manifest_name).exists():
        pickles = sorted(p for p in path.iterdir() if p.is_file() and (
            p.suffix.lower() in PICKLE_SUFFIXES or (p.suffix == ".safetensors" and _looks_pickled(p))))
        if pickles:
            raise _refusal(pickles[0])


def torch_dtype(code: str, where: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype code ("BF16")."""
    name = _CODES.get(code)
    dtype = getattr(torch, name, None) if name else None
    if not isinstance(dtype, torch.dtype):
        raise LoadError(f"{where}: dtype {code} has no torch dtype here")
    return dtype


def read_header(path: Path, expected_size: int | None) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """{tensor name: (dtype, shape)} from a safetensors file's header, reading no tensor data.

    Checks, in order, that the file exists, has the size the manifest recorded (a truncated or
    appended file fails here), and that safetensors accepts its header (which also checks that the
    tensors' byte ranges cover the file exactly). Raises LoadError naming the file.
    """
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise LoadError(f"weight file {path} is missing")
    if _looks_pickled(path):
        raise _refusal(path)
    size = os.path.getsize(path)
    if expected_size is not None and size != expected_size:
        why = "truncated" if size < expected_size else "longer than written"
        raise LoadError(f"weight file {path} is {size} bytes, the manifest says {expected_size}: the file is {why}")
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():
                part = f.get_slice(name)
                out[name] = (torch_dtype(part.get_dtype(), f"{path}: tensor {name!r}"), tuple(part.get_shape()))
            return out
    except LoadError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoadError(f"weight file {path} is corrupted or not safetensors: {exc}") from exc


__all__ = ["INDEX_NAME", "WEIGHTS_NAME", "LoadError", "PickleRefusedError", "is_weight_file", "parse_size",
           "read_header", "refuse_pickle", "sha256", "sha256_files", "shard_names", "torch_dtype", "umask_mode",
           "write_index"]
