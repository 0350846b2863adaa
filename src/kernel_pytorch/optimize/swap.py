"""Finding and swapping module instances: ask each rule about each submodule, put the replacements in
their parents (every path that holds the instance, so a module shared by two parents stays shared),
and put the originals back on a revert. Nothing here edits a class or a module-level attribute."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

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


def plan(model: nn.Module, rules: Sequence[Rule]) -> tuple[list[Swap], list[Change]]:
    """(swaps to make, modules recognised and left alone) for `model` under `rules`.

    Every submodule (not the model itself) is offered to the rules in order; the first that returns a
    `Match` decides it, and its children are not looked at. A module reachable by several paths is
    decided once and swapped at all of them.
    """
    swaps: dict[int, Swap] = {}
    skipped: list[Change] = []
    decided: set[int] = set()
    done_prefixes: list[str] = []
    for path, module in model.named_modules(remove_duplicate=False):
        if not path or any(path.startswith(p + ".") for p in done_prefixes):
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


__all__ = ["Swap", "apply", "plan", "revert", "set_module"]
