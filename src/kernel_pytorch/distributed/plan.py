"""The tensor- and sequence-parallel plan of a Llama-style decoder for torch's `parallelize_module`: for models
`kernel_pytorch.optimize` has swapped (our RMSNorm, GatedMLP, Embedding and attention modules) and for
plain ones (transformers' Llama-like classes, kernel_pytorch.models' Llama).

    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = kernel_pytorch.distributed.tensor_parallel(model, mesh, dim="tp")   # the plan, applied

The plan is Megatron's tensor parallelism with sequence parallelism (torchtitan's Llama plan):

    embed_tokens            RowwiseParallel: the table sharded over the vocabulary (Shard(0)); the lookup's
                            Partial sum reduce-scattered to (B, T/n, H) sequence shards
    each layer's norms      SequenceParallelNorm: the norm on the sequence shard (weight Replicate, its
                            gradient a Partial sum), its output all-gathered once for the projections
    self_attn.q/k/v_proj    ColwiseParallel: each rank holds Hq/n query and Hkv/n key/value heads
    self_attn.o_proj        RowwiseParallel, its Partial output reduce-scattered to sequence shards
    mlp                     GatedMLPParallel for our GatedMLP (the fused block on each rank's I/n columns);
                            otherwise ColwiseParallel on gate/up_proj and RowwiseParallel on down_proj
    norm                    SequenceParallelNorm
    lm_head                 ColwiseParallel over the vocabulary, the logits all-gathered (Replicate, a local
                            tensor): the loss runs on whole logits

The residual stream stays a DTensor of sequence shards, with its global shape, from the embedding to the
final norm (transformers derives the positions and the causal mask from the hidden states' length).
Inside kernel_pytorch's attention modules q, k and v stay DTensors, their heads sharded (the RoPE op's
sharding rule and SDPA take them); inside any other attention module they are local tensors of Hq/n and
Hkv/n heads, as ColwiseParallel hands them on by default (such modules mix them with plain cos/sin).

`llama_tp_plan` checks what it can before anything is sharded: the mesh has the named dimension, every
attention's query and key/value heads split evenly over the tensor-parallel ranks, the projections are
separate Linears, the embedding is not tied to lm_head; each failure is a ValueError saying which module
and why.
"""

from __future__ import annotations

import math

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from kernel_pytorch.distributed.styles import GatedMLPParallel, SequenceParallelNorm, _check_gated_mlp
from kernel_pytorch.nn.mlp import GatedMLP

_LAYER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
_QKV = ("q_proj", "k_proj", "v_proj")


def tp_mesh(mesh: DeviceMesh, dim: str | None = None) -> DeviceMesh:
    """The 1-D tensor-parallel mesh: `mesh` itself when 1-D and no `dim` is named, else its dimension `dim`.

    Raises:
        ValueError: a mesh of several dimensions without `dim`, or a `dim` the mesh does not name.
    """
    names = mesh.mesh_dim_names
    if dim is None:
        if mesh.ndim != 1:
            raise ValueError(f"a {mesh.ndim}-D mesh (dimensions {names}): name its tensor-parallel dimension (dim=)")
        return mesh
    if not names or dim not in names:
        raise ValueError(f"the mesh has no dimension {dim!r} (its dimensions: {names}); build it with "
                         f"init_device_mesh(..., mesh_dim_names=(..., {dim!r}))")
    return mesh[dim]


def _ours(module: nn.Module) -> bool:
    """Whether `module` is one of kernel_pytorch's drop-ins (nn's, and the attention optimize() puts in): they
    compute through kernel_pytorch.functional, which takes DTensor activations (plain rotary tables as
    replicated; sharded heads and columns through the ops' sharding rules). The built-in reference models
    (kernel_pytorch.models) are plain torch, as transformers' modules are."""
    return type(module).__module__.startswith(("kernel_pytorch.nn.", "kernel_pytorch.optimize."))


def _linear(parent: str, module: nn.Module, name: str) -> nn.Linear:
    child = getattr(module, name, None)
    if not isinstance(child, nn.Linear):
        got = "nothing" if child is None else type(child).__name__
        raise ValueError(f"{parent}.{name} must be a torch.nn.Linear to be sharded (got {got})")
    return child


def _attention_plan(name: str, attn: nn.Module, ranks: int) -> dict[str, ParallelStyle]:
    """q/k/v column-parallel, o_proj row-parallel, after checking that the heads split evenly."""
    if not hasattr(attn, "q_proj"):
        raise ValueError(f"{name} ({type(attn).__name__}) has no separate q_proj/k_proj/v_proj: a column shard of a "
                         "packed q/k/v projection does not hold whole q, k and v heads")
    q, k, _ = (_linear(name, attn, p) for p in _QKV)
    _linear(name, attn, "o_proj")
    head_dim = getattr(attn, "head_dim", None)
    if not isinstance(head_dim, int) or head_dim <= 0 or q.out_features % head_dim or k.out_features % head_dim:
        raise ValueError(f"{name} ({type(attn).__name__}) needs an integer head_dim dividing its projections")
    heads, kv_heads = q.out_features // head_dim, k.out_features // head_dim
    if heads % ranks or kv_heads % ranks:
        raise ValueError(
            f"{name}: {heads} query heads and {kv_heads} key/value heads do not split over {ranks} tensor-parallel "
            f"ranks: each rank holds whole heads, as many query heads per key/value head as the model (a "
            f"tensor-parallel size dividing {math.gcd(heads, kv_heads)})")
    keep = _ours(attn)  # ours keep q, k, v as DTensors; any other module gets local heads
    plan: dict[str, ParallelStyle] = {f"{name}.{p}": ColwiseParallel(use_local_output=not keep) for p in _QKV}
    plan[f"{name}.o_proj"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
    return plan


def _mlp_plan(name: str, mlp: nn.Module) -> dict[str, ParallelStyle]:
    """GatedMLPParallel for our GatedMLP; column/row-parallel projections for any other gated MLP."""
    if isinstance(mlp, GatedMLP):
        try:
            _check_gated_mlp(mlp)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        return {name: GatedMLPParallel(output_layouts=Shard(1))}
    for p in ("gate_proj", "up_proj", "down_proj"):
        _linear(name, mlp, p)
    local = not _ours(mlp)
    return {f"{name}.gate_proj": ColwiseParallel(use_local_output=local),
            f"{name}.up_proj": ColwiseParallel(use_local_output=local),
            f"{name}.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}


def _embedding(model: nn.Module) -> tuple[str, nn.Embedding]:
    found = [(n, m) for n, m in model.named_modules() if n.rpartition(".")[2] == "embed_tokens"]
    if len(found) != 1 or not isinstance(found[0][1], nn.Embedding):
        raise ValueError(f"{type(model).__name__} has no single `embed_tokens` torch.nn.Embedding to shard over the "
                         "vocabulary")
    return found[0]


def llama_tp_plan(model: nn.Module, mesh: DeviceMesh, *, dim: str | None = None) -> dict[str, ParallelStyle]:
    """The tensor- and sequence-parallel plan of a Llama-style decoder (module docstring), for
    `parallelize_module(model, tp_mesh(mesh, dim), plan)`.

    Args:
        model: a decoder with `embed_tokens`, layers holding self_attn, mlp, input_layernorm and
            post_attention_layernorm, a final `norm` beside the embedding and, optionally, `lm_head`
            (transformers' Llama, Mistral and Qwen2 classes, kernel_pytorch.models' Llama), optimize()d or not.
        mesh: the device mesh; a mesh of several dimensions needs `dim`.
        dim: the name of the mesh's tensor-parallel dimension.
    Returns:
        {module name: parallel style}.
    Raises:
        ValueError: the mesh lacks `dim`; heads that do not split over the tensor-parallel ranks; packed or
            missing projections; an embedding tied to lm_head; a module of no known layout.
    """
    ranks = tp_mesh(mesh, dim).size()
    embed_name, embed = _embedding(model)
    base = embed_name.rpartition(".")[0]
    prefix = f"{base}." if base else ""
    plan: dict[str, ParallelStyle] = {
        embed_name: RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False)}
    layers = [(n, m) for n, m in model.named_modules() if all(hasattr(m, part) for part in _LAYER_PARTS)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layers (modules with {', '.join(_LAYER_PARTS)})")
    for name, layer in layers:
        plan[f"{name}.input_layernorm"] = SequenceParallelNorm()
        plan[f"{name}.post_attention_layernorm"] = SequenceParallelNorm()
        plan.update(_attention_plan(f"{name}.self_attn", layer.self_attn, ranks))
        plan.update(_mlp_plan(f"{name}.mlp", layer.mlp))
    owner = model.get_submodule(base) if base else model
    if not isinstance(getattr(owner, "norm", None), nn.Module):
        raise ValueError(f"{type(model).__name__} has no final `{prefix}norm` beside its embedding")
    plan[f"{prefix}norm"] = SequenceParallelNorm()
    head = getattr(model, "lm_head", None)
    if head is not None:
        if not isinstance(head, nn.Linear):
            raise ValueError(f"lm_head must be a torch.nn.Linear to be sharded (got {type(head).__name__})")
        if head.weight is embed.weight:
            raise ValueError("lm_head.weight is tied to the input embedding: the plan shards the two modules with "
                             "two styles, each of which would distribute the shared weight on its own; untie them "
                             "(lm_head.weight = nn.Parameter(lm_head.weight.clone())) or keep both replicated")
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    return plan


def tensor_parallel(model: nn.Module, mesh: DeviceMesh, *, dim: str | None = None) -> nn.Module:
    """`parallelize_module(model, tp_mesh(mesh, dim), llama_tp_plan(model, mesh, dim=dim))`: the model
    sharded in place and returned. Every rank must hold the same parameters (the styles take the shards
    of rank 0's, SequenceParallelNorm keeps each rank's norm weight as it is)."""
    return parallelize_module(model, tp_mesh(mesh, dim), llama_tp_plan(model, mesh, dim=dim))


__all__ = ["llama_tp_plan", "tensor_parallel", "tp_mesh"]
