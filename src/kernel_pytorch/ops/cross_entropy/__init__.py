"""The cross-entropy family's kernels, launchers and registered ops.

    config.py                 the launch configs (tuning families "cross_entropy", "fused_linear_cross_entropy")
    kernels.py                the two-pass forward kernel and the elementwise backward kernel
    stats.py                  the means' denominators and the class-weight total, on the device
    launch.py                 their launchers and `cross_entropy_fwd` / `cross_entropy_bwd`
    one_read.py               the fused loss's one-read forward kernel and its launcher
    fused_linear.py           the fused linear cross-entropy's chunked algorithm
    schema.py                 CrossEntropyOptions flattened into the ops' arguments, once
    register.py               kernel_pytorch::cross_entropy_fwd / _bwd, `cross_entropy_eager`
    fused_linear_register.py  kernel_pytorch::fused_linear_cross_entropy_fwd / _bwd, `..._eager`
    vocab_parallel.py         one rank's chunks of the vocabulary-parallel fused loss: its stats and
                              gradient kernels, with the group's all-reduces between them

The options are reference.cross_entropy.CrossEntropyOptions; the math is reference/cross_entropy.py.
"""

from kernel_pytorch.ops._common.scale import scale_grad_, scaled_grad
from kernel_pytorch.ops.cross_entropy import fused_linear, vocab_parallel
from kernel_pytorch.ops.cross_entropy.config import (
    CrossEntropyConfig,
    FusedLinearCrossEntropyConfig,
    FwdLaunch,
    OnePassLaunch,
)
from kernel_pytorch.ops.cross_entropy.fused_linear import (
    FusedLinearArgs,
    FusedLinearCrossEntropyForward,
    chunk_rows,
    fused_linear_cross_entropy_bwd,
    fused_linear_cross_entropy_fwd,
)
from kernel_pytorch.ops.cross_entropy.fused_linear_register import fused_linear_cross_entropy_eager
from kernel_pytorch.ops.cross_entropy.launch import CrossEntropyForward, cross_entropy_bwd, cross_entropy_fwd
from kernel_pytorch.ops.cross_entropy.register import cross_entropy_eager
from kernel_pytorch.ops.cross_entropy.stats import cross_entropy_stats

__all__ = [
    "CrossEntropyConfig",
    "CrossEntropyForward",
    "FusedLinearArgs",
    "FusedLinearCrossEntropyConfig",
    "FusedLinearCrossEntropyForward",
    "FwdLaunch",
    "OnePassLaunch",
    "chunk_rows",
    "cross_entropy_bwd",
    "cross_entropy_eager",
    "cross_entropy_fwd",
    "cross_entropy_stats",
    "fused_linear",
    "fused_linear_cross_entropy_bwd",
    "fused_linear_cross_entropy_eager",
    "fused_linear_cross_entropy_fwd",
    "scale_grad_",
    "scaled_grad",
    "vocab_parallel",
]
