"""Saved-for-backward bytes of one training step of a small HF Llama (CPU is enough: it counts tensors).

    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/saved_memory_mlp.py

Prints what autograd keeps (saved-tensor hooks, unique storages, parameters excluded) for HF's eager
model, for optimize()'s model with the gated MLP composed (h saved by down_proj's Linear, what the op
path did before the gated_down op) and with gated_down, and what torch.compile's partition of the
optimized model keeps for its backward (the backward graph's inputs), by shape.
"""

from __future__ import annotations

import collections

import torch
from torch._inductor.compile_fx import compile_fx, compile_fx_inner
from transformers import LlamaConfig, LlamaForCausalLM

import kernel_pytorch as kp
from kernel_pytorch.functional import mlp as mlp_mod

CFG = dict(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=256)
BATCH, SEQ = 2, 128
MIB = 2 ** 20


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


def eager_saved(model: torch.nn.Module, inputs: dict) -> collections.Counter:
    """(shape, dtype) -> count of the distinct non-parameter storages autograd saves in one step."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    found: collections.Counter = collections.Counter()

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            found[(tuple(t.shape), t.dtype)] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**inputs).loss
    loss.backward()
    return found


def compiled_saved(model: torch.nn.Module, inputs: dict) -> collections.Counter:
    """(shape, dtype) -> count of the backward graphs' non-gradient, non-parameter inputs under
    torch.compile (Inductor's partition: what the forward hands to the backward)."""
    found: collections.Counter = collections.Counter()
    param_shapes = {tuple(p.shape) for p in model.parameters()}

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> None:
        for n in gm.graph.nodes:
            val = n.meta.get("val")
            if n.op != "placeholder" or n.name.startswith("tangents") or not isinstance(val, torch.Tensor):
                continue
            if not (n.name.startswith("primals") and tuple(val.shape) in param_shapes):
                found[(tuple(val.shape), val.dtype)] += 1

    def inner(gm: torch.fx.GraphModule, example_inputs: list, **kw: object) -> object:
        if any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes):
            bw_compiler(gm, example_inputs)
        return compile_fx_inner(gm, example_inputs, **kw)

    torch._dynamo.reset()
    # Inductor itself (its decompositions and partitioner settings), caches off so every graph compiles
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = torch.compile(model, backend=lambda gm, ex: compile_fx(gm, ex, inner_compile=inner))
        compiled(**inputs).loss.backward()
    return found


def total(found: collections.Counter) -> float:
    return sum(k * _nbytes(shape, dtype) for (shape, dtype), k in found.items()) / MIB


def main() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CFG)).train()
    ids = torch.randint(0, CFG["vocab_size"], (BATCH, SEQ))
    inputs = {"input_ids": ids, "labels": ids}
    hf = eager_saved(model, inputs)
    model, report = kp.optimize(model, inputs, compile=False, seeds=(0,))
    print("optimize():", report.counts())
    recompute = mlp_mod._recompute_h
    mlp_mod._recompute_h = lambda x, params: False  # the composed block: down_proj's Linear saves h
    composed = eager_saved(model, inputs)
    mlp_mod._recompute_h = recompute
    ours, compiled = eager_saved(model, inputs), compiled_saved(model, inputs)
    h = BATCH * SEQ * CFG["intermediate_size"] * 4 * CFG["num_hidden_layers"] / MIB
    print(f"HF eager                   {total(hf):7.2f} MiB saved")
    print(f"optimize(), h kept         {total(composed):7.2f} MiB")
    print(f"optimize(), gated_down     {total(ours):7.2f} MiB  (N x I x 4 B x layers = {h:.2f} MiB)")
    print(f"optimize() + compile       {total(compiled):7.2f} MiB")
    print("eager vs compiled, where they differ (shape, dtype: eager count, compiled count):")
    for key in sorted(set(ours) | set(compiled), key=str):
        if ours[key] != compiled[key]:
            print(f"  {key[0]} {key[1]}: {ours[key]}, {compiled[key]}")


if __name__ == "__main__":
    main()
