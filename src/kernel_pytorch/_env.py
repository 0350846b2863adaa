"""Environment facts shared by every layer: is the Triton path usable, which dtypes the kernels take,
and one-time log lines.

This module sits below `reference` and imports nothing of ours, so any layer may use it. It never
imports Triton at import time: `import kernel_pytorch` must work where Triton is missing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import sys
from collections.abc import Iterator

import torch

logger = logging.getLogger("kernel_pytorch")

# The dtypes our kernels are written for (fp32 accumulation in all of them); here rather than in ops, so
# that functional can ask without importing Triton.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def triton_version() -> str | None:
    """The installed Triton version, or None when Triton cannot be imported (imports it otherwise)."""
    try:
        # find_spec answers None for an absent package, but may raise (a finder's ImportError, a
        # None entry in sys.modules); a spec found does not mean the import works
        if importlib.util.find_spec("triton") is None:
            return None
        import triton
    except Exception:  # a broken install is reported by `doctor`, not raised here
        return None
    return str(triton.__version__)


def triton_status(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether our Triton kernels can run on `device` (default: the current CUDA device), and why.

    Returns:
        (active, reason): reason is a short human sentence, suitable for a log line.
    """
    if device.__class__ is torch.device and device.index is not None:
        # the functional layer asks with x.device on every call: a CUDA device answered before is
        # one lookup (torch.device(), is_available() and the index cost a few microseconds)
        known = _CUDA_STATUS.get(device.index) if device.type == "cuda" else None
        if known is not None:
            return known
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        if triton_version() is None:
            return False, "triton is not installed"
        return False, f"tensors are on {dev.type}; the Triton kernels run on CUDA devices"
    if not torch.cuda.is_available():
        return False, "no CUDA device is available"
    index = dev.index if dev is not None and dev.index is not None else torch.cuda.current_device()
    status = _CUDA_STATUS.get(index)
    if status is None:
        status = _CUDA_STATUS[index] = _cuda_triton_status(index)
    return status


# device index -> triton_status of that CUDA device, once asked (CUDA does not come and go in a process;
# device queries cost tens of microseconds, and every op call asks)
_CUDA_STATUS: dict[int, tuple[bool, str]] = {}


def _cuda_triton_status(index: int) -> tuple[bool, str]:
    if triton_version() is None:
        return False, "triton is not installed"
    major, minor = torch.cuda.get_device_capability(index)
    if major < 7:
        return False, f"CUDA capability {major}.{minor} is below 7.0, the oldest Triton supports"
    return True, f"Triton {triton_version()} on {torch.cuda.get_device_name(index)}"


def is_plain_tensor(t: object) -> bool:
    """Whether `t` is a torch.Tensor or Parameter of no subclass. A subclass (a torchao-quantized weight, a
    DTensor) runs its own ops, which our kernels would bypass. No `detach()`: per-call paths ask it, so a
    Parameter subclass counts as a subclass here (deploy's `is_subclass` looks through it)."""
    return type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def is_dtensor(t: object) -> bool:
    """Whether `t` is a DTensor (torch.distributed's sharded or replicated tensor: FSDP2's parameters,
    tensor parallelism's). Imports nothing: no DTensor exists before torch.distributed.tensor is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


@functools.cache
def log_once(message: str, level: int = logging.INFO) -> None:
    """Log `message` the first time it is seen in this process (the cache is the memory)."""
    logger.log(level, message)


def recompile_limit_name() -> str:
    """The config name of Dynamo's per-frame compile limit: `recompile_limit`, `cache_size_limit` before."""
    return "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"


def recompile_limit() -> int:
    """The current per-frame compile limit."""
    return int(getattr(torch._dynamo.config, recompile_limit_name()))


@contextlib.contextmanager
def recompile_headroom(limit: int) -> Iterator[None]:
    """Raise Dynamo's per-frame compile limit to at least `limit` for a while: one compiled function
    that meets many shapes (a benchmark sweep) would otherwise fall back to eager silently."""
    with torch._dynamo.config.patch(**{recompile_limit_name(): max(limit, recompile_limit())}):
        yield
