"""The cross-entropy suite: cross-entropy over a large vocabulary, and the fused linear + cross-entropy
of a language-model head, against the usual peers.

Providers (see suites/providers.py; the runner is suites/runner.py):
    ours     kernel_pytorch.functional.{cross_entropy, fused_linear_cross_entropy}; backend="triton" on
             CUDA (on CPU the registered ops' CPU kernels, which are the reference).
    eager    the code as Hugging Face transformers writes it: the causal-LM loss upcasts the logits
             (`logits.float()`) before torch's cross_entropy; the fused loss's eager code is the lm_head
             GEMM (`hidden @ weight.T`) then that loss.
    compile  torch.compile(fullgraph=True, dynamic=False) of that eager code.
    liger    Liger-Kernel's LigerCrossEntropyLoss / LigerFusedLinearCrossEntropyLoss when importable.
             Liger's cross-entropy writes its gradient over the logits (the gate runs every provider
             on copies of the inputs, so the reference is not affected).
    gemms    the fused loss's floor: its three GEMMs alone, by cuBLAS (`x @ W.T`, then `g @ W` and
             `g.T @ x` in its backward on a fixed random (N, V) gradient g, `_ThreeGemms`), timed in the
             same run and not gated (it is not the loss): the target "<= 1.1x the same three GEMMs"
             compares ours to it.

Bytes are the minimum each pass must move (N tokens, V vocabulary, H hidden, s element size):
    cross_entropy   fwd: read the logits                         N V s   (+ 8 N for the targets)
                    bwd: write the gradient                      N V s
    fused linear    fwd: read x and W                            (N H + V H) s
                    bwd: write grad_x and grad_W                 (N H + V H) s
FLOPs: cross-entropy ~6 per logit forward, 4 backward (nominal); the fused loss 2 N H V forward (the
logits GEMM) and 4 N H V backward (grad_x and grad_W GEMMs), so its "% of matmul" column is how close it
comes to the three GEMMs done by cuBLAS (the <= 1.1x target reads as >= ~91% there, against the
ceiling's own GEMM shape). Peak memory per row is the point of the fused loss.

The timed fwd+bwd passes an upstream gradient of 1, as `loss.backward()` does in training (a loss that
scales its precomputed gradient may skip a factor of 1); the correctness gate draws a random one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import functional as kpf
from kernel_pytorch import reference
from kernel_pytorch.benchmark.suites.spec import ExtraProvider, ModulePeer, OpBench, Shape, Suite, generator

NAME = "cross_entropy"
IGNORE_FRACTION = 16  # one target in 16 is ignore_index (padding / prompt tokens), as in real batches


def tokens_vocab(tokens: int, vocab: int, config: str) -> Shape:
    """A cross-entropy problem: `tokens` rows of `vocab` logits."""
    return Shape.of(config, tokens=tokens, vocab=vocab)


def tokens_hidden_vocab(tokens: int, hidden: int, vocab: int, config: str) -> Shape:
    """A fused linear + cross-entropy problem: `tokens` hidden states of `hidden` features, `vocab` classes."""
    return Shape.of(config, tokens=tokens, hidden=hidden, vocab=vocab)


CE_CUDA_SHAPES = (
    tokens_vocab(8192, 128256, "Llama-3: vocabulary 128256, 8192 tokens per step"),
    tokens_vocab(16384, 128256, "Llama-3: vocabulary 128256, 16384 tokens per step"),
    tokens_vocab(4096, 262144, "Gemma-3: vocabulary 262144, 4096 tokens"),
)
FLCE_CUDA_SHAPES = (
    tokens_hidden_vocab(8192, 4096, 128256, "Llama-3-8B: hidden 4096, vocabulary 128256, 8192 tokens"),
    tokens_hidden_vocab(16384, 4096, 128256, "Llama-3-8B: hidden 4096, vocabulary 128256, 16384 tokens"),
    tokens_hidden_vocab(8192, 3840, 262144, "Gemma-3-12B: hidden 3840, vocabulary 262144, 8192 tokens"),
)
CE_CPU_SHAPES = (tokens_vocab(64, 4096, "CPU smoke: 64 tokens, vocabulary 4096"),)
FLCE_CPU_SHAPES = (tokens_hidden_vocab(64, 256, 4096, "CPU smoke: 64 tokens, hidden 256, vocabulary 4096"),)
CE_QUICK = {"cuda": tokens_vocab(1024, 32000, "Llama-2: vocabulary 32000, 1024 tokens"),
            "cpu": tokens_vocab(16, 1024, "CPU smoke: 16 tokens, vocabulary 1024")}
FLCE_QUICK = {"cuda": tokens_hidden_vocab(1024, 2048, 32000, "Llama-2: hidden 2048, vocabulary 32000, 1024 tokens"),
              "cpu": tokens_hidden_vocab(16, 64, 1024, "CPU smoke: 16 tokens, hidden 64, vocabulary 1024")}


# ---- the eager code, as Hugging Face transformers writes it --------------------------------------


def hf_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """The causal-LM loss of transformers (loss_utils.ForCausalLMLoss, labels already shifted): the
    logits upcast to fp32, then torch's cross_entropy, mean over the counted tokens."""
    return torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=-100, reduction="mean")


def hf_linear_cross_entropy(x: Tensor, weight: Tensor, target: Tensor) -> Tensor:
    """lm_head (a bias-free Linear) then the causal-LM loss."""
    return hf_cross_entropy(x @ weight.t(), target)


# ---- the two op benchmarks -----------------------------------------------------------------------


def _target(draw_device: torch.device, n: int, vocab: int, seed: int) -> Tensor:
    gen = torch.Generator(device=draw_device).manual_seed(seed + 1)
    t = torch.randint(0, vocab, (n,), generator=gen, device=draw_device)
    t[::IGNORE_FRACTION] = -100
    return t


# The gate's fp64 reference holds a few (tokens, vocab) fp64 tensors at once (logits, log-softmax, the
# gradient): at 2^30 logits that is ~25 GiB beside the providers' own; past it the gate runs on the first
# tokens that fit (the rows say so) and the timing stays at the full shape.
GATE_LOGITS = 1 << 30


def gate_shape(shape: Shape) -> Shape:
    """The shape the correctness gate runs at: `shape` itself when tokens x vocab <= GATE_LOGITS, else
    fewer tokens (a power of two), the other dims unchanged."""
    tokens = shape.tokens
    while tokens > 1 and tokens * shape.vocab > GATE_LOGITS:
        tokens //= 2
    return Shape(tuple((k, tokens if k == "tokens" else v) for k, v in shape.dims), shape.config)


def _ce_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    """logits (tokens, vocab) ~ 2 N(0, 1) rounded once to `dtype`; targets with every 16th ignored."""
    logits = (2.0 * generator(device, seed)(shape.tokens, shape.vocab)).to(dtype)
    return {"logits": logits, "target": _target(device, shape.tokens, shape.vocab, seed)}


def _flce_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int) -> dict[str, Tensor]:
    """x (tokens, hidden) ~ N(0, 1); weight (vocab, hidden) ~ N(0, 1 / hidden), as an initialised
    lm_head gives logits of unit scale; targets with every 16th ignored."""
    draw = generator(device, seed)
    x = draw(shape.tokens, shape.hidden).to(dtype)
    weight = (draw(shape.vocab, shape.hidden) * shape.hidden ** -0.5).to(dtype)
    return {"x": x, "weight": weight, "target": _target(device, shape.tokens, shape.vocab, seed)}


GEMMS_NOTE = ("the floor: the three GEMMs alone, x @ W.T, then g @ W and g.T @ x on a random (N, V) gradient g "
              "(cuBLAS on CUDA)")
_FLOOR_GRAD: dict[tuple, Tensor] = {}  # the floor's logits gradient, one shape at a time


class _ThreeGemms(torch.autograd.Function):
    """logits = x @ W.T; backward grad_x = g @ W, grad_W = g.T @ x with a fixed random g, not the upstream
    gradient: the timed upstream gradient is ones, and GEMMs on constant data run faster than on a
    loss's gradient (lower power, higher clocks), which would make the floor too low."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, g: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(x, weight, g)
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, None]:  # noqa: ANN001
        x, weight, g = ctx.saved_tensors
        return g @ weight, g.t() @ x, None


def _floor_grad(n: int, v: int, like: Tensor) -> Tensor:
    key = (n, v, like.dtype, like.device)
    if key not in _FLOOR_GRAD:
        _FLOOR_GRAD.clear()  # one shape's buffer at a time
        draw = generator(like.device, 7)
        _FLOOR_GRAD[key] = (draw(n, v) * 1e-3).to(like.dtype)
    return _FLOOR_GRAD[key]


def _gemms(x: Tensor, weight: Tensor, target: Tensor) -> Tensor:
    """The fused loss's three GEMMs and nothing else: logits (N, V) = x @ W.T forward; grad_x and grad_W
    GEMMs on a random (N, V) gradient backward (`_ThreeGemms`)."""
    del target
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return x @ weight.t()
    return _ThreeGemms.apply(x, weight, _floor_grad(x.shape[0], weight.shape[0], x))


CROSS_ENTROPY = OpBench(
    name="cross_entropy", make_inputs=_ce_inputs,
    arg_names=("logits", "target"), grad_names=("logits",), param_names=(), out_names=("loss",),
    reference=lambda logits, target: reference.cross_entropy(logits, target),
    eager=hf_cross_entropy,
    ours=lambda logits, target, *, backend: kpf.cross_entropy(logits, target, backend=backend),
    liger=ModulePeer(target="liger_kernel.transformers.cross_entropy:LigerCrossEntropyLoss", init_args=lambda t: (),
                     call=("logits", "target"), out_dtype=torch.float32,
                     note="writes its gradient over the logits (no gradient buffer); its loss comes in the "
                          "logits' dtype and is cast to fp32 as torch's and ours are"),
    min_bytes=lambda s, es: (s.tokens * s.vocab * es + 8 * s.tokens, s.tokens * s.vocab * es),
    flops=lambda s: (6 * s.tokens * s.vocab, 4 * s.tokens * s.vocab),
    cuda_shapes=CE_CUDA_SHAPES, cpu_shapes=CE_CPU_SHAPES, quick_shapes=CE_QUICK, unit_upstream=True,
    gate_shape=gate_shape,
)
FUSED_LINEAR_CROSS_ENTROPY = OpBench(
    name="fused_linear_cross_entropy", make_inputs=_flce_inputs,
    arg_names=("x", "weight", "target"), grad_names=("x", "weight"), param_names=("weight",), out_names=("loss",),
    reference=lambda x, weight, target: reference.fused_linear_cross_entropy(x, weight, target),
    eager=hf_linear_cross_entropy,
    ours=lambda x, weight, target, *, backend: kpf.fused_linear_cross_entropy(x, weight, target, backend=backend),
    liger=ModulePeer(target="liger_kernel.transformers.fused_linear_cross_entropy:LigerFusedLinearCrossEntropyLoss",
                     init_args=lambda t: (), call=("weight", "x", "target")),
    min_bytes=lambda s, es: ((s.tokens + s.vocab) * s.hidden * es + 8 * s.tokens,
                             (s.tokens + s.vocab) * s.hidden * es),
    flops=lambda s: (2 * s.tokens * s.hidden * s.vocab, 4 * s.tokens * s.hidden * s.vocab),
    cuda_shapes=FLCE_CUDA_SHAPES, cpu_shapes=FLCE_CPU_SHAPES, quick_shapes=FLCE_QUICK, unit_upstream=True,
    gate_shape=gate_shape,
    extras=(ExtraProvider("gemms", lambda device: (_gemms, GEMMS_NOTE), floor=True),),
)

SPECS = {s.name: s for s in (CROSS_ENTROPY, FUSED_LINEAR_CROSS_ENTROPY)}
SUITE = Suite(NAME, tuple(SPECS.values()))

__all__ = ["CROSS_ENTROPY", "FUSED_LINEAR_CROSS_ENTROPY", "NAME", "SPECS", "SUITE", "gate_shape", "hf_cross_entropy",
           "hf_linear_cross_entropy", "tokens_hidden_vocab", "tokens_vocab"]
