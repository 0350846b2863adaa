"""`save(model, path)`: the weights as safetensors (one file, or shards with HF's index) and the
manifest of what `optimize()` changed, so `load()` rebuilds the optimized model without pickle.

Tied and shared tensors are written once: a state_dict key whose tensor is the same view of the same
storage as an earlier key's is recorded in the manifest's `aliases` and not written (safetensors refuses
tensors sharing memory). Distinct views of one storage (rare: a slice of another parameter) are written
as copies each, and load back into the model's own views.

Quantized weights (torchao's tensor subclasses, from `deploy.quantize`) are split into their plain
parts with torchao's safetensors support, and the manifest records the scheme, the torchao version and
how to put each one back together (deploy/_quantized.py); torchao is imported only then. The parts of
kernel_pytorch's QuantizedLinear layers are plain tensors already; the manifest records which Linear
each layer stands for, its scheme, group size and packing (deploy/_packed.py).

A sharded model (FSDP, DTensor parameters) is saved by every rank calling `save`: the full tensors are
gathered onto rank 0, which writes them and records how in the manifest's `sharding` (deploy/_sharded.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from kernel_pytorch.deploy import _packed, _quantized, _sharded
from kernel_pytorch.deploy._files import (
    INDEX_NAME,
    is_weight_file,
    parse_size,
    sha256_files,
    shard_names,
    umask_mode,
    write_index,
)
from kernel_pytorch.deploy.manifest import MANIFEST_NAME, Manifest, dtype_name
from kernel_pytorch.optimize.options import CompileOptions, typed

if TYPE_CHECKING:
    from kernel_pytorch.optimize.report import OptimizeReport

DEFAULT_MAX_SHARD_SIZE = "5GB"


def plain_tensors(state: Mapping[str, Any]) -> dict[str, Tensor]:
    """`state`'s values as plain dense tensors (detached), or a TypeError naming the first key that is
    not one: a tensor subclass (split torchao's quantized tensors with `_quantized.flatten` first), a
    sparse or meta tensor, a non-tensor."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"state_dict entry {key!r} is a {type(value).__name__}, not a tensor: "
                            "safetensors stores tensors only")
        t = value.detach()
        if type(t) is not Tensor:
            raise TypeError(f"tensor {key!r} is a {type(t).__module__}.{type(t).__name__} (a tensor subclass, "
                            "e.g. a quantized weight) that safetensors cannot hold")
        if t.layout != torch.strided:
            raise TypeError(f"tensor {key!r} has layout {t.layout}: only dense (strided) tensors can be saved")
        if t.is_meta:
            raise TypeError(f"tensor {key!r} is on the meta device (not materialised): nothing to save")
        out[key] = t
    return out


def _view_key(t: Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def dedupe(tensors: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors to write, aliases): a key whose tensor is the same view of the same storage as an
    earlier key's becomes an alias of that key; distinct views sharing one storage are copied, since
    safetensors refuses shared memory."""
    first: dict[tuple, str] = {}
    kept: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for key, t in tensors.items():
        if t.numel() == 0:  # empty tensors may all report data_ptr 0: never aliases
            kept[key] = t
            continue
        view = _view_key(t)
        if view in first:
            aliases[key] = first[view]
        else:
            first[view] = key
            kept[key] = t
    by_storage: dict[tuple, list[str]] = {}
    for key, t in kept.items():
        if t.numel():
            by_storage.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(key)
    for keys in by_storage.values():
        if len(keys) > 1:
            for key in keys:
                kept[key] = kept[key].clone()
    return kept, aliases


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def plan_shards(tensors: Mapping[str, Tensor], max_bytes: int) -> list[list[str]]:
    """Keys grouped into files in state_dict order, a new file when the next tensor would take the
    current one past `max_bytes` (a tensor larger than that gets a file of its own), as HF shards."""
    shards: list[list[str]] = [[]]
    size = 0
    for key, t in tensors.items():
        n = _nbytes(t)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n
    return shards


def save_state_dict(
    state: Mapping[str, Any],
    path: str | Path,
    *,
    manifest: Manifest | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    scheme: str | None = None,
    packed: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write `state` (name -> tensor) to the directory `path` as safetensors, with the manifest.

    Args:
        state: a state_dict; tensors on any device, any dtype safetensors knows (fp32/bf16/fp16 ...),
            and torchao's quantized tensors (split into their plain parts; needs torchao).
        path: the directory (created); weight files of an earlier save there are replaced.
        manifest: the manifest to complete with the tensors, aliases and files (a new one if None).
        max_shard_size: bytes per file (int, or "5GB", "500MB"); more data gives shards plus the index.
        scheme: the `deploy.quantize` scheme of the quantized tensors, for the manifest (None: inferred
            from their type).
        packed: the manifest's `quantization` block of a model quantized by the kernel_pytorch backend
            (deploy/_packed.py's `describe`), whose parts are plain tensors of `state`.
    Returns:
        the files written, the manifest last.
    Raises:
        TypeError: an entry that is neither a plain dense tensor nor a quantized tensor torchao can split.
        ImportError: quantized tensors and no torchao (the message says how to install it).
    """
    from safetensors.torch import save_file

    directory = Path(path)
    quantized: dict[str, dict] = {}
    q_aliases: dict[str, str] = {}
    if any(_quantized.is_subclass(v) for v in state.values()):
        if packed:
            raise TypeError("the model holds torchao's quantized tensors and kernel_pytorch's QuantizedLinear "
                            "layers: save one backend's quantization per model")
        state, quantized, q_aliases = _quantized.flatten(state)
    tensors, aliases = dedupe(plain_tensors(state))
    aliases.update(q_aliases)
    groups = plan_shards(tensors, parse_size(max_shard_size))
    names = shard_names(len(groups))
    manifest = manifest if manifest is not None else Manifest()
    manifest.aliases = aliases
    manifest.quantization = None
    if quantized:
        manifest.quantization = {"scheme": _quantized.scheme_of(scheme, {v["type"] for v in quantized.values()}),
                                 "torchao": _quantized.torchao_version(), "tensors": quantized}
    elif packed:
        manifest.quantization = dict(packed)
    manifest.tensors, manifest.files, manifest.sha256 = {}, {}, {}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_NAME).unlink(missing_ok=True)  # no manifest names half-written files
    mode = umask_mode(directory)
    written: list[Path] = []
    for name, keys in zip(names, groups, strict=True):
        shard = {k: tensors[k].to("cpu").contiguous() for k in keys}
        file = directory / name
        save_file(shard, str(file), metadata={"format": "pt", **_quantized.file_metadata(quantized, keys)})
        file.chmod(mode)  # safetensors writes 0600 whatever the umask; the other files follow the umask
        written.append(file)
        manifest.files[name] = file.stat().st_size
        for k in keys:
            manifest.tensors[k] = {"dtype": dtype_name(shard[k].dtype), "shape": list(shard[k].shape), "file": name}
        del shard
    manifest.sha256 = sha256_files(written)
    if len(names) > 1:
        weight_map = {k: v["file"] for k, v in manifest.tensors.items()}
        total = sum(_nbytes(t) for t in tensors.values())
        written.append(write_index(directory, weight_map, total))
    keep = {p.name for p in written}
    for old in directory.iterdir():
        if old.is_file() and is_weight_file(old.name) and old.name not in keep:
            old.unlink()  # shards of an earlier save with another count, or its index
    written.append(manifest.write(directory))
    return written


def _compiled_paths(model: nn.Module) -> list[str]:
    """Paths of the submodules compiled in place with `nn.Module.compile` (regional compilation), named as
    in the model before wrappers (activation checkpointing's, FSDP1's) were put around its modules."""
    paths = [p for p, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]
    return list(dict.fromkeys(_sharded.plain_path(p) for p in paths))


def _json_able(value: Any, what: str) -> Any:
    try:
        json.dumps(value)
    except TypeError as exc:
        raise TypeError(f"{what} must be JSON-able to go in the manifest: {exc}") from exc
    return value


def save(
    model: nn.Module,
    path: str | Path,
    *,
    report: OptimizeReport | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    compile_options: CompileOptions | None = None,
    dynamic_dims: Mapping[str, list[int]] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Save `model` (optimized or not) to the directory `path` without pickle.

    Writes `model.safetensors` (or `model-0000i-of-0000n.safetensors` shards and
    `model.safetensors.index.json` when the weights pass `max_shard_size`) and `kernel_pytorch.json`,
    the manifest: the swaps `report` lists as kept, the blocks compiled in place and `compile_options`,
    `dynamic_dims`, the versions, each tensor's dtype, shape and file, each file's size and sha256, and the
    tied keys (written once). Every file gets the permission bits of the process umask (0644 under 022).
    The weights are under the model's state_dict keys, which `optimize()` keeps, so they also load
    into the original architecture (`kernel_pytorch.load`, or `safetensors.torch.load_model` per file).

    Args:
        model: the model, on any device, in any dtype (fp32, bf16, fp16, mixed); a `torch.compile`
            wrapper is saved through its `_orig_mod` (its own state_dict keys).
        path: a directory, created if needed; an earlier save there is replaced.
        report: what `optimize()` returned with the model; None records no swaps (load then loads the
            weights into the model as the factory builds it).
        max_shard_size: the most bytes per weight file (int, or "5GB", "500MB").
        compile_options: the `CompileOptions` given to optimize() (a backend by name, so JSON-able).
        dynamic_dims: input name -> dims that vary (e.g. {"input_ids": [0, 1]}), for export and compile;
            None takes `report.dynamic_dims` (what optimize() found from its `extra_inputs`).
        metadata: anything JSON-able to keep with the model (e.g. {"factory": "model.py:make"}).
    Returns:
        the paths written, the manifest last ([] on the ranks other than 0 of a sharded model).
    A sharded model (under FSDP's `fully_shard`, or holding DTensor parameters) is saved by calling `save`
    on every rank: the full tensors are gathered onto rank 0's CPU memory (torch.distributed.checkpoint's
    `get_model_state_dict` with `full_state_dict=True, cpu_offload=True`), rank 0 writes them and the
    manifest's `sharding` (world size, how they were gathered), and every rank returns once it has. The
    files are a whole model's: they load into the unsharded model (`load`), or back into a sharded one
    (`load` on every rank). Rank 0 must hold the whole model in CPU memory; for checkpoints of training
    (each rank writing its shards, the optimizer state) use torch.distributed.checkpoint (docs/deploy.md).
    A model quantized with `kernel_pytorch.deploy.quantize` (int8, fp8 weight-only) is saved with its
    quantized weights split into plain tensors (torchao's safetensors support) and the scheme and the
    torchao version in the manifest; `load` quantizes the rebuilt model the same way before loading them.
    One quantized with backend="kernel_pytorch" is saved with its QuantizedLinear parts as they are and
    the scheme, group size and packing of each layer in the manifest; `load` puts empty layers at those
    paths and loads the parts into them.

    Raises:
        TypeError: a state_dict entry that safetensors cannot hold (a tensor subclass torchao cannot
            split), compile_options that is not a CompileOptions, or options that are not JSON-able (a
            backend given as a callable).
        ImportError: the model holds quantized tensors and torchao is not installed.
    """
    compile_options = typed(compile_options, CompileOptions, "compile_options")
    if isinstance(getattr(model, "_orig_mod", None), nn.Module):
        model = model._orig_mod  # torch.compile(model)'s wrapper: save the model's own keys
    if _sharded.is_sharded(model):
        return _save_sharded(model, path, report, max_shard_size, compile_options, dynamic_dims, metadata)
    return _save(model, model.state_dict(), path, report, max_shard_size, compile_options, dynamic_dims, metadata)


def _save_sharded(model: nn.Module, path: str | Path, *args: Any) -> list[Path]:
    """`save` of a sharded model on every rank: gathered onto rank 0, which writes (module docstring); the
    files written on rank 0, [] on the others, where it returns once rank 0 has written."""
    state, record = _sharded.gather(model)
    written: list[Path] = []
    failure: BaseException | None = None
    if _sharded.rank() == 0:
        try:
            written = _save(model, state, path, *args, sharding=record)
        except Exception as exc:  # every rank hears of it before it is raised (a rank waiting would hang)
            failure = exc
    _sharded.agree(failure is None, f"kernel_pytorch.save to {path}")
    if failure is not None:
        raise failure
    return written


def _save(model: nn.Module, state: Mapping[str, Any], path: str | Path, report: OptimizeReport | None,
          max_shard_size: int | str, compile_options: CompileOptions | None,
          dynamic_dims: Mapping[str, list[int]] | None, metadata: Mapping[str, Any] | None,
          sharding: dict[str, Any] | None = None) -> list[Path]:
    """`save` of `state`, the state_dict of `model` (compiled paths read from it)."""
    if any(_quantized.is_subclass(v) for v in state.values()):
        _quantized.check_can_save(state)  # torchao installed, the subclasses ones it can split
    plain_tensors({k: v for k, v in state.items() if not _quantized.is_subclass(v)})  # before writing anything
    swaps = []
    if report is not None:
        swaps = [{"path": c.path, "rule": c.rule, "family": c.family, "before": c.before, "after": c.after or ""}
                 for c in report.applied()]
    compiled = _compiled_paths(model)
    if dynamic_dims is None and report is not None:
        dynamic_dims = getattr(report, "dynamic_dims", None)  # what optimize()'s mark_dynamic step kept
    manifest = Manifest(
        swaps=swaps,
        compile={"steps": [s.to_dict() for s in report.compile_steps] if report is not None else [],
                 "compiled": compiled,
                 "options": _json_able(compile_options.kwargs() if compile_options else {}, "compile_options")},
        dynamic_dims={k: [int(d) for d in v] for k, v in (dynamic_dims or {}).items()},
        report=json.loads(report.to_json()) if report is not None else None,
        metadata=_json_able(dict(metadata or {}), "metadata"),
        sharding=sharding,
    )
    scheme = getattr(model, _quantized.SCHEME_ATTR, None)
    return save_state_dict(state, path, manifest=manifest, max_shard_size=max_shard_size, scheme=scheme,
                           packed=_packed.describe(model, scheme))


__all__ = ["DEFAULT_MAX_SHARD_SIZE", "INDEX_NAME", "dedupe", "plain_tensors", "plan_shards", "save",
           "save_state_dict"]
