"""The cross-entropy family's modules: a drop-in for torch.nn.CrossEntropyLoss, the fused linear +
cross-entropy loss of a language-model head, and that loss over a head split by vocabulary rows
(tensor parallelism: `VocabParallelLinearCrossEntropyLoss`).

`CrossEntropyLoss` subclasses torch's and overrides `forward` only (constructor arguments, the `weight`
buffer, `state_dict` keys and `repr` are torch's); it adds keyword-only options torch lacks. Inputs
torch lays out with the class dim second ((N, C, d1, ...)) are viewed class-last; class-probability
targets are handed to torch's own forward.

Both modules take Liger-Kernel's `return_z_loss`, `return_token_accuracy` and `return_predicted_tokens`
in the constructor (a forward then returns a `LossOutput`: functional/cross_entropy.py) and a per-token
`token_scale` in the forward. Their options stay attributes (torch's, for CrossEntropyLoss), read into
one `CrossEntropyOptions` at each forward, so a changed attribute takes effect.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernel_pytorch.functional import Backend, LossOutput
from kernel_pytorch.functional._vocab_shards import Group
from kernel_pytorch.functional.cross_entropy import cross_entropy_with, fused_linear_cross_entropy_with
from kernel_pytorch.functional.vocab_parallel_cross_entropy import vocab_parallel_linear_cross_entropy_with
from kernel_pytorch.reference.cross_entropy import CrossEntropyOptions


class _Options:
    """What both loss modules keep beside torch's attributes: the options torch lacks, the return_*
    flags (functional/cross_entropy.py gives their meaning), and the `CrossEntropyOptions` they make."""

    ignore_index: int
    reduction: str
    label_smoothing: float

    def _set_options(self, lse_square_scale: float, softcap: float | None, return_z_loss: bool,
                     return_token_accuracy: bool, return_predicted_tokens: bool) -> None:
        self.lse_square_scale, self.softcap = lse_square_scale, softcap
        self.return_z_loss = return_z_loss
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def options(self) -> CrossEntropyOptions:
        """The module's options now, as one object."""
        return CrossEntropyOptions(self.ignore_index, self.reduction, self.label_smoothing, self.lse_square_scale,
                                   self.softcap, self.return_z_loss, self.return_token_accuracy,
                                   self.return_predicted_tokens)


class CrossEntropyLoss(_Options, torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss running kernel_pytorch's cross-entropy (Triton on CUDA): loss and
    gradient in one pass over the logits, fp32 math whatever their dtype.

    Same arguments as torch.nn.CrossEntropyLoss, plus keyword-only:
        lse_square_scale: z-loss scale (adds scale * logsumexp^2 per counted row).
        softcap: logit soft-capping c * tanh(x / c) (Gemma-2), or None.
        inplace_backward: write the gradient over the input logits (eager CUDA; the caller must not
            read them again: functional/cross_entropy.py).
        return_z_loss, return_token_accuracy, return_predicted_tokens: return a LossOutput with these.
    forward: input (N, C), (N, C, d1, ...) or (C,); target (N), (N, d1, ...) or () class indices;
    token_scale of target's shape or None -> fp32 loss, 0-d or target's shape ("none"), or a LossOutput.
    """

    backend: Backend = "auto"

    def __init__(self, *args, lse_square_scale: float = 0.0, softcap: float | None = None,
                 inplace_backward: bool = False, return_z_loss: bool = False, return_token_accuracy: bool = False,
                 return_predicted_tokens: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inplace_backward = inplace_backward
        self._set_options(lse_square_scale, softcap, return_z_loss, return_token_accuracy, return_predicted_tokens)

    def forward(self, input: Tensor, target: Tensor,  # noqa: A002 (torch's name)
                token_scale: Tensor | None = None) -> Tensor | LossOutput:
        options = self.options()
        if target.is_floating_point():  # class probabilities: torch's own loss
            if token_scale is not None or options.extras:
                raise ValueError("token_scale and the return_* options need class-index targets (got class "
                                 f"probabilities, {target.dtype})")
            return super().forward(input, target)
        logits = input.movedim(1, -1) if input.dim() > 2 else input
        return cross_entropy_with(logits, target, self.weight, options, token_scale=token_scale,
                                  inplace_backward=self.inplace_backward, backend=self.backend)


class FusedLinearCrossEntropyLoss(_Options, torch.nn.Module):
    """cross_entropy(hidden @ weight.T + bias, target) without holding the logits (the LM head's loss):
    chunks of tokens, the gradients computed in the forward (functional.fused_linear_cross_entropy).

    Args:
        ignore_index, reduction, label_smoothing: as torch.nn.CrossEntropyLoss.
        lse_square_scale, softcap: as `CrossEntropyLoss`.
        ce_weight: (V,) class weights or None (a buffer, like torch's `weight`).
        return_z_loss, return_token_accuracy, return_predicted_tokens: as `CrossEntropyLoss`.
    forward(hidden (..., H), weight (V, H), target (...), bias (V,) or None, token_scale of target's
    shape or None) -> fp32 loss, 0-d or target's shape ("none"), or a LossOutput. weight may be tied to
    the input embedding.
    """

    backend: Backend = "auto"

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 lse_square_scale: float = 0.0, softcap: float | None = None,
                 ce_weight: Tensor | None = None, *, return_z_loss: bool = False, return_token_accuracy: bool = False,
                 return_predicted_tokens: bool = False) -> None:
        super().__init__()
        self.ignore_index, self.reduction, self.label_smoothing = ignore_index, reduction, label_smoothing
        self._set_options(lse_square_scale, softcap, return_z_loss, return_token_accuracy, return_predicted_tokens)
        self.register_buffer("ce_weight", ce_weight)

    def forward(self, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None,
                token_scale: Tensor | None = None) -> Tensor | LossOutput:
        return fused_linear_cross_entropy_with(hidden, weight, target, bias, self.options(), ce_weight=self.ce_weight,
                                               token_scale=token_scale, backend=self.backend)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"


class VocabParallelLinearCrossEntropyLoss(FusedLinearCrossEntropyLoss):
    """`FusedLinearCrossEntropyLoss` over an LM head whose weight is split by rows (classes) over a group
    of ranks: no rank holds all the logits (functional.vocab_parallel_linear_cross_entropy).

    The usual call, after `parallelize_module(model, tp_mesh, {"lm_head": ColwiseParallel()})`:
    `loss_fn(hidden, model.lm_head.weight, labels)`, the weight a DTensor Shard(0), hidden the same on every
    rank (the head's input, not its output).

    Args: as `FusedLinearCrossEntropyLoss` (no class weights, no token accuracy or predicted tokens), plus
        group: for a plain weight (this rank's rows), the ProcessGroup of its shards or a DeviceMesh;
            None for a DTensor weight (its mesh).
        mesh_dim: the mesh dim the vocabulary is split over (a DeviceMesh group with several dims needs it;
            for a DTensor weight a check).
    forward(hidden (..., H), weight (V, H) DTensor or (V_r, H) local rows, target (...), bias or None,
    token_scale or None) -> fp32 loss, the same on every rank: 0-d or target's shape ("none"), or a
    LossOutput (return_z_loss).
    """

    def __init__(self, *args: Any, group: Group = None, mesh_dim: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the same arguments, so one signature serves both losses
        if self.ce_weight is not None:
            raise ValueError("ce_weight: the vocabulary-parallel loss takes no class weights")
        self.group, self.mesh_dim = group, mesh_dim

    def forward(self, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None,
                token_scale: Tensor | None = None) -> Tensor | LossOutput:
        return vocab_parallel_linear_cross_entropy_with(hidden, weight, target, bias, self.options(), group=self.group,
                                                        mesh_dim=self.mesh_dim, token_scale=token_scale,
                                                        backend=self.backend)


__all__ = ["CrossEntropyLoss", "FusedLinearCrossEntropyLoss", "VocabParallelLinearCrossEntropyLoss"]
