"""Parallel styles for kernel_pytorch's modules, beside torch's (torch.distributed.tensor.parallel).

`GatedMLPParallel` shards a `kernel_pytorch.nn.GatedMLP` the way ColwiseParallel on gate_proj and up_proj
and RowwiseParallel on down_proj do (Megatron's MLP: each rank holds I/n of the intermediate columns),
but puts its hooks on the block instead of on the projections. The block then keeps its fused path: the
gated_down op (h made again in the backward, not kept) runs on each rank's columns through its sharding
rule (ops/gated_down.py), where hooks on the projections would make the block call them one by one and
keep h for down_proj's weight gradient.

    parameters  gate_proj.weight, up_proj.weight (and biases): Shard(0); down_proj.weight: Shard(1)
    input       (B, T, H): the placements `input_layouts` says (a plain tensor is taken as such),
                redistributed to Replicate (an all-gather of a sequence shard)
    output      the ranks' Partial sums, redistributed to `output_layouts` (Shard(1): a reduce-scatter to
                sequence shards; Replicate: an all-reduce), a local tensor with use_local_output

`SequenceParallelNorm` is torch's SequenceParallel (the norm on a (B, T/n, H) sequence shard, its weight
Replicate) whose output is all-gathered to Replicate at once: one all-gather serves every projection
after the norm (q, k and v; gate and up), whichever way the caller passes the norm's output on (as a
keyword, as transformers' decoder layers pass hidden_states to their attention, or positionally). It
takes every tensor input as a sequence shard (FusedAddRMSNorm's x and residual) and, for a norm that
returns (normed, residual), gathers the normed output only: the residual stream stays sharded.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

from kernel_pytorch.nn.mlp import GatedMLP


def _check_gated_mlp(module: nn.Module) -> None:
    """A GatedMLP that GatedMLPParallel can shard, or a ValueError saying why not."""
    if not isinstance(module, GatedMLP):
        raise ValueError(f"GatedMLPParallel shards a kernel_pytorch.nn.GatedMLP (got {type(module).__name__}); "
                         "use ColwiseParallel / RowwiseParallel on its projections")
    if module.fuse_gate_up:
        raise ValueError("GatedMLPParallel cannot shard a GatedMLP with fuse_gate_up=True: a column shard of the "
                         "packed gate_up_proj is not a [gate | up] pair on each rank; build it with "
                         "fuse_gate_up=False (the state dict is the same)")
    if module.down_proj.bias is not None:
        raise ValueError("GatedMLPParallel cannot shard a GatedMLP whose down_proj has a bias: each rank would add it "
                         "to its partial sum; use RowwiseParallel on down_proj, which adds it once")


class GatedMLPParallel(ParallelStyle):
    """Tensor parallelism for `kernel_pytorch.nn.GatedMLP` that keeps its fused block (module docstring).

    Keyword Args:
        input_layouts: the input's placement (a plain tensor input is taken as this); default Replicate().
        output_layouts: the output's placement; default Shard(1) (sequence parallelism).
        use_local_output: return the local tensor instead of the DTensor; default False.
    """

    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = False) -> None:
        super().__init__()
        self.input_layouts = (input_layouts or Replicate(),)
        self.output_layouts = (output_layouts or Shard(1),)
        self.use_local_output = use_local_output

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        placement = {"gate_proj": Shard(0), "up_proj": Shard(0), "down_proj": Shard(1)}.get(name)
        if placement is None:
            return
        for key, param in list(module.named_parameters(recurse=False)):
            # the down projection's bias is refused before this runs; a gate/up bias follows its rows
            sharded = distribute_tensor(param.data, mesh, [placement if key == "weight" else Shard(0)],
                                        src_data_rank=self.src_data_rank)
            module.register_parameter(key, nn.Parameter(sharded, requires_grad=param.requires_grad))

    def _input(self, module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, self.input_layouts, run_check=False)
        whole = (Replicate(),) * mesh.ndim
        if x.placements != whole:
            x = x.redistribute(placements=whole)
        return (x, *inputs[1:])

    def _output(self, module: nn.Module, output: Tensor, mesh: DeviceMesh) -> Tensor:
        if output.placements != self.output_layouts:
            output = output.redistribute(placements=self.output_layouts)
        return output.to_local() if self.use_local_output else output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_gated_mlp(module)
        return distribute_module(module, device_mesh, self._partition, self._input, self._output)

    def __repr__(self) -> str:
        return (f"GatedMLPParallel(input_layouts={self.input_layouts[0]}, output_layouts={self.output_layouts[0]}, "
                f"use_local_output={self.use_local_output})")


class SequenceParallelNorm(SequenceParallel):
    """torch's SequenceParallel whose output is all-gathered to a Replicate DTensor (module docstring).

    Keyword Args:
        sequence_dim: the sequence dim of the norm's input; default 1.
    """

    def __init__(self, *, sequence_dim: int = 1) -> None:
        super().__init__(sequence_dim=sequence_dim, use_local_output=False)

    @staticmethod
    def _prepare_input_fn(sequence_sharding: tuple, mod: nn.Module, inputs: tuple, device_mesh: DeviceMesh) -> tuple:
        each = SequenceParallel._prepare_input_fn
        return tuple(each(sequence_sharding, mod, (t,), device_mesh) if isinstance(t, Tensor) else t for t in inputs)

    @staticmethod
    def _prepare_output_fn(use_local_output: bool, mod: nn.Module, outputs: Any, device_mesh: DeviceMesh) -> Any:
        whole = [Replicate()] * device_mesh.ndim
        if isinstance(outputs, tuple):  # (normed, residual): the residual stream stays a sequence shard
            return (outputs[0].redistribute(placements=whole), *outputs[1:])
        return outputs.redistribute(placements=whole)


__all__ = ["GatedMLPParallel", "SequenceParallelNorm"]
