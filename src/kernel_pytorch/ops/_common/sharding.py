"""DTensor sharding rules for the registered ops: the placements of an op's tensor arguments on which it
runs on each rank's local shards as they are, and the placements of its outputs then.

A rule is a function of the op's arguments, by name (`a.x`, `a.weight`, ...: a tensor as DTensor's spec of
it, with `.ndim`, `.shape` and `.placements`; an absent optional tensor None; other arguments as given)
returning the `Strategy`s of one mesh dimension: the outputs' placements and the tensor arguments'. A
tensor a strategy does not name is Replicate there, and every rule also holds the strategy with everything
Replicate (the op on whole tensors, the same on every rank). DTensor applies the rule on each mesh
dimension of a 2-D or larger mesh.

`register_rule(name, rule, takes)` registers a rule with torch.distributed.tensor.experimental's
`register_sharding`, checked first: where, on some mesh dimension, the arguments' placements match none
of the rule's strategies, the call raises an error naming the op, each argument with its placements, and
what the op takes (`takes`, a phrase), instead of letting DTensor redistribute the arguments to a
strategy it does have (to Replicate, mostly: an all-gather on every call that silently undoes the
sharding a model was given). So a DTensor call of one of our ops runs on the local shards with no
collective, or fails saying why. DTensor raises it as a RuntimeError that begins with our message. A
tensor sharded on a dim smaller than the mesh raises too: DTensor drops every strategy that shards such a
dim (a rank's shard would be empty) and would gather the tensor instead.

Registered when kernel_pytorch.ops is imported (each op's rule sits after its registration), where
torch.distributed is available; without it (some macOS and Windows builds of torch) nothing is
registered, and no DTensor can reach the ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

try:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding
except ImportError:  # torch built without distributed: there are no DTensors to take
    register_sharding = None
    R = P = None
else:
    R, P = Replicate(), Partial()  # immutable placements the rules share


class Strategy(NamedTuple):
    """One way an op runs on one mesh dimension: its outputs' placements (one per output, in order) and
    its tensor arguments' placements by name (a tensor not named: Replicate)."""

    outputs: tuple[Any, ...]
    inputs: Mapping[str, Any]


Rule = Callable[[SimpleNamespace], Sequence[Strategy]]


def shard(dim: int) -> Any:
    """Shard(dim): a rule's placement of a tensor split along `dim`."""
    return Shard(dim)


def _is_spec(value: object) -> bool:
    """Whether a rule's argument is a tensor (DTensor's spec of one)."""
    return hasattr(value, "placements") and hasattr(value, "mesh")


def _normal(p: Any, ndim: int) -> Any:
    """The placement with a negative Shard dimension counted from the front (Shard(-1) of a 3-D tensor is
    Shard(2)); _StridedShard and the others as they are."""
    if type(p) is Shard and p.dim < 0:
        return Shard(p.dim + ndim)
    return p


def _placements_text(placements: Sequence[Any]) -> str:
    return "(" + ", ".join(map(repr, placements)) + ("," if len(placements) == 1 else "") + ")"


def unsupported(qualname: str, values: Mapping[str, Any], tensors: Sequence[str], mesh_dim: int, takes: str) -> str:
    """The error of a call whose placements on `mesh_dim` match none of the op's strategies."""
    mesh = values[tensors[0]].mesh
    names = getattr(mesh, "mesh_dim_names", None)
    where = f"mesh dimension {mesh_dim}" + (f" ({names[mesh_dim]!r})" if names else "")
    given = ", ".join(f"{n} {_placements_text(values[n].placements)}" for n in tensors)
    return (f"{qualname} has no sharding rule for {given} on {where}: it runs on the local shards only when "
            f"{takes}, or with every tensor Replicate. Redistribute the arguments to one of those "
            "(DTensor.redistribute) or shard the model so that they arrive that way; DTensor would otherwise "
            "move the data on every call (an all-gather to Replicate).")


def _check(qualname: str, takes: str, values: Mapping[str, Any], tensors: Sequence[str],
           strategies: Sequence[Strategy]) -> None:
    """Raise `unsupported` unless, on every mesh dimension, the tensors' placements are one strategy's."""
    if not tensors:
        return
    ndims = {n: values[n].ndim for n in tensors}
    wanted = [{n: _normal(s.inputs.get(n, R), ndims[n]) for n in tensors} for s in strategies]
    for mesh_dim in range(len(values[tensors[0]].placements)):
        given = {n: _normal(values[n].placements[mesh_dim], ndims[n]) for n in tensors}
        if not any(all(w[n] == given[n] for n in tensors) for w in wanted):
            raise ValueError(unsupported(qualname, values, tensors, mesh_dim, takes))
        for n, p in given.items():
            ranks = values[n].mesh.size(mesh_dim)
            if type(p) is Shard and values[n].shape[p.dim] < ranks:
                raise ValueError(f"{qualname}: {n} is sharded on its dim {p.dim} of {values[n].shape[p.dim]} over "
                                 f"{ranks} ranks (mesh dimension {mesh_dim}); DTensor runs no op on a dim smaller "
                                 "than the mesh (it would gather the tensor first): shard a larger dim or replicate it")


def _overload(qualname: str) -> Any:
    namespace, name = qualname.split("::")
    return getattr(getattr(torch.ops, namespace), name).default


def strategies_of(qualname: str, rule: Rule, takes: str) -> Callable[..., list]:
    """The function register_sharding calls for `qualname`: the op's arguments (tensors as specs) ->
    (output placements, argument placements) lists, every strategy of `rule` and the all-Replicate one,
    after checking that the arguments' placements are one of them (module docstring)."""
    schema = _overload(qualname)._schema
    arg_names = [arg.name for arg in schema.arguments]
    defaults = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    n_outputs = len(schema.returns)

    def strategies(*args: Any, **kwargs: Any) -> list[tuple[list, list]]:
        values = {**defaults, **dict(zip(arg_names, args)), **kwargs}
        order = [*arg_names[: len(args)], *kwargs]  # DTensor's order of the placements: args, then kwargs
        tensors = [n for n in order if _is_spec(values[n])]
        found = [Strategy((R,) * n_outputs, {}), *rule(SimpleNamespace(**values))]
        _check(qualname, takes, values, tensors, found)
        return [(list(s.outputs), [s.inputs.get(n, R) if n in tensors else None for n in order]) for s in found]

    strategies.__name__ = strategies.__qualname__ = f"{qualname.split('::')[1]}_sharding"
    return strategies


def register_rule(name: str, rule: Rule, takes: str, namespace: str = "kernel_pytorch") -> None:
    """Register `rule` as the DTensor sharding of `<namespace>::<name>` (module docstring); nothing where
    torch.distributed is unavailable.

    Args:
        name: the op's name (`rms_norm_fwd`).
        rule: its strategies on one mesh dimension, from its arguments by name.
        takes: what the rule runs on, as a phrase for the error ("x sharded on a dim other than the last").
    """
    if register_sharding is None:
        return
    qualname = f"{namespace}::{name}"
    register_sharding(_overload(qualname))(strategies_of(qualname, rule, takes))


def register_rules(name: str, forward: Rule, backward: Rule | None, takes: str) -> None:
    """`register_rule` for an op's `<name>_fwd` and, given a backward rule, `<name>_bwd` (one phrase for both)."""
    register_rule(f"{name}_fwd", forward, takes)
    if backward is not None:
        register_rule(f"{name}_bwd", backward, takes)


def row_dims(spec: Any) -> range:
    """The dims of a (..., D) tensor other than the last: a row-wise op's shard dims."""
    return range(spec.ndim - 1)


def all_dims(spec: Any) -> range:
    """Every dim of a tensor: an elementwise op's shard dims."""
    return range(spec.ndim)


def rowwise(rows: Sequence[str], outputs: Sequence[str], dims: Callable[[Any], range] = row_dims) -> Rule:
    """The rule of an op whose rows are independent: the `rows` tensors (those given) sharded on one dim d
    of `dims(first of rows)`, the other tensors Replicate; each output "rows" (sharded on d), "sum" (Partial:
    a sum over the rows, e.g. a weight's gradient) or "whole" (Replicate)."""
    kinds = {"whole": lambda d: R, "sum": lambda d: P, "rows": shard}
    unknown = set(outputs) - set(kinds)
    if unknown:
        raise ValueError(f"outputs are 'rows', 'sum' or 'whole' (got {sorted(unknown)})")

    def rule(a: SimpleNamespace) -> list[Strategy]:
        return [Strategy(tuple(kinds[o](d) for o in outputs), {n: shard(d) for n in rows if getattr(a, n) is not None})
                for d in dims(getattr(a, rows[0]))]

    return rule


__all__ = ["P", "R", "Rule", "Strategy", "all_dims", "register_rule", "register_rules", "row_dims", "rowwise",
           "shard", "strategies_of", "unsupported"]
