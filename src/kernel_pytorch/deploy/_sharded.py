"""`save` and `load` of a sharded model: one under FSDP (`fully_shard`, FSDP1) or holding DTensor parameters
(tensor parallelism), called on every rank of its process group.

save: the full tensors are gathered onto rank 0 in CPU memory with torch.distributed.checkpoint's
`get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))`, and
rank 0 alone writes them, so the files are a whole model's (they load into an unsharded model as any save
does) and the manifest's `sharding` says how they were made. load into a sharded model: rank 0 reads and
checks the files, and `set_model_state_dict(..., broadcast_from_rank0=True)` sends each tensor to the
ranks, each keeping its shard. Rank 0 tells the others whether its part succeeded (one broadcast of a
flag), so a failure there raises on every rank instead of leaving them waiting in a collective.

For checkpoints of training (sharded files written by every rank in parallel, optimizer state, resharding
to another world size) torch.distributed.checkpoint's `dcp.save` / `dcp.load` is the tool: the optimized
modules keep the original's state_dict keys, so they go through it unchanged (docs/deploy.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._env import is_dtensor

GATHERED_WITH = ("torch.distributed.checkpoint.state_dict.get_model_state_dict(model, options=StateDictOptions("
                 "full_state_dict=True, cpu_offload=True))")


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` holds DTensor parameters or buffers, or FSDP modules."""
    from kernel_pytorch.optimize.swap import has_fsdp

    return has_fsdp(model) or any(is_dtensor(t) for t in (*model.parameters(), *model.buffers()))


def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("the model is sharded (FSDP or DTensor parameters) but torch.distributed has no "
                           "process group here: save and load it on every rank of the group that sharded it")
    return dist


def rank() -> int:
    """This process's rank in the default group."""
    return int(_dist().get_rank())


def gather(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """(the full state_dict on rank 0's CPU, {} on the other ranks; the manifest's `sharding` record).
    A collective: every rank calls it."""
    dist = _dist()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from kernel_pytorch.optimize.swap import has_fsdp

    dtensors = sum(is_dtensor(t) for t in (*model.parameters(), *model.buffers()))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    record = {"world_size": int(dist.get_world_size()), "rank": int(dist.get_rank()), "gathered_with": GATHERED_WITH,
              "dtensors": int(dtensors), "fsdp": has_fsdp(model)}
    return dict(state), record


def sharded_state(model: nn.Module) -> dict[str, Any]:
    """The model's state_dict under its plain keys (activation-checkpointing and FSDP prefixes removed),
    DTensors as they are (their shapes and dtypes are the full tensors'), gathering nothing."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return dict(get_model_state_dict(model))


def agree(ok: bool, what: str) -> None:
    """Rank 0 tells every rank whether its part of `what` succeeded; the other ranks raise when it did not
    (rank 0 raises its own error). A collective: every rank calls it."""
    dist = _dist()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.broadcast(flag, src=0)
    if not int(flag.item()) and dist.get_rank() != 0:
        raise RuntimeError(f"{what} failed on rank 0, which raised the error saying why")


def set_full_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Load `state` (the full tensors, on rank 0; {} on the other ranks) into the sharded `model`, strictly:
    rank 0 broadcasts each tensor and every rank keeps its shard. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def plain_path(path: str) -> str:
    """A module path without the wrappers' own segments (activation checkpointing's, FSDP1's, a compiled
    module's), as the module was named before it was wrapped."""
    skip = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")
    return ".".join(part for part in path.split(".") if part not in skip)


__all__ = ["GATHERED_WITH", "agree", "gather", "is_sharded", "plain_path", "rank", "set_full_state",
           "sharded_state"]
