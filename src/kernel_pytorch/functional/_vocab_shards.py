"""Where a vocabulary-parallel loss's shards live: the group they are split over, this rank's classes, and
the local tensors, from a DTensor weight (Shard(0) on one mesh dim) or a plain local shard with its
group. Every layout it does not take raises an error naming the argument.

torch.distributed is imported here only when a call needs it (a DTensor, a group): a plain single-process
call never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from kernel_pytorch._env import is_plain_tensor
from kernel_pytorch.reference.vocab_parallel_cross_entropy import VocabShard, shard_range

# what `group` may be: a ProcessGroup, a DeviceMesh (with mesh_dim where it has several dims), or None
Group = Any


class Layout(NamedTuple):
    """A call's local tensors, the process group of the vocabulary's shards (None: a group of one) and
    this rank's classes."""

    x: Tensor
    weight: Tensor
    bias: Tensor | None
    target: Tensor
    token_scale: Tensor | None
    group: Any
    world: int
    shard: VocabShard


def _mesh_dim_index(mesh: Any, mesh_dim: int | str, what: str) -> int:
    """The index of `mesh_dim` (an index or a name) in `mesh`, or a ValueError naming mesh_dim."""
    names = mesh.mesh_dim_names or ()
    if isinstance(mesh_dim, str):
        if mesh_dim not in names:
            raise ValueError(f"mesh_dim {mesh_dim!r} is not a dim of {what} (its dims: {tuple(names) or 'unnamed'})")
        return names.index(mesh_dim)
    if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, int) or not 0 <= mesh_dim < mesh.ndim:
        raise ValueError(f"mesh_dim must be a dim name or an index below {mesh.ndim} for {what} (got {mesh_dim!r})")
    return mesh_dim


def _weight_mesh_dim(weight: Any, mesh_dim: int | str | None) -> int:
    """The mesh dim over which a DTensor weight's rows are split (its one Shard(0); Replicate elsewhere)."""
    placements = tuple(weight.placements)
    rows = [i for i, p in enumerate(placements) if p.is_shard(0)]
    other = [p for i, p in enumerate(placements) if i not in rows and not p.is_replicate()]
    if len(rows) != 1 or other:
        raise ValueError(
            f"weight is a DTensor with placements {placements}: the vocabulary-parallel loss needs the LM head's "
            "rows (classes) split over one mesh dim, Shard(0) there and Replicate on any other (what ColwiseParallel "
            "on the LM head leaves)")
    if mesh_dim is not None:
        index = _mesh_dim_index(weight.device_mesh, mesh_dim, "weight's device mesh")
        if index != rows[0]:
            names = weight.device_mesh.mesh_dim_names
            split = names[rows[0]] if names else rows[0]
            raise ValueError(f"mesh_dim {mesh_dim!r}: weight's rows are split over mesh dim {split!r}, not this one")
    return rows[0]


def _local(name: str, t: Tensor | None, dtensor: type | None) -> Tensor | None:
    """A replicated DTensor's local tensor (differentiably), a plain tensor as it is; anything else raises."""
    if t is None or dtensor is None or not isinstance(t, dtensor):
        return t
    if not all(p.is_replicate() for p in t.placements):
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(t.placements)}: the vocabulary-parallel loss needs every "
            f"rank's {name} whole (Replicate, or a plain tensor); gather it first (a sequence-parallel hidden "
            "state: redistribute it to Replicate)")
    return t.to_local()


def _plain_group(group: Group, mesh_dim: int | str | None) -> Any:
    """The ProcessGroup a plain weight's shards are split over, or None for a group of one."""
    import torch.distributed as dist

    if group is None:
        if mesh_dim is not None:
            raise ValueError("mesh_dim is given without a mesh: pass group=<DeviceMesh> with it")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError(
                "group: weight is a plain tensor (this rank's rows of the LM head); pass the group its rows are "
                "split over (group=<ProcessGroup>, or a DeviceMesh with mesh_dim), or a DTensor weight")
        return None
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if mesh_dim is None and group.ndim != 1:
            raise ValueError(f"mesh_dim: group is a {group.ndim}-D mesh (dims {group.mesh_dim_names}); name the "
                             "dim the vocabulary is split over")
        return group.get_group(0 if mesh_dim is None else _mesh_dim_index(group, mesh_dim, "group"))
    if isinstance(group, dist.ProcessGroup):
        if mesh_dim is not None:
            raise ValueError("mesh_dim applies to a DeviceMesh group, not to a ProcessGroup")
        return group
    raise TypeError(f"group must be a ProcessGroup, a DeviceMesh or None (got {type(group).__name__})")


def _gathered_sizes(rows: int, group: Any, device: torch.device) -> list[int]:
    """Every rank's number of rows, in group rank order: one all-gather of R integers and a host sync."""
    import torch.distributed._functional_collectives as funcol

    sizes = funcol.all_gather_tensor(torch.tensor([rows], dtype=torch.int64, device=device), 0, group)
    if isinstance(sizes, funcol.AsyncCollectiveTensor):
        sizes = sizes.wait()
    return [int(s) for s in sizes.tolist()]


def _plain_shard(weight: Tensor, group: Any, world: int, rank: int, shard_sizes: Sequence[int] | None,
                 device: torch.device) -> VocabShard:
    rows = weight.shape[0]
    if group is None:
        if shard_sizes is not None and list(shard_sizes) != [rows]:
            raise ValueError(f"shard_sizes {list(shard_sizes)} does not match one rank holding weight's {rows} rows")
        return VocabShard(0, rows, rows, rows)
    if shard_sizes is None:
        sizes = _gathered_sizes(rows, group, device)
    else:
        sizes = [int(s) for s in shard_sizes]
        if len(sizes) != world or sizes[rank] != rows or min(sizes) < 0:
            raise ValueError(f"shard_sizes must list the rows of each of the group's {world} ranks in rank order, "
                             f"{rows} (weight's) at rank {rank} (got {list(shard_sizes)})")
    return VocabShard(sum(sizes[:rank]), rows, sum(sizes), max(sizes))


def _dtensor_class() -> type | None:
    """torch's DTensor class, where some argument is a tensor subclass and torch.distributed is built."""
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def resolve_layout(x: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, token_scale: Tensor | None,
                   group: Group, mesh_dim: int | str | None, shard_sizes: Sequence[int] | None) -> Layout:
    """The call's Layout (module docstring). A DTensor weight gives the mesh dim of its Shard(0) (mesh_dim, if
    given, must name it; group, if given, must be its mesh) and its classes by torch's split; a plain weight
    is this rank's rows of `group` (a ProcessGroup, or a DeviceMesh and mesh_dim), at the offsets
    `shard_sizes` gives (default: gathered from the ranks). x, target and token_scale: plain, or replicated
    DTensors."""
    given = (x, weight, bias, target, token_scale)
    dtensor = None if all(t is None or is_plain_tensor(t) for t in given) else _dtensor_class()
    local_x = _local("x", x, dtensor)
    if dtensor is not None and isinstance(weight, dtensor):
        mesh = weight.device_mesh
        dim = _weight_mesh_dim(weight, mesh_dim)
        if group is not None and group != mesh:
            raise ValueError("group: weight is a DTensor, whose device mesh gives the group; pass group=None (or "
                             "weight's mesh) and mesh_dim to check the dim")
        if shard_sizes is not None:
            raise ValueError("shard_sizes applies to a plain weight; a DTensor weight's split is its own")
        world, rank = mesh.size(dim), mesh.get_local_rank(dim)
        shard = shard_range(weight.shape[0], world, rank)
        local_w = weight.to_local()
        if local_w.shape[0] != shard.size:
            raise ValueError(f"weight: rank {rank} of {world} holds {local_w.shape[0]} rows of {weight.shape[0]}, "
                             f"not the {shard.size} of torch's Shard(0) split (torch.chunk)")
        local_b = bias
        if bias is not None:
            if not isinstance(bias, dtensor) or bias.device_mesh != mesh or bias.placements != weight.placements:
                raise ValueError("bias must be a DTensor of weight's mesh and placements (its rows split as "
                                 "weight's), or None")
            local_b = bias.to_local()
        pg = mesh.get_group(dim) if world > 1 else None
    else:
        if dtensor is not None and isinstance(bias, dtensor):
            raise ValueError("bias is a DTensor but weight is a plain tensor; pass both as DTensors or both local")
        pg = _plain_group(group, mesh_dim)
        import torch.distributed as dist

        world = dist.get_world_size(pg) if pg is not None else 1
        rank = dist.get_rank(pg) if pg is not None else 0
        shard = _plain_shard(weight, pg, world, rank, shard_sizes, local_x.device)
        local_w, local_b = weight, bias
        pg = pg if world > 1 else None
    return Layout(local_x, local_w, local_b, _local("target", target, dtensor),
                  _local("token_scale", token_scale, dtensor), pg, world, shard)
