"""kernel_pytorch's own weight-only quantization in a model (`deploy.quantize(..., backend="kernel_pytorch")`):
nn.Linear layers swapped for `nn.QuantizedLinear`, whose parts (`qweight`, `scale`, `zero`) are plain
tensors in the state dict, so safetensors writes them as they are. The manifest's `quantization` block
says which Linear each set of parts stands for and how they are laid out:

    {"scheme": "int4", "backend": "kernel_pytorch", "group_size": 128, "packing": "<INT4_PACKING>",
     "tensors": {"layers.0.mlp.down_proj.weight": {
         "type": "QuantizedLinear", "scheme": "int4", "group_size": 128, "dtype": "bfloat16",
         "shape": [2048, 5632], "parts": {"qweight": "layers.0.mlp.down_proj.qweight",
                                          "scale": "layers.0.mlp.down_proj.scale",
                                          "zero": "layers.0.mlp.down_proj.zero"}}}}

`dtype` and `shape` are the float weight's (what the model's state dict holds before quantization), so
`load` checks the saved model against a freshly built one as for any other save; it then puts an empty
QuantizedLinear at each recorded path and loads the parts into it (no quantization on load).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from kernel_pytorch.deploy._files import LoadError
from kernel_pytorch.deploy.manifest import dtype_from_name, dtype_name
from kernel_pytorch.nn.quant_linear import QuantizedLinear
from kernel_pytorch.reference.quant_matmul import INT4_PACKING, SCHEMES, part_shapes

BACKEND = "kernel_pytorch"
DEFAULT_GROUP = 128  # int4's group size when none is given (Llama-class weights: 4096, 14336 inputs)
_FIELDS = ("type", "scheme", "dtype", "shape", "parts")


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, name = path.rpartition(".")
    return (model.get_submodule(parent) if parent else model), name


def swap_linears(model: nn.Module, scheme: str, group_size: int | None,
                 filter_fn: Callable[[nn.Module, str], bool] | None) -> nn.Module:
    """Replace each nn.Linear of `model` that `filter_fn(module, fqn)` accepts (default: every one) by
    `QuantizedLinear.from_linear`, in place (a module shared under several names stays shared); returns
    the model, or the new layer when `model` itself is the Linear."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    group = DEFAULT_GROUP if group_size is None else group_size
    made: dict[int, QuantizedLinear] = {}
    wanted = [(path, m) for path, m in model.named_modules(remove_duplicate=False)
              if isinstance(m, nn.Linear) and (filter_fn is None or filter_fn(m, path))]
    for path, module in wanted:
        if id(module) not in made:
            try:
                made[id(module)] = QuantizedLinear.from_linear(module, scheme, group)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"cannot quantize {path or 'the model'!r} with {scheme}: {exc}") from exc
        if not path:
            return made[id(module)]
        parent, name = _parent(model, path)
        setattr(parent, name, made[id(module)])
    return model


def quantized_modules(model: nn.Module) -> dict[str, QuantizedLinear]:
    """{path: layer} of every QuantizedLinear in `model`, each name of a shared one."""
    return {p: m for p, m in model.named_modules(remove_duplicate=False) if isinstance(m, QuantizedLinear)}


def describe(model: nn.Module, recorded: str | None = None) -> dict[str, Any] | None:
    """The manifest's `quantization` block for `model`'s QuantizedLinear layers (None without any).
    recorded: the scheme deploy.quantize recorded (else the layers' one scheme, or "mixed")."""
    layers = quantized_modules(model)
    if not layers:
        return None
    tensors = {}
    seen: set[int] = set()
    for path, layer in layers.items():
        if id(layer) in seen:  # a layer under several names: its parts are written once (aliases)
            continue
        seen.add(id(layer))
        prefix = f"{path}." if path else ""
        tensors[f"{prefix}weight"] = {
            "type": "QuantizedLinear", "scheme": layer.scheme, "group_size": layer.group_size,
            "dtype": dtype_name(layer.dtype), "shape": [layer.out_features, layer.in_features],
            "parts": {name: f"{prefix}{name}" for name in layer.parts()}}
    schemes = {e["scheme"] for e in tensors.values()}
    groups = {e["group_size"] for e in tensors.values() if e["group_size"]}
    return {"scheme": recorded or (schemes.pop() if len(schemes) == 1 else "mixed"), "backend": BACKEND,
            "group_size": groups.pop() if len(groups) == 1 else None,
            "packing": INT4_PACKING if "int4" in {e["scheme"] for e in tensors.values()} else None,
            "tensors": tensors}


def _expected_parts(key: str, entry: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The parts' shapes and dtypes an entry implies (LoadError naming the key for a malformed one)."""
    if not isinstance(entry, dict) or any(f not in entry for f in _FIELDS) or not isinstance(entry["parts"], dict):
        raise LoadError(f"quantized tensor {key!r}: the manifest's entry is malformed (want {', '.join(_FIELDS)})")
    try:
        n, k = (int(d) for d in entry["shape"])
        return part_shapes(entry["scheme"], n, k, entry.get("group_size") or DEFAULT_GROUP,
                           dtype_from_name(entry["dtype"]))
    except (TypeError, ValueError) as exc:
        raise LoadError(f"quantized tensor {key!r}: {exc}") from exc


def check_parts(manifest_tensors: Mapping[str, Any], quantized: Mapping[str, Any]) -> None:
    """Every entry well formed, its parts written with the shapes and dtypes its scheme gives; LoadError
    naming the key otherwise."""
    for key, entry in quantized.items():
        want = _expected_parts(key, entry)
        if set(entry["parts"]) != set(want):
            raise LoadError(f"quantized tensor {key!r} lists parts {sorted(entry['parts'])}, its scheme "
                            f"{entry['scheme']} has {sorted(want)}")
        for part, written in entry["parts"].items():
            info = manifest_tensors.get(written)
            if info is None:
                raise LoadError(f"quantized tensor {key!r}: its part {part!r} ({written!r}) is not in the saved files")
            shape, dtype = want[part]
            if tuple(info["shape"]) != shape or info["dtype"] != dtype_name(dtype):
                raise LoadError(f"quantized tensor {key!r}: part {part!r} is saved as {info['dtype']} "
                                f"{list(info['shape'])}, its scheme gives {dtype_name(dtype)} {list(shape)}")


def _layer_path(key: str) -> str:
    return key.removesuffix("weight").removesuffix(".")


def logical_aliases(aliases: Mapping[str, str], quantized: Mapping[str, Any]) -> dict[str, str]:
    """The saved aliases as the float model's state dict sees them: a part of a layer written under
    another name (`b.qweight` -> `a.qweight`, one layer shared by two paths) becomes `b.weight` ->
    `a.weight`; other aliases are kept."""
    owner = {written: (key, part) for key, e in quantized.items() for part, written in e["parts"].items()}
    out: dict[str, str] = {}
    for alias, target in aliases.items():
        if target in owner:
            key, part = owner[target]
            layer = alias.removesuffix(part).removesuffix(".")
            out[f"{layer}.weight" if layer else "weight"] = key
        else:
            out[alias] = target
    return out


def check_model(model: nn.Module, quantized: Mapping[str, Any]) -> None:
    """Each recorded path of `model` holds an nn.Linear (or a QuantizedLinear of the recorded scheme,
    a model loaded before) of the recorded shape; LoadError naming the path otherwise."""
    for key, entry in quantized.items():
        path = _layer_path(key)
        try:
            module = model.get_submodule(path)
        except AttributeError as exc:
            raise LoadError(f"the saved model quantized {path!r}, which this model does not have: {exc}") from exc
        n, k = entry["shape"]
        if isinstance(module, QuantizedLinear):
            if (module.scheme, module.group_size) != (entry["scheme"], entry.get("group_size")):
                raise LoadError(f"{path!r} is already quantized with {module.scheme}, the saved model with "
                                f"{entry['scheme']}")
        elif not isinstance(module, nn.Linear):
            raise LoadError(f"the saved model quantized {path!r} as a Linear; this model has a {type(module).__name__}")
        if (module.out_features, module.in_features) != (n, k):
            raise LoadError(f"{path!r} maps {module.in_features} -> {module.out_features} features, the saved "
                            f"layer {k} -> {n}")


def swap_in(model: nn.Module, quantized: Mapping[str, Any]) -> None:
    """Put an empty QuantizedLinear (the recorded scheme and group, the Linear's device and dtype) at each
    recorded path that holds an nn.Linear, and at every other name of that Linear (one layer for all)."""
    paths: dict[int, list[str]] = {}
    for p, m in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(p)
    for key, entry in quantized.items():
        module = model.get_submodule(_layer_path(key))
        if isinstance(module, QuantizedLinear):
            continue
        layer = QuantizedLinear(module.in_features, module.out_features, module.bias is not None,
                                scheme=entry["scheme"], group_size=entry.get("group_size") or DEFAULT_GROUP,
                                device=module.weight.device, dtype=dtype_from_name(entry["dtype"]))
        for path in paths[id(module)]:
            parent, name = _parent(model, path)
            setattr(parent, name, layer)
