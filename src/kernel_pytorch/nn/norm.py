"""Norm modules: drop-ins for torch.nn.RMSNorm / torch.nn.LayerNorm, and a fused add+RMSNorm.

The drop-ins subclass the torch modules and override `forward` only, so constructor, parameter names,
`state_dict` keys and `repr` are torch's (RMSNorm adds one keyword, `casting`, shown in its repr only
when not "torch"). A multi-dim `normalized_shape` is normalised as one flattened row, which is what
torch does.

casting (functional.rms_norm): where a bf16/fp16 result rounds. RMSNorm defaults to "torch", the
rounding of the torch.nn.RMSNorm it replaces; FusedAddRMSNorm, which takes HF's parameter names, to
"llama". Where one of ours replaces a Hugging Face norm, pass that model's: "llama" for LlamaRMSNorm
(and the many norms written like it), "gemma" with offset=1.0 for GemmaRMSNorm.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernel_pytorch import functional as F
from kernel_pytorch._env import is_plain_tensor
from kernel_pytorch.functional import Backend, Casting
from kernel_pytorch.functional._dispatch import _exporting
from kernel_pytorch.nn._recompute import recompute_in_backward, remember
from kernel_pytorch.reference.rms_norm import rounds_normed


def _flatten_normalized(x: Tensor, normalized_shape: tuple[int, ...]) -> tuple[Tensor, int]:
    """View x (..., *normalized_shape) as (..., prod(normalized_shape))."""
    k = len(normalized_shape)
    if tuple(x.shape[x.dim() - k :]) != tuple(normalized_shape):
        raise ValueError(
            f"x of shape {tuple(x.shape)} does not end in normalized_shape {tuple(normalized_shape)}"
        )
    if k == 1:
        return x, x.shape[-1]
    return x.reshape(*x.shape[: x.dim() - k], -1), math.prod(normalized_shape)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm running kernel_pytorch's RMSNorm (Triton on CUDA).

    Same arguments as torch.nn.RMSNorm, plus keyword-only `casting` ("torch", the default: rounds as
    torch.nn.RMSNorm does; "llama" or "gemma" where it stands in for a Hugging Face norm; "none" for
    Liger-Kernel's math in the input dtype; functional.rms_norm) and `offset` (added to the weight: 1.0
    for Gemma-style norms, whose weight then starts at 0). forward: x (..., *normalized_shape) -> same shape and dtype.
    `backend` may be set on an instance ("auto", "triton", "reference").
    """

    backend: Backend = "auto"
    casting: Casting = "torch"  # class defaults too: modules pickled before the arguments existed load
    offset: float = 0.0
    # True (optimize() sets it): in eager mode, recording gradients, the output is remembered, and the
    # modules that enter nn._recompute.recompute_norm_outputs() (our attention and gated MLP) keep for
    # their backward not the output but a way to make it again (a few microseconds); under
    # torch.compile, training, the compiled backward makes the output again, whoever consumes it
    # (nn._recompute.recompute_in_backward); False: the output is kept where a consumer saves it
    recompute_output: bool = False
    # Under torch.compile, training, with recompute_output: "inductor" hands the norm's math (the reference,
    # plain torch ops) to Inductor, which fuses it with the residual add before it and, in the backward, the
    # output's recompute and the gradient add after it; "op" keeps our registered op, which Inductor cannot
    # fuse with anything. On the e2e training step (H200, 2026-11-29, docs/performance.md) "inductor"
    # ran 1.9 ms less kernel time a step and the step took 61.55 against 62.33 ms. A backend set on the
    # instance ("triton", "reference") is kept as given.
    compiled_norm: str = "inductor"

    def __init__(
        self,
        normalized_shape: int | list[int] | torch.Size,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        casting: Casting = "torch",
        offset: float = 0.0,
    ) -> None:
        rounds_normed(casting)  # an unknown casting fails here, not at the first forward
        self.offset = float(offset)  # before super().__init__, which calls reset_parameters
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self.casting = casting

    def reset_parameters(self) -> None:
        """Weight ones, or zeros when an offset of 1 makes (offset + weight) start at one."""
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.offset)

    def forward(self, x: Tensor) -> Tensor:
        if self.recompute_output and torch.compiler.is_compiling():
            # constants to Dynamo (grad mode is guarded on): no branch left in the graph
            if torch.is_grad_enabled() and not _exporting():
                return recompute_in_backward(self._compiled_normed, x)
            return self._normed(x)
        out = self._normed(x)
        if self.recompute_output and out.requires_grad and is_plain_tensor(out):  # not a DTensor's shard
            remember(out, self, x, self.weight)
        return out

    def _compiled_normed(self, x: Tensor) -> Tensor:
        """The norm as a compiled training graph runs it (`compiled_norm`)."""
        inductor = self.compiled_norm == "inductor" and self.backend == "auto"
        return self._normed(x, "reference" if inductor else self.backend)

    def _normed(self, x: Tensor, backend: Backend | None = None) -> Tensor:
        x2, d = _flatten_normalized(x, tuple(self.normalized_shape))
        eps = self.eps
        if eps is None:  # torch's default; a non-float x goes on to F.rms_norm, whose error names it
            eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0
        weight = self.weight.reshape(-1) if self.weight is not None else x.new_ones(d)
        offset = self.offset if self.weight is not None else 0.0  # no weight: a scale of exactly one
        out = F.rms_norm(x2, weight, eps, offset=offset, casting=self.casting, backend=backend or self.backend)
        return out.view(x.shape)

    def extra_repr(self) -> str:
        casting = "" if self.casting == "torch" else f", casting={self.casting!r}"
        offset = f", offset={self.offset}" if self.offset else ""
        return super().extra_repr() + casting + offset


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm running kernel_pytorch's LayerNorm (Triton on CUDA).

    Same arguments as torch.nn.LayerNorm. forward: x (..., *normalized_shape) -> same shape and dtype.
    """

    backend: Backend = "auto"

    def forward(self, x: Tensor) -> Tensor:
        x2, _ = _flatten_normalized(x, tuple(self.normalized_shape))
        weight = self.weight.reshape(-1) if self.weight is not None else None
        bias = self.bias.reshape(-1) if self.bias is not None else None
        return F.layer_norm(x2, weight, bias, self.eps, backend=self.backend).view(x.shape)


class FusedAddRMSNorm(torch.nn.Module):
    """Residual add + RMSNorm in one kernel, with HF Llama's parameter names (`weight`,
    `variance_epsilon`) so a `LlamaRMSNorm` state_dict loads into it unchanged.

    Args:
        hidden_size: D.
        eps: added to the mean square.
        offset: added to the weight (1.0 for Gemma-style norms, whose weight starts at 0).
        casting: where the normed output rounds: "llama" (the default, HF LlamaRMSNorm), "gemma"
            (HF GemmaRMSNorm, with offset=1.0) or "torch" (functional.rms_norm).
    forward(x, residual): both (..., D) -> (normed, x + residual), both (..., D).
    """

    backend: Backend = "auto"
    casting: Casting = "llama"  # class default too, as in RMSNorm

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        offset: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        casting: Casting = "llama",
    ) -> None:
        rounds_normed(casting)
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.offset = offset
        self.casting = casting

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return F.add_rms_norm(
            x, residual, self.weight, self.variance_epsilon, offset=self.offset, casting=self.casting,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        casting = "" if self.casting == "llama" else f", casting={self.casting!r}"
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, offset={self.offset}{casting}"
