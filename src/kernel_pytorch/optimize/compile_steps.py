"""The compile-side steps of `optimize()` beside regional compilation, each measured before it is kept:

- `channels_last` for convolution nets (any `nn.Conv2d`): the model's 4-D weights go to
  `torch.channels_last`; the step is timed with the 4-D floating inputs in that layout too. Its
  outputs and gradients are checked against the contiguous layout's (the same math with its sums in
  another order: `tolerances.compare_reordered`). The reference copy that validation uses shares the
  parameters, so it follows the layout and cannot check this itself.
- CUDA graphs where launch-bound: with the blocks compiled on CUDA, the compiled step is profiled and
  the analyser's launch-bound test (`assistant.kernels.efficiency`: GPU idle >= 30% between kernels
  shorter than 20 us) decides whether `mode="reduce-overhead"` is tried; it is kept when faster.
- TF32 for fp32 matmuls, opt-in (`tf32=True`): sets `torch.set_float32_matmul_precision("high")`
  (which turns `torch.backends.cuda.matmul.allow_tf32` on), global state of the process. Checked
  against the fp32 run with TF32's tolerance: TF32 rounds matmul inputs to 10 mantissa bits, as fp16
  does, so the table's fp16 entry applied to each tensor's largest magnitude.

On the CPU nothing here is timed: channels_last is applied only with `compile=True` (unmeasured, its
outputs still checked), CUDA graphs and TF32 do not apply.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import call, map_tensors, tensors
from kernel_pytorch.benchmark.module import benchmark_module, make_pass
from kernel_pytorch.benchmark.timer import Timing, speedup
from kernel_pytorch.optimize.options import CompileOptions
from kernel_pytorch.optimize.report import CompileStep
from kernel_pytorch.tolerances import compare_reordered

NOT_MEASURED = "compile='auto' keeps only measured gains; compile=True applies it"


def fwd_bwd_ms(model: nn.Module, inputs: Any) -> Timing | None:
    """The forward+backward's timing (ms), or None when it cannot run."""
    result = benchmark_module(model, inputs, passes=("fwd+bwd",), measure_memory=False)
    return result.passes["fwd+bwd"].timing


def faster(before: Timing | None, after: Timing | None) -> bool:
    """The slow end (q80) of `after` beats the fast end (q20) of `before`: `speedup`'s low bound above 1."""
    return bool(before and after and speedup(before, after)[1] > 1)


def timing(before: Timing | None, after: Timing | None, names: tuple[str, str]) -> dict[str, float] | None:
    """The two medians under `names` and their ratio, for a step's `measured`; None unless both ran."""
    if not (before and after):
        return None
    return {f"{names[0]}_ms": before.median_ms, f"{names[1]}_ms": after.median_ms,
            "speedup": speedup(before, after)[0]}


@contextlib.contextmanager
def kept_buffers(model: nn.Module) -> Iterator[None]:
    """Put the model's buffers back afterwards: timed and checked calls in train mode must not move
    BatchNorm's running statistics."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def outputs_and_grads(model: nn.Module, inputs: Any) -> list[Tensor]:
    """The forward's tensor outputs, then the gradients (inputs and parameters) of one fwd+bwd with a
    fixed upstream gradient; detached copies. Random ops draw the same numbers on every call (seed 0,
    the caller's RNG state restored after), and the buffers are put back."""
    cuda = sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=cuda), kept_buffers(model):
        torch.manual_seed(0)
        with torch.no_grad():
            outs = [t.detach().clone() for t in tensors(call(model, inputs))]
        torch.manual_seed(0)
        try:
            grads = make_pass(model, inputs, "fwd+bwd")()
        except ValueError:  # no differentiable output: the forward is all there is
            grads = ()
    return outs + [g.detach().clone() for g in grads if g is not None]


def check_same(expected: list[Tensor], actual: list[Tensor], dtype: Callable[[Tensor], torch.dtype]) -> str | None:
    """None when every tensor of `actual` matches `expected` under `compare_reordered` with the
    table's entry for `dtype(tensor)`; else what failed first."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs and gradients against {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if not e.is_floating_point():
            if not torch.equal(e, a):
                return f"tensor {i} ({e.dtype}) differs"
            continue
        c = compare_reordered(a.contiguous(), e.contiguous(), dtype(e))
        if not c.passed:
            return c.message(f"tensor {i} of the outputs and gradients")
    return None


# ----- channels_last -------------------------------------------------------------------------------

def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def channels_last_inputs(inputs: Any) -> Any:
    """`inputs` with every 4-D floating tensor in `torch.channels_last` (others as they are)."""
    def convert(t: Tensor) -> Tensor:
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t

    return map_tensors(convert, inputs)


HOW_INPUTS = ("pass the images as x.to(memory_format=torch.channels_last) too "
              "(kernel_pytorch.optimize.compile_steps.channels_last_inputs)")


def channels_last_step(model: nn.Module, inputs: Any, mode: Any, measurable: bool) -> tuple[CompileStep, bool]:
    """Convert a convolution net to channels_last where it helps. Returns (the step, converted)."""
    if not has_conv2d(model):
        return CompileStep("channels_last", "skipped", "no nn.Conv2d: not a convolution net"), False
    if inputs is None:
        return CompileStep("channels_last", "skipped", "without example inputs: not measured, not applied"), False
    if mode == "auto" and not measurable:
        why = f"not measured on the CPU, so not applied ({NOT_MEASURED})"
        return CompileStep("channels_last", "skipped", why), False
    cl_inputs = channels_last_inputs(inputs)
    with kept_buffers(model):
        return _channels_last(model, inputs, cl_inputs, mode, measurable)


def _channels_last(model: nn.Module, inputs: Any, cl_inputs: Any, mode: Any,
                   measurable: bool) -> tuple[CompileStep, bool]:
    try:
        before = fwd_bwd_ms(model, inputs) if measurable else None
        expected = outputs_and_grads(model, inputs)
        model.to(memory_format=torch.channels_last)
        after = fwd_bwd_ms(model, cl_inputs) if measurable else None
        mismatch = check_same(expected, outputs_and_grads(model, cl_inputs), lambda t: t.dtype)
    except Exception as exc:
        model.to(memory_format=torch.contiguous_format)
        return CompileStep("channels_last", "reverted", f"failed: {short_error(exc, 300)}"), False
    measured = timing(before, after, ("contiguous", "channels_last"))
    if mismatch:
        model.to(memory_format=torch.contiguous_format)
        return CompileStep("channels_last", "reverted", f"outputs differ from the contiguous layout's: {mismatch}",
                           measured), False
    if mode == "auto" and not faster(before, after):
        model.to(memory_format=torch.contiguous_format)
        return CompileStep("channels_last", "reverted", "not faster beyond the timing spread", measured), False
    how = "measured" if measurable else "not measured"
    return CompileStep("channels_last", "applied", f"weights in channels_last ({how}; outputs and gradients "
                       f"match the contiguous layout's); {HOW_INPUTS}", measured), True


# ----- CUDA graphs -----------------------------------------------------------------------------------

def launch_bound(model: nn.Module, inputs: Any) -> tuple[bool, dict[str, float], str]:
    """Profile a few compiled fwd+bwd steps on CUDA; (launch-bound?, the numbers, the evidence)."""
    from kernel_pytorch.assistant.kernels.efficiency import LAUNCH_IDLE, LAUNCH_KERNEL_US, _launch_bound
    from kernel_pytorch.assistant.kernels.profiler import profile_steps

    step = make_pass(model, inputs, "fwd+bwd")
    for _ in range(3):
        step()
    run = profile_steps(step, 5, "cuda", "compiled", "fwd+bwd")
    if run.gpu is None:
        return False, {}, "the profiler saw no kernels"
    numbers = {"idle_fraction": run.gpu.idle_fraction, "median_kernel_us": run.gpu.median_kernel_us}
    finding = _launch_bound("compiled fwd+bwd", run)
    if finding is None:
        return False, numbers, (f"not launch-bound: the GPU is idle {100 * run.gpu.idle_fraction:.0f}% of the "
                                f"step (launch-bound from {100 * LAUNCH_IDLE:.0f}% with kernels under "
                                f"{LAUNCH_KERNEL_US:g} us; median {run.gpu.median_kernel_us:.1f} us)")
    return True, numbers, finding.title


class GradModeGraphs:
    """A block's compiled call with CUDA graphs where gradients are on, plain compiled where they are off.

    Regionally compiled blocks share one compiled function, and under `mode="reduce-overhead"` each
    block's call is a new torch.compile invocation. With gradients off (evaluation, `generate()`) no
    backward is pending, so CUDA graph trees start a new generation at every block and free the
    previous block's output, the next block's input: the second call at a new shape fails with
    "accessing tensor output of CUDAGraphs that has been overwritten". The graphs were measured on the
    training step, so that is where they run; no_grad calls take the default compiled mode.
    """

    def __init__(self, block: nn.Module, options: CompileOptions, mode: str = "reduce-overhead") -> None:
        self.graphs = torch.compile(block._call_impl, **{**options.kwargs(), "mode": mode})
        self.plain = torch.compile(block._call_impl, **{**options.kwargs(), "mode": NO_GRAPHS[mode]})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.graphs if torch.is_grad_enabled() else self.plain)(*args, **kwargs)


# the compile modes that capture CUDA graphs, and the same mode without them
NO_GRAPHS = {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}


def compile_blocks(blocks: list[nn.Module], options: CompileOptions) -> None:
    """`nn.Module.compile(**options.kwargs())` on each block, except that a mode capturing CUDA graphs
    ("reduce-overhead", "max-autotune") applies to calls with gradients only (`GradModeGraphs`), with
    a log line once: under no_grad, regionally compiled blocks' graphs free each other's outputs."""
    mode = options.mode
    if mode not in NO_GRAPHS:
        for b in blocks:
            b.compile(**options.kwargs())
        return
    from kernel_pytorch._env import log_once

    log_once(f"kernel_pytorch.optimize: compile mode {mode!r} (CUDA graphs) applies to the compiled blocks' calls "
             f"with gradients; no_grad calls use mode {NO_GRAPHS[mode]!r}, since CUDA graph trees would free one "
             "block's output before the next block reads it")
    rest = dataclasses.replace(options, mode=None)
    for b in blocks:
        b._compiled_call_impl = GradModeGraphs(b, rest, mode)


def uncompile(blocks: list[nn.Module]) -> None:
    """Undo `nn.Module.compile` on `blocks` (the instance's compiled call is dropped)."""
    for b in blocks:
        b._compiled_call_impl = None


def cuda_graph_step(model: nn.Module, inputs: Any, blocks: list[nn.Module], options: CompileOptions,
                    device: torch.device, mode: Any) -> tuple[CompileStep, bool]:
    """Recompile the compiled blocks with `mode="reduce-overhead"` when the step is launch-bound and
    that is faster. Returns (the step, whether the blocks now use it)."""
    if device.type != "cuda" or inputs is None:
        return CompileStep("cuda_graphs", "skipped", "CUDA graphs need a CUDA device: not applicable on the CPU"), False
    if not blocks:
        return CompileStep("cuda_graphs", "skipped", "nothing is compiled (regional compilation not kept)"), False
    if options.mode is not None:
        return CompileStep("cuda_graphs", "skipped", f"compile_options sets mode={options.mode!r}"), False
    try:
        with kept_buffers(model):
            bound, numbers, evidence = launch_bound(model, inputs)
    except Exception as exc:
        return CompileStep("cuda_graphs", "skipped", f"profiling failed: {short_error(exc, 300)}"), False
    if not bound:
        return CompileStep("cuda_graphs", "skipped", evidence, numbers or None), False

    def recompile(opts: CompileOptions) -> None:
        uncompile(blocks)
        compile_blocks(blocks, opts)

    try:
        with kept_buffers(model):
            before = fwd_bwd_ms(model, inputs)
            recompile(dataclasses.replace(options, mode="reduce-overhead"))  # graphs for calls with gradients only
            after = fwd_bwd_ms(model, inputs)
    except Exception as exc:
        recompile(options)
        return CompileStep("cuda_graphs", "reverted", f"{evidence}; reduce-overhead failed: {short_error(exc, 300)}",
                           numbers), False
    measured = {**numbers, **(timing(before, after, ("compiled", "cuda_graphs")) or {})}
    if mode == "auto" and not faster(before, after):
        recompile(options)
        return CompileStep("cuda_graphs", "reverted", f"{evidence}; reduce-overhead not faster beyond the timing "
                           "spread", measured), False
    return CompileStep("cuda_graphs", "applied", f"{evidence}; blocks compiled with mode='reduce-overhead' for "
                       "calls with gradients (no_grad calls run the default compiled mode)", measured), True


# ----- TF32 ---------------------------------------------------------------------------------------

GLOBAL = ("global state: torch.set_float32_matmul_precision('high') changes every fp32 matmul in this "
          "process, not only this model's, and stays set after optimize() returns")


def _tf32_dtype(t: Tensor) -> torch.dtype:
    # TF32 keeps 10 mantissa bits, as fp16 does: fp32 tensors get the table's fp16 entry
    return torch.float16 if t.dtype == torch.float32 else t.dtype


def tf32_step(model: nn.Module, inputs: Any, requested: bool, device: torch.device, mode: Any) -> CompileStep:
    """Turn TF32 on for fp32 matmuls when asked, on CUDA, if the outputs stay within TF32's tolerance
    and the step is faster (with compile=True: whether faster or not). Restores the previous setting
    when not kept."""
    if not requested:
        return CompileStep("tf32", "skipped", "opt-in (tf32=True): the fp32 matmul precision is left as it is")
    if device.type != "cuda":
        return CompileStep("tf32", "skipped", "TF32 is a CUDA matmul mode: not applicable on the CPU; "
                           "global state unchanged")
    if torch.cuda.get_device_capability(device) < (8, 0):
        return CompileStep("tf32", "skipped", "TF32 needs an Ampere or later GPU; global state unchanged")
    if not any(p.dtype == torch.float32 for p in model.parameters()):
        return CompileStep("tf32", "skipped", "no fp32 weights, so no fp32 matmuls; global state unchanged")
    old_precision = torch.get_float32_matmul_precision()
    if old_precision != "highest" or torch.backends.cuda.matmul.allow_tf32:
        return CompileStep("tf32", "skipped", f"already on (float32 matmul precision {old_precision!r}, set "
                           "before optimize()); left as it is")
    if inputs is None:
        return CompileStep("tf32", "skipped", "without example inputs: not checked, not applied")

    with kept_buffers(model):
        return _tf32(model, inputs, old_precision, mode)


def _tf32(model: nn.Module, inputs: Any, old_precision: str, mode: Any) -> CompileStep:
    def restore() -> None:
        torch.set_float32_matmul_precision(old_precision)
        if torch.backends.cuda.matmul.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = False

    try:
        before = fwd_bwd_ms(model, inputs)
        expected = outputs_and_grads(model, inputs)
        torch.set_float32_matmul_precision("high")
        if not torch.backends.cuda.matmul.allow_tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
        after = fwd_bwd_ms(model, inputs)
        mismatch = check_same(expected, outputs_and_grads(model, inputs), _tf32_dtype)
    except Exception as exc:
        restore()
        return CompileStep("tf32", "reverted", f"failed: {short_error(exc, 300)}; restored")
    measured = timing(before, after, ("fp32", "tf32"))
    if mismatch:
        restore()
        return CompileStep("tf32", "reverted", f"outside TF32's tolerance: {mismatch}; restored", measured)
    if mode is not True and not faster(before, after):  # compile=True alone keeps it unmeasured-faster
        restore()
        return CompileStep("tf32", "reverted", f"not faster beyond the timing spread; {old_precision!r} "
                           "precision restored", measured)
    return CompileStep("tf32", "applied", "TF32 on for fp32 matmuls, validated with the fp32 tolerance relaxed "
                       f"to TF32's (the table's fp16 entry); {GLOBAL}; undo with "
                       f"torch.set_float32_matmul_precision({old_precision!r})", measured)


__all__ = ["channels_last_inputs", "channels_last_step", "cuda_graph_step", "has_conv2d", "tf32_step",
           "uncompile"]
