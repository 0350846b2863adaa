"""A saved model's directory as `load` finds it: where it is, its manifest (with a word on versions that
differ from those installed), and its weight files checked against the manifest (names, sizes, headers,
the tensors each holds, sha256) before anything is read into a model. Errors are `LoadError`s naming the
file or tensor."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

from kernel_pytorch.deploy._files import INDEX_NAME, LoadError, read_header, refuse_pickle, sha256_files
from kernel_pytorch.deploy.manifest import MANIFEST_NAME, Manifest, ManifestError, describe_differences, dtype_name

log = logging.getLogger("kernel_pytorch.deploy.loading")  # load's logger: these are its lines
SHOWN = 8  # names listed in an error before "... (N in all)"


def names(names: Sequence[str]) -> str:
    names = sorted(names)
    more = f", ... ({len(names)} in all)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def find_directory(path: str | Path) -> Path:
    """The saved model's directory from `path` (the directory, its manifest or one of its weight files)."""
    path = Path(path)
    if not path.exists():
        raise LoadError(f"{path} does not exist")
    refuse_pickle(path, MANIFEST_NAME)
    if path.is_file():
        if path.name == MANIFEST_NAME or path.suffix == ".safetensors" or path.name == INDEX_NAME:
            return path.parent
        raise LoadError(f"{path} is not a saved model: give the directory kernel_pytorch.save wrote")
    return path


def manifest_of(directory: Path, strict_versions: bool, stacklevel: int) -> Manifest:
    """The manifest in `directory`; versions that differ from those installed raise (`strict_versions`) or
    warn, the warning pointing `stacklevel` frames up."""
    try:
        manifest = Manifest.read(directory)
    except ManifestError as exc:
        raise LoadError(str(exc)) from exc
    differences = describe_differences(manifest)
    if differences:
        if strict_versions:
            raise LoadError(differences)
        warnings.warn(differences, stacklevel=stacklevel + 1)
    return manifest


def check_files(directory: Path, manifest: Manifest, verify: bool) -> None:
    """Every weight file against the manifest: its name, size, header and tensors, and (`verify`) its
    sha256."""
    _headers(directory, manifest)
    if verify:
        _verify(directory, manifest)


def _headers(directory: Path, manifest: Manifest) -> None:
    """Check every weight file against the manifest: size, header, and the tensors each holds."""
    for name in manifest.files:
        if Path(name).name != name or name in ("", ".", ".."):
            raise LoadError(f"the manifest lists weight file {name!r}, which is not a file name in {directory}")
    listed: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {f: {} for f in manifest.files}
    for key, info in manifest.tensors.items():
        if info.get("file") not in listed:
            raise LoadError(f"the manifest puts tensor {key!r} in {info.get('file')!r}, a file it does not list")
        listed[info["file"]][key] = (info["dtype"], tuple(info["shape"]))
    for name, size in manifest.files.items():
        path = directory / name
        header = read_header(path, size)
        found = {k: (dtype_name(d), s) for k, (d, s) in header.items()}
        missing, extra = set(listed[name]) - set(found), set(found) - set(listed[name])
        if missing or extra:
            raise LoadError(f"weight file {path} does not hold what the manifest lists: "
                            + "; ".join(f"{what}: {names(ks)}" for what, ks in
                                        (("missing", missing), ("not listed", extra)) if ks))
        for key, want in listed[name].items():
            if found[key] != want:
                raise LoadError(f"tensor {key!r} in {path} is {found[key][0]} {list(found[key][1])}, "
                                f"the manifest says {want[0]} {list(want[1])}")


def _verify(directory: Path, manifest: Manifest) -> None:
    """Each weight file's sha256 against the one the manifest records (a manifest written before they
    were recorded has none, and is checked by size and header only)."""
    if not manifest.sha256:
        log.info("%s records no checksums (saved before they were recorded): files checked by size and header",
                 directory / MANIFEST_NAME)
        return
    unrecorded = sorted(set(manifest.files) - set(manifest.sha256))
    if unrecorded:
        raise LoadError(f"the manifest records no sha256 for {names(unrecorded)}")
    digests = sha256_files([directory / name for name in manifest.files])
    for name, found in digests.items():
        if found != manifest.sha256[name]:
            raise LoadError(f"weight file {directory / name} has sha256 {found[:16]}..., the manifest records "
                            f"{manifest.sha256[name][:16]}...: the file changed after it was saved (a damaged "
                            "copy or disk, or an edit)")


__all__ = ["SHOWN", "check_files", "find_directory", "manifest_of", "names"]
