"""Functional entry points, one module per family (norm.py, activation.py, mlp.py, linears.py, rope.py, embedding.py,
attention.py, cross_entropy.py and its tensor-parallel vocab_parallel_cross_entropy.py, quant_linear.py): validate
the arguments once (eager only), pick a backend, dispatch.

backend:
    "auto"      Triton kernels on CUDA; on CPU the registered op's reference kernel; the pure-torch
                reference anywhere else. Why the Triton path is not taken is logged once.
                One exception, also logged once: `layer_norm` runs ATen's fused layer_norm, whether or
                not the Triton path is active, for an eager call (not compiling) that records gradients
                (grad mode on; x, weight or bias requires grad) on a non-empty CUDA x of at most
                ATEN_LAYER_NORM_MAX_NUMEL elements and a kernel dtype (fp32/bf16/fp16), with weight and
                bias (where given) of x's dtype: there the call is host-bound (functional/norm.py says
                how much). That route runs our argument checks only when ATen refuses the arguments;
                they then raise our error naming the argument (where they pass, ATen's error stands).
    "triton"    the Triton kernels, or a ValueError saying why they cannot run here.
    "reference" the pure-torch specification in kernel_pytorch.reference (autograd through torch).

casting (rms_norm, add_rms_norm): where the result rounds to a bf16/fp16 x's dtype, one of CASTINGS:
    "llama" (the default: HF LlamaRMSNorm), "gemma" (HF GemmaRMSNorm), "torch" (torch.nn.RMSNorm) or
    "none" (Liger-Kernel's math in the input dtype).

In eager mode on CUDA the kernels are launched through a thin autograd.Function (same launchers, less
host time than the op dispatcher); under torch.compile / torch.export the registered ops
`torch.ops.kernel_pytorch.*` appear in the graph. Backend resolution and the shared checks are in
functional/_dispatch.py.

Triton is imported with kernel_pytorch.ops on the first call that needs a kernel, not by
`import kernel_pytorch`: where it is missing, "auto" runs the reference (and logs once that Triton is
not installed), "triton" raises saying so.
"""

from kernel_pytorch.functional._dispatch import Backend
from kernel_pytorch.functional.activation import (
    bias_act,
    gated_act,
    gated_act_packed,
    geglu,
    geglu_packed,
    swiglu,
    swiglu_packed,
)
from kernel_pytorch.functional.attention import AttentionBackend, attention, prepare_mask, seq_ids_from_cu_seqlens
from kernel_pytorch.functional.cross_entropy import LossOutput, cross_entropy, fused_linear_cross_entropy
from kernel_pytorch.functional.embedding import embedding
from kernel_pytorch.functional.linears import shared_input_linears
from kernel_pytorch.functional.mlp import bias_act_mlp, gated_mlp, gated_mlp_packed
from kernel_pytorch.functional.norm import ATEN_LAYER_NORM_MAX_NUMEL, add_rms_norm, layer_norm, rms_norm
from kernel_pytorch.functional.quant_linear import quant_linear
from kernel_pytorch.functional.rope import apply_rotary
from kernel_pytorch.functional.vocab_parallel_cross_entropy import vocab_parallel_linear_cross_entropy
from kernel_pytorch.reference.positions import seq_ids_from_position_ids
from kernel_pytorch.reference.rms_norm import CASTINGS, Casting

__all__ = [
    "ATEN_LAYER_NORM_MAX_NUMEL",
    "CASTINGS",
    "AttentionBackend",
    "Backend",
    "Casting",
    "LossOutput",
    "add_rms_norm",
    "apply_rotary",
    "attention",
    "bias_act",
    "bias_act_mlp",
    "cross_entropy",
    "embedding",
    "fused_linear_cross_entropy",
    "gated_act",
    "gated_act_packed",
    "gated_mlp",
    "gated_mlp_packed",
    "geglu",
    "geglu_packed",
    "layer_norm",
    "prepare_mask",
    "quant_linear",
    "rms_norm",
    "shared_input_linears",
    "seq_ids_from_cu_seqlens",
    "seq_ids_from_position_ids",
    "swiglu",
    "swiglu_packed",
    "vocab_parallel_linear_cross_entropy",
]
