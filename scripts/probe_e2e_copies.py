"""Where an optimized HF Llama's training step copies tensors, and its peak memory, on CPU.

    TRITON_INTERPRET=1 python scripts/probe_e2e_copies.py [--cuda-path] [--providers ours,ours+compile]

One training step (forward, backward, no optimizer) of a tiny random LlamaForCausalLM whose lm_head
dominates like the benchmark's (benchmarks/bench_e2e.py), per provider (eager, torch.compile, ours,
ours+compile; flce and flce+compile: the fused loss alone, on hidden states of the same size): every
aten copy (copy_, clone, _to_copy, contiguous) with its shapes, and the bytes each would move on the
e2e benchmark's model (hidden 2048, vocab 128256, intermediate 5632, 8192 tokens, bf16), dims mapped by
their tiny sizes.
On CPU the fused linear cross-entropy op runs its reference; --cuda-path makes it run the chunked
launchers instead (the body compile traces on CUDA), in 4 chunks, with the cross-entropy kernels replaced
by torch ops that write the same buffers (Inductor on CPU cannot run a Triton kernel; the loss is a
stand-in: sum / rows); the backward's scale is ops/_common/scale.scaled_grad's traced form (a stand-in for it on
a tree older than that form, whose kernel Inductor could not run here).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

HIDDEN, INTER, VOCAB, BATCH, SEQ = 48, 80, 3000, 2, 32  # distinct sizes, so a shape maps back to a dim
REAL = {HIDDEN: 2048, INTER: 5632, VOCAB: 128256, BATCH * SEQ: 8192, BATCH: 4, SEQ: 2048}
COPIES = ("aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous", "aten::slice_scatter")


def real_bytes(shape: list[int]) -> int:
    """bf16 bytes of `shape` with each tiny dim replaced by the real model's."""
    n = 2
    for d in shape:
        n *= REAL.get(d, d)
    return n


_TUNING = contextlib.ExitStack()  # the chunking cuda_path sets, until the next call


def cuda_path(on: bool) -> None:
    """Make the fused linear cross-entropy ops run their launchers (the CUDA body) on CPU as well, or
    (on=False) their reference again."""
    from kernel_pytorch.ops import tuning
    from kernel_pytorch.ops.cross_entropy import fused_linear as fl
    from kernel_pytorch.ops.cross_entropy import fused_linear_register as reg
    from kernel_pytorch.ops.cross_entropy import launch as ce_launch

    if not hasattr(fl, "_probe_saved"):
        fl._probe_saved = (fl.launch_fwd, ce_launch.cross_entropy_stats, reg.scaled_grad, {})
    launch, stats, scaled, references = fl._probe_saved

    def stats_stand_in(target, ce_weight, vocab, ignore_index, *, eager=False):
        return torch.ones(3)

    def scaled_stand_in(grad, dloss, *, eager=False):  # the traced form (ops/_common/scale.scaled_grad)
        return (grad.float() * dloss.float()).to(grad.dtype)

    def stand_in(logits, inputs, out, grad, options, *, eager=False):
        z = logits.tensor.float()
        target = inputs.target
        rows_lse = torch.logsumexp(z, -1)
        valid = target != options.ignore_index
        picked = z.gather(1, target.clamp(min=0)[:, None])[:, 0]
        n = BATCH * SEQ
        out.loss.copy_(torch.where(valid, rows_lse - picked, 0.0) / n)
        out.lse.copy_(rows_lse)
        if grad is not None:
            g = torch.softmax(z, -1) - torch.nn.functional.one_hot(target.clamp(min=0), z.shape[-1])
            grad.tensor.copy_((g * valid[:, None] / n).to(grad.tensor.dtype))

    for op in (reg.fused_linear_cross_entropy_fwd_op, reg.fused_linear_cross_entropy_bwd_op):
        body = op._init_fn  # triton_op's wrapper; the registered body is its `fn`
        body = dict(zip(body.__code__.co_freevars, body.__closure__))["fn"].cell_contents
        cells = dict(zip(body.__code__.co_freevars, body.__closure__))
        references.setdefault(op, cells["cpu"].cell_contents)
        impl = cells["cuda"].cell_contents if on else references[op]
        cells["cpu"].cell_contents = impl
        op.register_kernel("cpu")(impl)
    fl.launch_fwd = stand_in if on else launch
    ce_launch.cross_entropy_stats = stats_stand_in if on else stats
    import kernel_pytorch.ops._common.scale as sc

    if not hasattr(sc, "_traced"):  # a tree whose traced scale would launch the Triton kernel
        reg.scaled_grad = scaled_stand_in if on else scaled
    _TUNING.close()
    if on:  # 4 chunks of fp32 logits
        _TUNING.enter_context(tuning.changed("fused_linear_cross_entropy",
                                             chunk_bytes=(BATCH * SEQ // 4) * VOCAB * 4, row_align=1))


class _Head(torch.nn.Module):
    """The fused loss alone ("flce" providers): hidden states (a parameter) -> loss over the head."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Parameter(torch.randn(BATCH * SEQ, HIDDEN))
        self.head = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN) * HIDDEN**-0.5)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        from types import SimpleNamespace

        from kernel_pytorch.functional import fused_linear_cross_entropy

        return SimpleNamespace(loss=fused_linear_cross_entropy(self.hidden, self.head, labels.reshape(-1)))


def model_for(provider: str, chunked: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if provider.startswith("flce"):
        cuda_path(chunked)
        return torch.compile(_Head()) if provider.endswith("compile") else _Head()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).train()
    if provider.startswith("ours"):
        from kernel_pytorch.optimize import optimize

        cuda_path(False)
        ids = torch.randint(0, VOCAB, (1, 16))
        model, _ = optimize(model, {"input_ids": ids, "labels": ids}, compile=False, seeds=(0,))
        model.train()
    cuda_path(chunked)  # after optimize(): its validation compares the real loss, which the stand-in is not
    if provider.endswith("compile"):
        model = torch.compile(model)
    return model


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    from kernel_pytorch.benchmark.memory import peak_memory

    ap = argparse.ArgumentParser()
    ap.add_argument("--providers", default="eager,torch.compile,ours,ours+compile")
    ap.add_argument("--cuda-path", action="store_true")
    args = ap.parse_args()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    for provider in args.providers.split(","):
        model = model_for(provider, args.cuda_path)

        def step(model: torch.nn.Module = model) -> torch.Tensor:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
            return loss.detach()

        step()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            loss = step()
        copies: Counter[tuple[str, str]] = Counter()
        moved = 0
        for e in prof.events():
            if e.name in COPIES and e.input_shapes and e.input_shapes[0]:
                parent = e.cpu_parent.name if e.cpu_parent is not None else "-"
                if parent in COPIES:  # counted at the outer copy
                    continue
                copies[(e.name, f"{e.input_shapes[0]} under {parent}")] += 1
                moved += real_bytes(e.input_shapes[0])
        peak = peak_memory(step).peak_bytes
        print(f"\n== {provider}: loss {loss.item():.5f}, peak {peak / 2**20:.2f} MiB (CPU allocation trace, fp32)")
        for (name, where), n in sorted(copies.items(), key=lambda kv: -real_bytes(eval(kv[0][1].split(' under')[0]))):
            print(f"  {n:3d} x {name} {where}")
        print(f"  copies: {sum(copies.values())}, {moved / 1e9:.3f} GB per step on the real model (bf16)")


if __name__ == "__main__":
    main()
