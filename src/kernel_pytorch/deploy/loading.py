"""`load(path, model_or_factory)`: rebuild an optimized model saved by `save()`, never unpickling.

Everything is checked before the model is changed: the manifest (format, rules), every weight file
(present, of the recorded size and sha256, a header safetensors accepts, the tensors the manifest lists), the keys,
shapes and dtypes against the model's state_dict, and that each recorded swap still applies. Any
failure raises `LoadError` naming the file or tensor, and the model is as it was.

A saved model with quantized weights is rebuilt as it was made: the swaps, then `deploy.quantize` with
the recorded scheme on the recorded weights, then the weights (put back together with torchao) are
copied in; a model quantized by the kernel_pytorch backend gets empty QuantizedLinear layers at the
recorded paths, into which the saved parts load. torchao's quantized tensors are checked against a
quantized copy of the model first (a model passed in place) or against the factory's model after
quantizing it (nobody else holds that one).

The directory and its files are found and checked by deploy/_saved.py; a sharded model (FSDP, DTensor
parameters) loads on every rank through deploy/_sharded.py's collectives.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from kernel_pytorch.deploy import _packed, _quantized, _saved, _sharded
from kernel_pytorch.deploy._files import LoadError
from kernel_pytorch.deploy._saved import SHOWN as _SHOWN
from kernel_pytorch.deploy._saved import names as _names
from kernel_pytorch.deploy.manifest import Manifest, dtype_name
from kernel_pytorch.optimize import swap as swapping
from kernel_pytorch.optimize.options import CompileOptions
from kernel_pytorch.optimize.report import Change
from kernel_pytorch.optimize.rules import Rule, default_rules

log = logging.getLogger(__name__)
def _rules_by_name(manifest: Manifest, extra: Sequence[Rule]) -> dict[str, Rule]:
    """The rule for each name the manifest's swaps use: `extra` first, then the built-in rules."""
    known: dict[str, Rule] = {r.name: r for r in default_rules()}
    known.update({r.name: r for r in extra})
    wanted = {s["rule"] for s in manifest.swaps}
    unknown = sorted(wanted - set(known))
    if unknown:
        raise LoadError(f"the saved model was optimized with rules this kernel_pytorch does not have: "
                        f"{', '.join(unknown)} (known: {', '.join(sorted(known))}); "
                        "pass them as load(..., rules=[...]) or install the kernel_pytorch version it was saved with")
    return {name: known[name] for name in wanted}


def _build(model_or_factory: nn.Module | Callable[[], Any]) -> nn.Module:
    if isinstance(model_or_factory, nn.Module):
        return model_or_factory
    if not callable(model_or_factory):
        raise TypeError(f"model_or_factory is a {type(model_or_factory).__name__}: give an nn.Module or a "
                        "function building one")
    built = model_or_factory()
    if isinstance(built, tuple) and built and isinstance(built[0], nn.Module):
        built = built[0]  # a CLI factory's (model, example_inputs)
    if not isinstance(built, nn.Module):
        raise TypeError(f"the factory returned a {type(built).__name__}, not an nn.Module")
    return built


def _saved_tensors(manifest: Manifest) -> dict[str, dict[str, Any]]:
    """{state_dict key: {"dtype", "shape", ...}} as saved: quantized weights with their outer dtype and shape."""
    if not manifest.quantization:
        return manifest.tensors
    return _quantized.logical(manifest.tensors, manifest.quantization["tensors"])


def _saved_aliases(manifest: Manifest) -> dict[str, str]:
    """The saved aliases as the unquantized model's keys see them (deploy/_packed.py's layers' parts
    under their weight's key)."""
    if manifest.quantization and manifest.quantization.get("backend") == _packed.BACKEND:
        return _packed.logical_aliases(manifest.aliases, manifest.quantization["tensors"])
    return manifest.aliases


def _check_state(model: nn.Module, manifest: Manifest, expected: dict[str, Any] | None = None) -> None:
    """Keys, shapes and dtypes of the saved tensors (aliases through their targets) against the model's
    (`expected`: its state_dict, by default `model.state_dict()`)."""
    expected = model.state_dict() if expected is None else expected
    tensors = _saved_tensors(manifest)
    aliases = _saved_aliases(manifest)
    provided = set(tensors) | set(aliases)
    bad_alias = sorted(a for a, k in aliases.items() if k not in tensors)
    if bad_alias:
        raise LoadError(f"the manifest ties {_names(bad_alias)} to tensors it does not hold")
    missing, unexpected = set(expected) - provided, provided - set(expected)
    if missing or unexpected:
        parts = [f"missing from the saved model: {_names(missing)}"] if missing else []
        parts += [f"saved but not in the model: {_names(unexpected)}"] if unexpected else []
        raise LoadError("the saved weights do not fit the model (strict): " + "; ".join(parts))
    wrong = []
    for key, target in expected.items():
        info = tensors[aliases.get(key, key)]
        if not isinstance(target, Tensor):
            wrong.append(f"{key}: the model's entry is a {type(target).__name__}, not a tensor")
            continue
        shape, dtype = list(info["shape"]), info["dtype"]
        if list(target.shape) != shape or dtype_name(target.dtype) != dtype:
            wrong.append(f"{key}: saved {dtype} {shape}, model has {dtype_name(target.dtype)} {list(target.shape)}")
    if wrong:
        hint = ""
        if any("float" in w for w in wrong):
            hint = " (build the model in the saved dtype first, e.g. model.to(torch.bfloat16))"
        raise LoadError(f"{len(wrong)} tensors differ from the model{hint}: " + "; ".join(wrong[:_SHOWN])
                        + (f"; ... ({len(wrong)} in all)" if len(wrong) > _SHOWN else ""))


def _swapped(module: nn.Module, record: dict[str, str]) -> bool:
    """Whether `module` is already the recorded replacement (torch's RMSNorm and ours share a name)."""
    kind = type(module)
    return kind.__name__ == record["after"] and (
        record["after"] != record["before"] or kind.__module__.startswith("kernel_pytorch."))


def _plan_swaps(model: nn.Module, manifest: Manifest, rules: dict[str, Rule]) -> list[swapping.Swap]:
    """The recorded swaps, re-made by their rules on this model's modules; nothing is applied yet. A
    module already of the recorded replacement class (a model optimized before) is left as it is."""
    paths: dict[int, list[str]] = {}
    for p, m in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(m), []).append(p)
    out: list[swapping.Swap] = []
    seen: set[int] = set()
    for record in manifest.swaps:
        where, rule = record["path"], rules[record["rule"]]
        try:
            module = model.get_submodule(where)
        except AttributeError as exc:
            raise LoadError(f"the saved model swapped {where!r} ({record['before']}), which this model does "
                            f"not have: {exc}") from exc
        if id(module) in seen or _swapped(module, record):
            continue
        match = rule.match(module, where, model)
        if match is None or match.replacement is None:
            why = "does not recognise it" if match is None else f"leaves it alone: {match.reason}"
            raise LoadError(f"rule {rule.name} no longer replaces {where!r} (a {type(module).__name__}, "
                            f"saved as a {record['before']}): it {why}")
        new = match.replacement
        if type(new).__name__ != record["after"]:
            raise LoadError(f"rule {rule.name} now replaces {where!r} by a {type(new).__name__}, "
                            f"the saved model has a {record['after']}")
        change = Change(where, rule.name, rule.family, type(module).__name__, type(new).__name__, "applied",
                        match.reason)
        out.append(swapping.Swap(module, new, change, paths[id(module)]))
        seen.add(id(module))
    return out


def _has(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def _ours(manifest: Manifest) -> bool:
    """Whether the saved model was quantized by the kernel_pytorch backend (QuantizedLinear layers)."""
    return bool(manifest.quantization) and manifest.quantization.get("backend") == _packed.BACKEND


def _torchao_quantized(manifest: Manifest) -> bool:
    return bool(manifest.quantization) and not _ours(manifest)


def _read_tensors(directory: Path, manifest: Manifest) -> dict[str, Tensor]:
    """Every saved tensor on the CPU, quantized weights put back together, aliases pointing at their
    targets' tensors."""
    from safetensors import SafetensorError, safe_open

    out: dict[str, Tensor] = {}
    for name in manifest.files:
        try:
            with safe_open(str(directory / name), framework="pt", device="cpu") as f:
                for key in f.keys():
                    out[key] = f.get_tensor(key)
        except (SafetensorError, OSError) as exc:
            raise LoadError(f"weight file {directory / name} could not be read: {exc}") from exc
    if _torchao_quantized(manifest):
        out = _quantized.unflatten(out, manifest.quantization["tensors"])
    for alias, key in manifest.aliases.items():
        out[alias] = out[key]
    return out


def _quantize_as_saved(model: nn.Module, manifest: Manifest) -> None:
    """`deploy.quantize` with the recorded scheme, on the Linear layers whose weights were saved quantized
    and are not quantized yet."""
    from kernel_pytorch.deploy.quantize import quantize

    quant = manifest.quantization or {}
    keys = set(quant["tensors"])
    keys |= {a for a, k in manifest.aliases.items() if k in keys}

    def wanted(module: nn.Module, fqn: str) -> bool:  # a model quantized before (a reload) is left as it is
        return isinstance(module, nn.Linear) and f"{fqn}.weight" in keys and not _quantized.is_subclass(module.weight)

    quantize(model, quant["scheme"], filter_fn=wanted)


def _probe(model: nn.Module, manifest: Manifest, rules: dict[str, Rule], state: dict[str, Tensor]) -> None:
    """Swap and quantize a copy of `model` as saved and check the quantized tensors against it, so
    that `model` is changed only once this passed."""
    probe = copy.deepcopy(model)
    swapping.apply(probe, _plan_swaps(probe, manifest, rules))
    _quantize_as_saved(probe, manifest)
    _quantized.check_against(probe, state, (manifest.quantization or {})["tensors"])
    del probe


def _check_swapped(model: nn.Module, manifest: Manifest) -> None:
    """Every recorded swap is in the sharded `model` already (its modules are FSDP's or a plan's: none is
    swapped now); paths are compared without the wrappers' segments (activation checkpointing's)."""
    modules = {_sharded.plain_path(p): m for p, m in model.named_modules(remove_duplicate=False)}
    for record in manifest.swaps:
        module = modules.get(record["path"])
        if module is None or not _swapped(module, record):
            kind = type(module)
            found = "no module" if module is None else f"a {kind.__module__}.{kind.__qualname__}"
            raise LoadError(f"the saved model swapped {record['path']!r} ({record['before']} -> {record['after']}, "
                            f"rule {record['rule']}); this sharded model holds {found} there, not the "
                            "replacement. A sharded model is not swapped on load: optimize it before sharding "
                            "(kernel_pytorch.optimize(model), then fully_shard), then load on every rank")


def _load_sharded(path: str | Path, model: nn.Module, rules: Sequence[Rule], strict_versions: bool,
                  verify: bool) -> nn.Module:
    """`load` into a sharded model, on every rank (deploy/_sharded.py): rank 0 reads and checks the files
    and the model, then sends each tensor to the ranks, which keep their shards."""
    state: dict[str, Tensor] = {}
    failure: BaseException | None = None
    if _sharded.rank() == 0:
        try:
            directory = _saved.find_directory(path)
            manifest = _saved.manifest_of(directory, strict_versions, stacklevel=3)
            if manifest.quantization:
                raise LoadError("a saved model with quantized weights loads into an unsharded model only "
                                "(kernel_pytorch.load, then quantize-aware sharding of your own)")
            _rules_by_name(manifest, rules)
            _saved.check_files(directory, manifest, verify)
            _check_swapped(model, manifest)
            _check_state(model, manifest, _sharded.sharded_state(model))
            state = _read_tensors(directory, manifest)
        except Exception as exc:  # every rank hears of it before it is raised (a rank waiting would hang)
            failure = exc
    _sharded.agree(failure is None, f"kernel_pytorch.load from {path}")
    if failure is not None:
        raise failure
    _sharded.set_full_state(model, state)
    log.info("loaded %s into a sharded model: %d tensors from rank 0", path, len(state))
    return model


def load(
    path: str | Path,
    model_or_factory: nn.Module | Callable[[], Any],
    *,
    rules: Sequence[Rule] = (),
    compile: bool = True,
    strict_versions: bool = False,
    verify: bool = True,
) -> nn.Module:
    """Rebuild the model `save()` wrote to `path`: build it, re-apply the recorded swaps, load the
    weights (strictly), and re-compile the blocks that were compiled in place.

    The swaps are re-made by the rules the manifest names (built-in ones, or those in `rules`) on the
    modules at the recorded paths, without validating them again: `optimize()` validated them when the
    model was saved. The weights are then loaded through `load_state_dict(strict=True)` into the model's
    own tensors (ties stay ties; a tied key written once loads into each of its places), all read onto
    the CPU first, then copied to the model's device.

    Args:
        path: the directory `save()` wrote (or its manifest or a weight file in it).
        model_or_factory: the original architecture: an nn.Module (changed in place and returned; a
            `torch.compile` wrapper is loaded through its `_orig_mod`), or a function returning one (or
            `(model, example_inputs)`, as the CLI's factories do). It must have the saved dtypes:
            tensors are not cast.
        rules: rules beyond the built-in ones, for models optimized with custom `Rule` objects.
        compile: re-apply regional compilation (`nn.Module.compile` with the saved options) where the
            saved model had it.
        strict_versions: raise instead of warning when kernel_pytorch, torch, triton or transformers
            differ from the versions the model was saved with.
        verify: check each weight file's sha256 against the manifest, which reads every file once more
            before loading; False skips it (very large checkpoints on trusted storage: the size and header
            checks still run, a flipped data byte then goes unnoticed).
    Returns:
        the model, optimized as saved, with the saved weights.

    A sharded model (under FSDP's `fully_shard`, or holding DTensor parameters), passed as a module, is
    loaded on every rank: rank 0 reads and checks the files (all of the checks above) and that the model
    holds the saved swaps already (optimize it before sharding it: sharded modules are not swapped), then
    `set_model_state_dict(..., full_state_dict=True, broadcast_from_rank0=True)` sends each tensor to the
    ranks, each keeping its shard. Only rank 0 reads the files. Quantized saves do not load this way.
    Raises:
        PickleRefusedError: `path` is a torch.save / .bin / .pt checkpoint (convert it with
            `kernel-pytorch convert`).
        LoadError: anything that does not fit (missing, truncated or corrupted files, a file whose sha256
            differs from the recorded one, a malformed manifest entry, missing or unexpected keys, shapes,
            dtypes, unknown rules, quantized parts that differ from what the recorded scheme gives); raised
            before the model is changed.
        ImportError: the saved model is quantized and torchao is not installed.

    Saves quantized by the kernel_pytorch backend: each recorded path must hold an nn.Linear of the
    recorded shape (checked before anything changes); after the swaps an empty QuantizedLinear of the
    recorded scheme takes its place and the saved parts are loaded into it (nothing is quantized again).

    torchao-quantized saves: the model is swapped, quantized with the recorded scheme (`deploy.quantize`, on
    the weights saved quantized only) and loaded. An `nn.Module` passed in place is unchanged by a
    failed load: the checks of the quantized tensors run on a deep copy (which takes the model's
    memory again for the time of the load) before the model is touched. A factory's model is checked
    after quantizing it, since nobody else holds it. Tied weights: torchao gives a quantized Linear its
    own weight, so a tied lm_head is no longer tied to its embedding after `quantize`, in the saved
    model as in the loaded one (both are written and loaded as separate tensors).
    """
    if isinstance(model_or_factory, nn.Module):
        target = getattr(model_or_factory, "_orig_mod", model_or_factory)
        if isinstance(target, nn.Module) and _sharded.is_sharded(target):
            _load_sharded(path, target, rules, strict_versions, verify)
            return model_or_factory
    directory = _saved.find_directory(path)
    manifest = _saved.manifest_of(directory, strict_versions, stacklevel=2)
    if _ours(manifest):
        _packed.check_parts(manifest.tensors, manifest.quantization["tensors"])
    elif manifest.quantization:
        _quantized.check_parts(manifest.tensors, manifest.quantization["tensors"])
        _quantized.torchao_support()  # ImportError saying how to install torchao
    by_name = _rules_by_name(manifest, rules)
    _saved.check_files(directory, manifest, verify)
    built = _build(model_or_factory)
    model = built._orig_mod if isinstance(getattr(built, "_orig_mod", None), nn.Module) else built  # torch.compile
    meta = [k for k, t in model.state_dict().items() if isinstance(t, Tensor) and t.is_meta]
    if meta:
        raise LoadError(f"the model has tensors on the meta device ({_names(meta)}): materialise it first "
                        "(e.g. model.to_empty(device=...)), load copies into the model's own tensors")
    _check_state(model, manifest)
    if _ours(manifest):
        _packed.check_model(model, manifest.quantization["tensors"])
    swaps = _plan_swaps(model, manifest, by_name)
    compiled = list(manifest.compile.get("compiled", [])) if compile else []
    try:
        options = CompileOptions.from_dict(manifest.compile.get("options") or {}, "the manifest's compile options")
    except (TypeError, ValueError) as exc:
        raise LoadError(str(exc)) from exc
    absent = [w for w in compiled if not _has(model, w)]
    if absent:
        raise LoadError(f"the saved model compiled blocks this model does not have: {_names(absent)}")
    state = _read_tensors(directory, manifest)
    if _torchao_quantized(manifest) and isinstance(model_or_factory, nn.Module):
        _probe(model, manifest, by_name, state)
    # from here on the model changes; everything that can fail on the saved files was checked above
    swapping.apply(model, swaps)
    try:  # the rules keep state_dict keys, shapes and dtypes; one that does not is caught before any copy
        _check_state(model, manifest)
    except LoadError as exc:
        swapping.revert(model, swaps, "")
        raise LoadError(f"re-applying the saved swaps changed the model's state_dict: {exc}") from exc
    if _ours(manifest):  # empty QuantizedLinear layers, their parts loaded below (checked above)
        _packed.swap_in(model, manifest.quantization["tensors"])
    elif manifest.quantization:  # checked on a copy above when the model was passed in place
        _quantize_as_saved(model, manifest)
        _quantized.check_against(model, state, manifest.quantization["tensors"])
    model.load_state_dict(state, strict=True)  # through the replacements' own state_dict hooks, if any
    from kernel_pytorch.optimize.compile_steps import compile_blocks

    compile_blocks([model.get_submodule(where) for where in compiled], options)
    log.info("loaded %s: %d tensors, %d swaps re-applied, %d blocks compiled", directory, len(state), len(swaps),
             len(compiled))
    return built


__all__ = ["LoadError", "load"]
