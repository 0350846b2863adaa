"""The end-to-end benchmark under torch.distributed: the world a run belongs to, the FSDP2 recipe a
`+fsdp2` provider's model gets, and the per-GPU numbers rank 0 writes.

    torchrun --nproc-per-node N benchmarks/bench_e2e.py --providers torch.compile+fsdp2,ours+compile+fsdp2 ...

Under torchrun (WORLD_SIZE set) every rank runs every row on its own GPU (cuda:LOCAL_RANK) with its own
batch of `Size.batch` sequences: tokens/s is per GPU, peak memory the largest of the ranks'. Without
torchrun a `+fsdp2` row runs in a world of one process, which FSDP2's whole recipe (sharding hooks, the
mixed-precision casts, the reduce-scatter of gradients over one rank) still goes through.

The recipe (torchtitan's): each decoder layer compiled on its own where the base compiles (the optimized
model with `kernel_pytorch.optimize.INDUCTOR_OPTIONS`), then `fully_shard` on each decoder layer and on the
root, with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` on CUDA: the parameters and the
optimizer state stay fp32 and sharded, the layers compute in bf16.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class World:
    """The process's place in the run: rank, size, and its device."""

    rank: int = 0
    size: int = 1
    launched: bool = False  # started by torchrun (WORLD_SIZE in the environment)

    @property
    def main(self) -> bool:
        """Whether this process writes the results and prints the rows."""
        return self.rank == 0


ONE = World()  # a run without a launcher


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started this process."""
    return "WORLD_SIZE" in os.environ


def main_process() -> bool:
    """Whether this process is rank 0 of its launcher's world (or was not launched by one)."""
    return os.environ.get("RANK", "0") == "0"


def init(dev: torch.device) -> tuple[World, torch.device]:
    """Join the launcher's process group (NCCL on CUDA, gloo on CPU) and pick this rank's device; a run
    without a launcher is a world of one, its group made on first use (`ensure_group`)."""
    if not launched():
        return World(), dev
    import torch.distributed as dist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return World(rank, size, launched=True), dev


def ensure_group(dev: torch.device) -> None:
    """A process group for a `+fsdp2` row of a run without a launcher: a world of one process."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    store = tempfile.mkstemp(prefix="kp-e2e-world-")[1]
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method=f"file://{store}", rank=0,
                            world_size=1)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's decoder layers: the `layers` ModuleList of an HF decoder (`model.model.layers`) or of the
    built-in Llama (`model.layers`)."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"{type(model).__name__} has no `layers` ModuleList of decoder layers to shard")


def shard(model: torch.nn.Module, dev: torch.device, compute_dtype: torch.dtype,
          compile_options: dict | None, compile_layers: bool) -> torch.nn.Module:
    """The FSDP2 recipe on `model` (fp32 parameters): each decoder layer compiled (`compile_layers`, with
    `compile_options`) and sharded, then the root sharded, on a 1-D mesh of the whole world; the layers
    compute in `compute_dtype` where it is not fp32. Returns the root module."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ensure_group(dev)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    kw: dict = {"mesh": mesh}
    if compute_dtype != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        if compile_layers:
            layer = torch.compile(layer, options=compile_options) if compile_options else torch.compile(layer)
            layers[i] = layer
        # the last layer's parameters are gathered for the backward anyway: keeping them avoids one all-gather
        fully_shard(layer, reshard_after_forward=i < len(layers) - 1, **kw)
    return fully_shard(model, **kw)


def tensor_parallel(model: torch.nn.Module, dev: torch.device) -> torch.nn.Module:
    """`model` under tensor and sequence parallelism over the whole world (kernel_pytorch.distributed's
    Llama plan: our styles on an optimized model, torch's on the others); every rank runs the same batch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from kernel_pytorch.distributed import tensor_parallel as plan

    ensure_group(dev)
    return plan(model, init_device_mesh(dev.type, (dist.get_world_size(),)))


def world_size() -> int:
    """The process group's size (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def largest(value: float | int | None, dev: torch.device) -> float | None:
    """The largest of the ranks' `value` (a rank's None counts as missing); the value itself in a world of
    one process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([-1.0 if value is None else float(value)], dtype=torch.float64,
                     device=dev if dev.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return None if t.item() < 0 else t.item()


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def close() -> None:
    """Leave the process group (torchrun's or a world of one) at the end of the run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
