"""Finding and swapping module instances: ask each rule about each submodule, put the replacements in
their parents (every path that holds the instance, so a module shared by two parents stays shared),
and put the originals back on a revert. Nothing here edits a class or a module-level attribute.

A module holding sharded parameters, its own or its children's, is not offered to the rules: DTensor
parameters (a model parallelized by `parallelize_module`, or sharded by FSDP2's `fully_shard`) and, in a
model holding any FSDP module (FSDP2's or FSDP1's), every parameter. FSDP2 puts the unsharded parameters
on the original module objects for each forward and backward, and a tensor-parallel plan's hooks sit on
them: a replacement would compute with the shards or skip the plan. And a forward of an FSDP model outside
training (a rule's probe, validation) leaves FSDP2's root modules holding their unsharded Parameters until
the next backward, so an optimizer built afterwards would take those instead of the shards. Those modules
stay as they are (`sharded_modules` names them for the report); in a model without FSDP, their children
holding no DTensor are still offered.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from kernel_pytorch._env import is_dtensor
from kernel_pytorch.optimize.report import Change
from kernel_pytorch.optimize.rules import Rule


@dataclass
class Swap:
    """One instance to replace: `old` at every path in `paths`, by `new`; `change` is its report row."""

    old: nn.Module
    new: nn.Module
    change: Change
    paths: list[str] = field(default_factory=list)


def set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` at `path` ("a.b.0.c") in `model`: an attribute assignment on the parent instance."""
    parent_path, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if isinstance(parent, (nn.ModuleList, nn.Sequential)) and child.isdigit():
        parent[int(child)] = module
    else:
        setattr(parent, child, module)


def _fsdp_classes() -> tuple[type, ...]:
    """FSDP2's FSDPModule and FSDP1's wrapper, where torch.distributed.fsdp is loaded (no module is under
    FSDP before it is)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    names = ("FSDPModule", "FullyShardedDataParallel")
    return tuple(c for c in (getattr(fsdp, n, None) for n in names) if isinstance(c, type))


def has_fsdp(model: nn.Module) -> bool:
    """Whether `model` or a module in it is under FSDP (FSDP2's `fully_shard`, FSDP1's wrapper)."""
    classes = _fsdp_classes()
    return bool(classes) and any(isinstance(m, classes) for m in model.modules())


def _sharded(model: nn.Module) -> tuple[set[str], list[str]]:
    """(the paths of every module holding a sharded parameter (module docstring), itself or in a child;
    the paths of those holding one of their own, in model order)."""
    fsdp = has_fsdp(model)
    within: set[str] = set()
    own: list[str] = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if not (fsdp or is_dtensor(p)):
            continue
        path = name.rpartition(".")[0]
        if path not in own:
            own.append(path)
        parts = path.split(".") if path else []
        within.update(".".join(parts[:i]) for i in range(len(parts) + 1))
    return within, own


def sharded_modules(model: nn.Module) -> list[str]:
    """The paths of the modules holding sharded parameters of their own ("" for the model itself), which
    `plan` does not offer to the rules (module docstring)."""
    return _sharded(model)[1]


def plan(model: nn.Module, rules: Sequence[Rule]) -> tuple[list[Swap], list[Change]]:
    """(swaps to make, modules recognised and left alone) for `model` under `rules`.

    Every submodule (not the model itself) is offered to the rules in order; the first that returns a
    `Match` decides it, and its children are not looked at. A module reachable by several paths is
    decided once and swapped at all of them. A module holding sharded parameters is not offered (module
    docstring); its children are.
    """
    swaps: dict[int, Swap] = {}
    skipped: list[Change] = []
    decided: set[int] = set()
    done_prefixes: list[str] = []
    if has_fsdp(model):  # module docstring: nothing of an FSDP model is looked at
        return [], []
    sharded = _sharded(model)[0]
    for path, module in model.named_modules(remove_duplicate=False):
        if not path or path in sharded or any(path.startswith(p + ".") for p in done_prefixes):
            continue
        if id(module) in swaps:
            swaps[id(module)].paths.append(path)
            done_prefixes.append(path)
            continue
        if id(module) in decided:
            continue
        for rule in rules:
            match = rule.match(module, path, model)
            if match is None:
                continue
            decided.add(id(module))
            kind = type(module).__name__
            if match.replacement is None:
                skipped.append(Change(path, rule.name, rule.family, kind, None, "skipped", match.reason))
            else:
                change = Change(path, rule.name, rule.family, kind, type(match.replacement).__name__,
                                "applied", match.reason)
                swaps[id(module)] = Swap(module, match.replacement, change, [path])
                done_prefixes.append(path)
            break
    return list(swaps.values()), skipped


def apply(model: nn.Module, swaps: Sequence[Swap]) -> None:
    """Put each swap's new module at all its paths (and let a replacement that needs the model, such as
    an attention reading the model call's mask hint, `attach` to it)."""
    for s in swaps:
        for path in s.paths:
            set_module(model, path, s.new)
        if callable(attach := getattr(s.new, "attach", None)):
            attach(model)


def revert(model: nn.Module, swaps: Sequence[Swap], detail: str) -> None:
    """Put the originals back and mark the changes reverted, with `detail` saying why."""
    for s in swaps:
        for path in s.paths:
            set_module(model, path, s.old)
        if callable(detach := getattr(s.new, "detach", None)):
            detach(model)
        s.change.status = "reverted"
        s.change.detail = detail


__all__ = ["Swap", "apply", "has_fsdp", "plan", "revert", "set_module", "sharded_modules"]
