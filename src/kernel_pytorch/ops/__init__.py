"""Triton kernels registered as torch ops under the `kernel_pytorch::` namespace.

Importing this package registers every op; call them as `torch.ops.kernel_pytorch.<name>`.
"""

from kernel_pytorch.ops import add_rms_norm, layer_norm, rms_norm  # noqa: F401  (registration)

__all__ = ["add_rms_norm", "layer_norm", "rms_norm"]
