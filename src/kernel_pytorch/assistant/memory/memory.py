"""Memory bottlenecks: what one training step holds, and what would free it.

From `step.measure_step` (one forward + backward, an optimizer step when one is given): a
summary of the peak and what holds it (parameters, gradients, optimizer state, activations saved for
backward per module), the largest saved tensors with the line that made them, and suggestions with
estimates: activation checkpointing of the repeated blocks (memory freed, recompute paid), fused
linear + cross-entropy for large-vocabulary logits, bf16 autocast for fp32 models, recomputing the
gated MLP's activation, and turning off a KV cache that a training forward builds and nothing reads
(compiled, each cached K/V tensor is a graph output whose backward gets a gradient of zeros). Every
figure says whether it was measured or estimated; on CPU the peak is estimated (no allocator peak
counter) while saved-tensor bytes are measured.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from kernel_pytorch.assistant.components import component
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.estimates import StepTime, fmt_bytes, fmt_seconds, step_time
from kernel_pytorch.assistant.findings import Finding, Severity, skipped
from kernel_pytorch.assistant.fusion.graph import LARGE_VOCAB, GraphView
from kernel_pytorch.assistant.fusion.patterns import find_gated_activations
from kernel_pytorch.assistant.memory.step import MemoryRun, OptimizerFactory, SavedTensor, measure_step

# AdamW keeps two fp32 moments per parameter element: the estimate when no optimizer is given
_ADAM_BYTES_PER_ELEMENT = 8
# a suggestion is made when it frees at least this share of the step's peak
_WORTH = 0.05
_TOP = 5


def analyze_memory(ctx: AnalysisContext, optimizer: OptimizerFactory | None = None) -> list[Finding]:
    """The memory findings of one training step of the component (see the module docstring); `optimizer`
    (else the context's `options.optimizer`) builds the optimizer stepped once, None for no step."""
    ctx.progress("memory: forward + backward with saved-tensor hooks")
    run = (
        MemoryRun(
            params=sum(p.numel() * p.element_size() for p in ctx.module.parameters()),
            error="the model fails eagerly on its example inputs (see compilation readiness)",
        )
        if not ctx.eager.ok
        else measure_step(ctx.module, ctx.args, ctx.kwargs, optimizer or ctx.options.optimizer)
    )
    if run.error is not None:
        why = f"{run.error}; parameters: {fmt_bytes(run.params)}"
        return [skipped("memory", "Memory of a training step not analysed", why,
                        {"params": run.params, "reason": run.error})]
    opt_state = run.optimizer_state
    opt_est = sum(p.numel() for p in ctx.module.parameters() if p.requires_grad) * _ADAM_BYTES_PER_ELEMENT
    peak_est = run.params + run.activations + max(run.grads, run.output_bytes) + (opt_state or 0)
    peak = run.peak if run.peak is not None else peak_est
    findings = [_summary(ctx, run, peak, opt_est)]
    if run.saved:
        findings.append(_largest(run))
    findings += [
        f
        for f in (
            _checkpointing(ctx.module, run, peak, step_time(ctx)),
            _logits(ctx.module, run, peak),
            _autocast(ctx.module, run, peak),
            _gated_recompute(ctx, run, peak),
            _training_cache(ctx.module, run),
        )
        if f is not None
    ]
    return findings


def _summary(ctx: AnalysisContext, run: MemoryRun, peak: int, opt_est: int) -> Finding:
    measured = run.peak is not None
    parts = [
        f"parameters {fmt_bytes(run.params)}",
        f"gradients {fmt_bytes(run.grads)}",
        f"activations saved for backward {fmt_bytes(run.activations)} ({len(run.saved)} tensors)",
    ]
    if run.optimizer_state is not None:
        parts.append(f"optimizer state {fmt_bytes(run.optimizer_state)} (after one step)")
    top = sorted(run.by_module.items(), key=lambda kv: -kv[1])[:_TOP]
    step = " and the optimizer step" if run.optimizer_state is not None else ""
    holders = ", ".join(f"`{m or '(the model)'}` {fmt_bytes(b)}" for m, b in top)
    how = (
        f"measured by the CUDA allocator over forward, backward{step}"
        if measured
        else "estimated as parameters + saved activations + the larger of gradients and outputs"
        + (" + optimizer state" if run.optimizer_state is not None else "")
        + f": {ctx.device.type.upper()} has no allocator peak counter (a CUDA device measures it); the "
        "parts are measured (saved-tensor hooks, parameter and gradient sizes)"
    )
    opt_note = (
        ""
        if run.optimizer_state is not None
        else f" No optimizer was given: AdamW would add about {fmt_bytes(opt_est)} of state (two fp32 moments per "
        "parameter, estimated)."
    )
    evidence = (
        f"Peak of one forward + backward: {fmt_bytes(peak)}, {how}. It holds: {'; '.join(parts)}. "
        f"Saved activations by module: {holders or 'none'}.{opt_note} Forward {fmt_seconds(run.forward_s)}, "
        f"backward {fmt_seconds(run.backward_s)} (wall time, with the hooks on)."
    )
    return Finding(
        id="memory.summary",
        severity=Severity.INFO,
        title=f"Training step peak {fmt_bytes(peak)} ({'measured' if measured else 'estimated'}); "
        f"saved activations {fmt_bytes(run.activations)}, parameters {fmt_bytes(run.params)}",
        evidence=evidence,
        data={
            "peak_bytes": peak,
            "peak_measured": measured,
            "params": run.params,
            "grads": run.grads,
            "optimizer_state": run.optimizer_state,
            "optimizer_state_estimate_adamw": opt_est,
            "activations": run.activations,
            "saved_tensors": len(run.saved),
            "activations_by_module": dict(top),
            "output_bytes": run.output_bytes,
            "forward_s": run.forward_s,
            "backward_s": run.backward_s,
        },
    )


def _largest(run: MemoryRun) -> Finding:
    top = run.saved[:3]

    def one(s: SavedTensor) -> str:
        loc = s.location
        at = f" made at {loc.file.rsplit('/', 1)[-1]}:{loc.line} (`{loc.code}`)" if loc and loc.code else ""
        return f"{s.dtype}{list(s.shape)} {fmt_bytes(s.nbytes)} in `{s.module or '(the model)'}`{at}"

    big = top[0]
    share = big.nbytes / run.activations if run.activations else 0.0
    return Finding(
        id="memory.largest-tensors",
        severity=Severity.INFO,
        title=f"Largest tensor saved for backward: {big.dtype}{list(big.shape)}, {fmt_bytes(big.nbytes)} "
        f"({share:.0%} of the saved activations)",
        evidence="The largest saved tensors (measured): " + "; ".join(one(s) for s in top) + ".",
        location=big.location,
        data={
            "tensors": [
                {
                    "shape": list(s.shape),
                    "dtype": s.dtype,
                    "bytes": s.nbytes,
                    "module": s.module,
                    "location": s.location.to_dict() if s.location else None,
                }
                for s in top
            ]
        },
    )


def repeated_blocks(model: nn.Module) -> tuple[str, list[str]] | None:
    """(the ModuleList's path, its children's paths) of the largest list of same-type blocks."""
    best: tuple[int, str, list[str]] | None = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1:
            size = sum(p.numel() for p in m.parameters())
            if size and (best is None or size > best[0]):
                best = (size, name, [f"{name}.{i}" if name else str(i) for i in range(len(m))])
    return (best[1], best[2]) if best else None


def _within(run: MemoryRun, prefix: str) -> int:
    return sum(b for m, b in run.by_module.items() if m == prefix or m.startswith(prefix + "."))


def _checkpointing(model: nn.Module, run: MemoryRun, peak: int, forward: StepTime | None) -> Finding | None:
    found = repeated_blocks(model)
    if found is None or not found[0]:
        return None
    path, blocks = found
    held = [_within(run, b) for b in blocks]
    # what each checkpointed block still keeps: its input (one hidden state of the block's width)
    hidden = max((s.nbytes for s in run.saved if any(s.module.startswith(b) for b in blocks)), default=0)
    kept = min(hidden, min(held) if held else 0)
    freed = max(0, sum(held) - kept * len(blocks))
    if freed < _WORTH * peak:
        return None
    in_blocks = sum(p.numel() for p in model.get_submodule(path).parameters())
    share = in_blocks / max(1, sum(p.numel() for p in model.parameters()))
    recompute_ms = forward.ms * share if forward is not None else None
    code = (
        "model.gradient_checkpointing_enable()"
        if hasattr(model, "gradient_checkpointing_enable")
        else f"for block in model.{path}: block.forward = functools.partial(torch.utils.checkpoint.checkpoint, "
        "block.forward, use_reentrant=False)"
    )
    return Finding(
        id="memory.checkpointing",
        severity=Severity.WARNING if freed >= 0.25 * peak else Severity.INFO,
        title=f"Activation checkpointing of the {len(blocks)} blocks of `{path}` would free about {fmt_bytes(freed)}",
        evidence=f"The blocks save {fmt_bytes(sum(held))} for backward (measured; {fmt_bytes(max(held))} the "
        f"largest block) of a {fmt_bytes(peak)} peak. Checkpointed, each keeps only its input and recomputes "
        f"its forward during the backward.",
        suggestion=f"`{code}`"
        + (
            " (transformers checkpoints in training mode only: `model.train()`)"
            if code.startswith("model.gradient")
            else " (with `import functools, torch.utils.checkpoint`)"
        ),
        estimated_gain=f"about {fmt_bytes(freed)} less peak memory (estimated: saved bytes minus one input per "
        "block), for "
        + (f"about {fmt_seconds(recompute_ms / 1e3)} more per step (one more forward of the blocks, {share:.0%} of "
           f"the parameters, of {forward.label})" if forward is not None and recompute_ms is not None else
           f"one more forward of the blocks per step ({share:.0%} of the parameters; no step time was measured)"),
        data={"blocks": blocks, "saved_in_blocks": sum(held), "freed_bytes": freed, "gain_bytes": freed,
              "cost_ms": recompute_ms, "recompute_share": share,
              "step_ms": forward.ms if forward is not None else None,
              "step_measured": forward.measured if forward is not None else None},
    )


def _linears(model: nn.Module) -> Iterable[tuple[str, nn.Linear]]:
    return ((n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features >= LARGE_VOCAB)


def _logits(model: nn.Module, run: MemoryRun, peak: int) -> Finding | None:
    heads = list(_linears(model))
    if not heads:
        return None
    name, head = heads[-1]
    logits = [s for s in run.saved if s.shape and s.shape[-1] == head.out_features]
    held = sum(s.nbytes for s in logits)
    biggest = max((s.nbytes for s in logits), default=run.output_bytes)
    # the logits, their fp32 copy and the gradient of the logits in backward: never made when fused
    freed = held + biggest
    if freed < _WORTH * peak:
        return None
    comp = component("linear_cross_entropy")
    return Finding(
        id="memory.logits",
        severity=Severity.WARNING,
        title=(f"Logits over a {head.out_features}-word vocabulary hold {fmt_bytes(held)} for backward" if held else
               f"Logits over a {head.out_features}-word vocabulary: their gradient takes {fmt_bytes(biggest)}"),
        evidence=f"`{name}` ({type(head).__name__}, {head.in_features} -> {head.out_features}) makes logits "
        + (f"whose saved copies take {fmt_bytes(held)} (measured), and backward makes their gradient, "
           f"{fmt_bytes(biggest)} more." if held else
           f"of {fmt_bytes(biggest)} (measured; none saved for backward here: the loss is computed outside the "
           "model), and backward makes their gradient, as large."),
        suggestion=f"Compute the loss from the hidden states and `{name}.weight` chunk by chunk: {comp.named()} "
        "never holds the logits (meanwhile: compute the loss in chunks of tokens yourself).",
        estimated_gain=f"about {fmt_bytes(freed)} less peak memory (estimated from the measured logits)",
        data={"module": name, "vocab": head.out_features, "saved_logits": held, "freed_bytes": freed},
    )


def _training_cache(model: nn.Module, run: MemoryRun) -> Finding | None:
    """A KV cache returned by a training forward: nothing reads it, and compiled it costs (module docstring)."""
    if run.cache is None or not model.training:
        return None
    name, count, nbytes = run.cache
    return Finding(
        id="memory.training-kv-cache",
        severity=Severity.WARNING,
        title=f"The training step returns a KV cache ({count} tensors, {fmt_bytes(nbytes)}) that nothing reads",
        evidence=f"output[{name!r}] holds {count} key/value tensors, {fmt_bytes(nbytes)} (measured): transformers "
        "builds the cache whenever use_cache is on, its config's default. Eagerly they are tensors attention "
        "saves anyway; under torch.compile each one is an output of the compiled forward, so its backward takes a "
        "gradient of zeros for each, as large, alive through the backward, and adds it to the gradient it computed "
        "(on the 8-layer Llama of benchmarks/bench_e2e.py, H200, torch.compile's step took 73.64 against 74.26 "
        "ms and 15503 against 15760 MiB with use_cache=False, in one run).",
        suggestion="Call the model with `use_cache=False` in training (or set `model.config.use_cache = False`); "
        "kernel_pytorch.optimize() does so for the causal LMs whose loss it fuses.",
        estimated_gain=f"under torch.compile, about {fmt_bytes(nbytes)} less held through the backward and "
        f"{count} add kernels fewer (estimated from the measured cache)",
        data={"field": name, "tensors": count, "bytes": nbytes},
    )


def _autocast(model: nn.Module, run: MemoryRun, peak: int) -> Finding | None:
    fp32 = sum(s.nbytes for s in run.saved if s.dtype == "float32")
    float_params = [p for p in model.parameters() if p.is_floating_point()]
    if not float_params or float_params[0].dtype.itemsize < 4 or fp32 < _WORTH * peak * 2:
        return None
    device = float_params[0].device.type
    return Finding(
        id="memory.autocast",
        severity=Severity.INFO,
        title=f"fp32 activations: bf16 autocast would about halve the {fmt_bytes(fp32)} saved for backward",
        evidence=f"{fmt_bytes(fp32)} of the saved activations are fp32 (measured).",
        suggestion=f"`with torch.autocast('{device}', dtype=torch.bfloat16): loss = model(...)` (parameters and "
        "their gradients stay fp32; matmuls and their saved inputs become bf16).",
        estimated_gain=f"about {fmt_bytes(fp32 // 2)} less activation memory (estimated: half of the fp32 saved "
        "bytes; norms and softmax keep some in fp32), and faster matmuls on GPUs with bf16 tensor cores",
        data={"fp32_saved": fp32, "freed_bytes": fp32 // 2},
    )


def _gated_recompute(ctx: AnalysisContext, run: MemoryRun, peak: int) -> Finding | None:
    graphs = [g for g in ctx.trace.graphs if g.nodes] if ctx.eager.ok else []
    acts = []
    for g in graphs:
        view = GraphView(g)
        for m in find_gated_activations(view):
            node = view[m.anchor]
            acts.append((node.module_path or "", node.nbytes))
    if not acts:
        return None
    freed = sum(b for _, b in acts)
    if freed < _WORTH * peak:
        return None
    paths = list(dict.fromkeys(p for p, _ in acts))
    comp = component("gated_mlp")
    return Finding(
        id="memory.gated-mlp",
        severity=Severity.INFO,
        title=f"Gated MLPs save their activation output for backward: about {fmt_bytes(freed)} in {len(paths)} MLPs",
        evidence=f"`act(gate) * up` saves `act(gate)` for the multiply's backward, one (tokens, intermediate) "
        f"tensor per MLP ({', '.join(f'`{p}`' for p in paths[:4])}{' ...' if len(paths) > 4 else ''}).",
        suggestion=f"Recompute the activation from `gate` in the backward: {comp.named()} does; meanwhile "
        "`torch.compile` (its min-cut partitioner recomputes cheap elementwise ops rather than saving them).",
        estimated_gain=f"about {fmt_bytes(freed)} less activation memory (estimated from the example shapes), "
        "for one elementwise pass more in the backward",
        data={"modules": paths, "freed_bytes": freed},
    )


__all__ = ["analyze_memory", "repeated_blocks"]
