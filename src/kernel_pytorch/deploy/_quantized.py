"""Quantized weights (torchao tensor subclasses) in a saved model: split into plain tensors for
safetensors on save, put back together and checked against a freshly quantized model on load.

torchao's `flatten_tensor_state_dict` turns an `Int8Tensor` / `Float8Tensor` ... into its plain parts
(`qdata`, `scale`, ...) under the keys `<module>._<name>_<part>` plus a JSON description of the
subclass (its type and attributes); `unflatten_tensor_state_dict` rebuilds it. The manifest's
`quantization` block keeps, per quantized key, that description, the outer dtype and shape and the
written key of each part:

    {"scheme": "int8", "torchao": "0.18.0",
     "tensors": {"lm_head.weight": {"type": "Int8Tensor", "dtype": "bfloat16", "shape": [512, 64],
                                    "parts": {"qdata": "lm_head._weight_qdata", ...},
                                    "torchao": "{\\"_type\\": \\"Int8Tensor\\", ...}"}}}

torchao is imported only when a state dict holds a subclass or a manifest has this block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from kernel_pytorch.deploy._files import LoadError
from kernel_pytorch.deploy.manifest import _version, dtype_name
from kernel_pytorch.validation.runs import bitwise_equal

INSTALL_HINT = "pip install 'kernel-pytorch[quant]'"
SCHEME_ATTR = "_kernel_pytorch_quant_scheme"  # set on the model by deploy.quantize()
# the subclass torchao's weight-only configs give, per scheme (for models quantized with quantize_ directly)
_SCHEME_OF_TYPE = {"Int8Tensor": "int8", "Float8Tensor": "fp8", "Int4Tensor": "int4"}
_PREFIX = "q."  # torchao's names need a module path before the last dot: a top-level "weight" gets one


def is_subclass(value: Any) -> bool:
    """Whether `value` is a tensor of a subclass (not a plain tensor or Parameter)."""
    return isinstance(value, Tensor) and type(value.detach()) is not Tensor


def _torchao() -> Any:
    """The torchao.quantization module, or ImportError with the install command."""
    try:
        import torchao.quantization as q
    except ImportError as exc:
        raise ImportError(f"quantization needs torchao: {INSTALL_HINT}") from exc
    return q


def torchao_support() -> Any:
    """torchao's safetensors support module; ImportError with the install command without torchao."""
    _torchao()  # ImportError with the install command when torchao is missing
    from torchao.prototype.safetensors import safetensors_support

    return safetensors_support


def torchao_version() -> str | None:
    return _version("torchao")


def check_can_save(state: Mapping[str, Any]) -> None:
    """TypeError for a subclass that is not one of torchao's quantized tensors (checked without torchao),
    then ImportError without torchao."""
    kinds = {key: type(value.detach()) for key, value in state.items() if is_subclass(value)}
    for key, kind in kinds.items():
        if not kind.__module__.startswith("torchao."):
            raise TypeError(f"tensor {key!r} is a {kind.__module__}.{kind.__name__} (a tensor subclass): save "
                            "splits torchao's quantized tensors only, safetensors holds plain tensors")
    allowed = set(getattr(torchao_support(), "ALLOWED_TENSORS_SUBCLASSES", ()))
    for key, kind in kinds.items():
        if allowed and kind.__name__ not in allowed:
            raise TypeError(f"tensor {key!r} is a {kind.__module__}.{kind.__name__}, which torchao's safetensors "
                            f"support cannot split (it knows {', '.join(sorted(allowed))})")


def scheme_of(recorded: str | None, kinds: set[str]) -> str:
    """The scheme `deploy.quantize` recorded on the model, else the one the subclasses' types imply."""
    if isinstance(recorded, str):
        return recorded
    schemes = {_SCHEME_OF_TYPE.get(k) for k in kinds}
    if len(schemes) != 1 or None in schemes:
        raise TypeError(f"the model holds quantized tensors of types {sorted(kinds)}: save supports models "
                        "quantized with kernel_pytorch.deploy.quantize (int8, fp8, int4 weight-only)")
    return schemes.pop()  # type: ignore[return-value]


def _parts_key(t: Tensor) -> tuple:
    """What makes two subclass tensors the same weight: their type and each part's storage and view."""
    attrs, _ = t.__tensor_flatten__()
    parts = [getattr(t, a) for a in attrs]
    return (type(t), *((p.device, p.untyped_storage().data_ptr(), p.storage_offset(), tuple(p.shape), p.stride(),
                        p.dtype) for p in parts if isinstance(p, Tensor)))


def flatten(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, str]]:
    """(the state with each subclass tensor replaced by its plain parts, the manifest's `tensors` entry
    of each quantized key, aliases among the quantized keys: a key holding the same weight as an
    earlier one is not written). Plain entries pass through as they are."""
    check_can_save(state)
    support = torchao_support()
    out: dict[str, Tensor] = {}
    info: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for key, value in state.items():
        t = value.detach() if isinstance(value, Tensor) else value
        if not is_subclass(t):
            out[key] = value
            continue
        same = first.setdefault(_parts_key(t), key)
        if same != key:
            aliases[key] = same
            continue
        try:
            data, meta = support.flatten_tensor_state_dict({_PREFIX + key: t})
        except (ValueError, TypeError) as exc:
            raise TypeError(f"tensor {key!r} is a {type(t).__name__}, which torchao's safetensors support "
                            f"cannot split: {exc}") from exc
        description = json.loads(meta[_PREFIX + key])
        stem = f"{_PREFIX}{key.rsplit('.', 1)[0]}._{key.rsplit('.', 1)[1]}_" if "." in key else f"{_PREFIX}_{key}_"
        parts = {}
        for name, part in data.items():
            written = name.removeprefix(_PREFIX)
            if written in state or written in out:
                raise TypeError(f"tensor {key!r}: its part {written!r} has the name of another state_dict key")
            parts[name.removeprefix(stem)] = written
            out[written] = part
        info[key] = {"type": type(t).__name__, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                     "parts": parts, "torchao": meta[_PREFIX + key]}
        if description.get("_type") != type(t).__name__:
            raise TypeError(f"tensor {key!r}: torchao describes a {type(t).__name__} as {description.get('_type')}")
    return out, info, aliases


def file_metadata(quantized: Mapping[str, Any], keys: list[str]) -> dict[str, str]:
    """safetensors metadata for one weight file, as torchao writes it, for the quantized keys whose
    parts the file holds (`tensor_names` plus each one's description), so torchao can read the file."""
    in_file = set(keys)
    names = [k for k, v in quantized.items() if in_file & set(v["parts"].values())]
    if not names:
        return {}
    return {"tensor_names": json.dumps(names), **{k: quantized[k]["torchao"] for k in names}}


def logical(manifest_tensors: Mapping[str, Any], quantized: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{state_dict key: {"dtype", "shape"}}: the written plain tensors, less the parts of quantized
    weights, plus the quantized weights with their outer dtype and shape."""
    parts = {w for v in quantized.values() for w in v["parts"].values()}
    out = {k: v for k, v in manifest_tensors.items() if k not in parts}
    out.update({k: {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in quantized.items()})
    return out


def check_parts(manifest_tensors: Mapping[str, Any], quantized: Mapping[str, Any]) -> None:
    """Every quantized key has a well-formed entry whose parts are written tensors; LoadError naming the
    key otherwise."""
    for key, entry in quantized.items():
        fields = ("type", "dtype", "shape", "parts", "torchao")
        if not isinstance(entry, dict) or any(f not in entry for f in fields) or not isinstance(entry["parts"], dict):
            raise LoadError(f"quantized tensor {key!r}: the manifest's entry is malformed (want {', '.join(fields)})")
        for part, written in entry["parts"].items():
            if written not in manifest_tensors:
                raise LoadError(f"quantized tensor {key!r}: its part {part!r} ({written!r}) is not in the saved files")
        if not entry.get("parts"):
            raise LoadError(f"quantized tensor {key!r} lists no parts in the manifest")


def unflatten(tensors: dict[str, Tensor], quantized: Mapping[str, Any]) -> dict[str, Tensor]:
    """The written tensors with each quantized key's parts put back into its subclass tensor."""
    support = torchao_support()
    out = dict(tensors)
    for key, entry in quantized.items():
        data = {_PREFIX + w: out.pop(w) for w in entry["parts"].values()}
        meta = {_PREFIX + key: entry["torchao"], "tensor_names": json.dumps([_PREFIX + key])}
        try:
            rebuilt, left = support.unflatten_tensor_state_dict(data, meta)
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
            raise LoadError(f"quantized tensor {key!r} cannot be rebuilt from its parts: {exc}") from exc
        if _PREFIX + key not in rebuilt or left:
            raise LoadError(f"quantized tensor {key!r} cannot be rebuilt from its parts "
                            f"{sorted(entry['parts'])}: torchao left {sorted(k.removeprefix(_PREFIX) for k in left)}")
        out[key] = rebuilt[_PREFIX + key]
    return out


def _parts(t: Tensor) -> dict[str, Tensor]:
    attrs, _ = t.__tensor_flatten__()
    return {a: getattr(t, a) for a in attrs if isinstance(getattr(t, a), Tensor)}


def check_against(model: nn.Module, state: Mapping[str, Tensor], quantized: Mapping[str, Any]) -> None:
    """Each quantized key of `state` against `model` as quantize() left it: the same subclass, the
    same attributes (torchao's description) and the same parts, each of the same dtype and shape."""
    support = torchao_support()
    expected = model.state_dict()
    wrong: list[str] = []
    for key in quantized:
        have, want = expected.get(key), state[key]
        if not is_subclass(have):
            wrong.append(f"{key}: saved as a {type(want).__name__}, the model quantized again keeps a plain tensor")
            continue
        have = have.detach()
        if type(have) is not type(want):
            wrong.append(f"{key}: saved as a {type(want).__name__}, quantizing again gives a {type(have).__name__}")
            continue
        _, meta = support.flatten_tensor_state_dict({_PREFIX + key: have})
        if json.loads(meta[_PREFIX + key]) != json.loads(quantized[key]["torchao"]):
            wrong.append(f"{key}: saved with attributes {quantized[key]['torchao']}, quantizing again gives "
                         f"{meta[_PREFIX + key]}")
            continue
        a, b = _parts(want), _parts(have)
        if a.keys() != b.keys():
            wrong.append(f"{key}: saved with parts {sorted(a)}, quantizing again gives {sorted(b)}")
        for part in sorted(a.keys() & b.keys()):
            if a[part].dtype != b[part].dtype or a[part].shape != b[part].shape:
                wrong.append(f"{key} part {part}: saved {dtype_name(a[part].dtype)} {list(a[part].shape)}, "
                             f"quantizing again gives {dtype_name(b[part].dtype)} {list(b[part].shape)}")
    if wrong:
        raise LoadError(f"{len(wrong)} quantized tensors differ from the model quantized again: " + "; ".join(wrong[:8])
                        + (f"; ... ({len(wrong)} in all)" if len(wrong) > 8 else ""))


__all__ = ["INSTALL_HINT", "SCHEME_ATTR", "check_against", "check_parts", "file_metadata", "flatten", "is_subclass",
           "logical", "check_can_save", "scheme_of", "torchao_support", "torchao_version", "unflatten"]


def _inner(t: Tensor, name: str) -> list[tuple[str, Tensor]]:
    """The plain tensors a (possibly subclass) tensor is made of: qdata, scale, zero_point ..."""
    if not is_subclass(t) or not hasattr(t, "__tensor_flatten__"):
        return [(name, t)]
    attrs, _ = t.__tensor_flatten__()
    return [leaf for a in attrs for leaf in _inner(getattr(t, a), f"{name}.{a}")]


def tensors_of(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """{name: plain tensor} of a state dict, quantized tensors split into their parts."""
    return {n: p for name, t in state.items() if isinstance(t, Tensor) for n, p in _inner(t, name)}


def same_tensors(a: dict[str, Tensor], b: dict[str, Tensor]) -> tuple[bool, str]:
    """Whether two {name: tensor} maps hold the same names and bitwise-equal tensors, and what differs."""
    if list(a) != list(b):
        return False, f"different tensors: {sorted(set(a) ^ set(b))[:5]}"
    differ = [n for n in a if not bitwise_equal(a[n], b[n])]
    if differ:
        return False, f"{len(differ)} of {len(a)} tensors differ: {', '.join(differ[:5])}"
    return True, f"{len(a)} tensors bitwise identical"
