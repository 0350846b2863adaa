"""Shared pieces of the cross-entropy tests: option cases, inputs, PyTorch's own low-precision eager
loss (the yardstick of the fp64-derived budget), and a fixture forcing the kernels' looping paths."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from kernel_pytorch.ops import tuning
from kernel_pytorch.ops.cross_entropy import FwdLaunch
from tests.grid import randn

IGNORE = -100

# name -> (leading shape, V, reduction, options); "ignore" lists flat rows whose target is ignored and
# "weighted" asks for class weights. One class, several blocks, every option, every reduction.
CASES = {
    "one-class": ((3,), 1, "mean", {}),
    "weights+smoothing": ((5,), 33, "mean", {"weighted": True, "label_smoothing": 0.1, "ignore": (1,)}),
    "zloss+softcap": ((2, 3), 40, "sum", {"lse_square_scale": 1e-2, "softcap": 5.0, "ignore": (0,)}),
    "all-options": ((4,), 257, "none", {"weighted": True, "label_smoothing": 0.05, "lse_square_scale": 1e-3,
                                         "softcap": 8.0, "ignore": (2,)}),
}


def case_inputs(lead: tuple[int, ...], v: int, options: dict, dtype: torch.dtype, device: str,
                scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict]:
    """(logits with padded rows, targets, class weights or None, the remaining options)."""
    opts = dict(options)
    logits = randn(*lead, v + 3, dtype=dtype, device=device, scale=scale)[..., :v]
    target = torch.randint(0, v, lead, device=device)
    flat = target.view(-1)
    flat[list(opts.pop("ignore", ()))] = IGNORE
    weight = (torch.rand(v, device=device) + 0.5) if opts.pop("weighted", False) else None
    return logits, target, weight, opts


def upstream(reduction: str, target: torch.Tensor) -> torch.Tensor:
    """A random upstream gradient of the loss's shape (never 1, so scaling is exercised)."""
    shape = target.shape if reduction == "none" else ()
    return torch.rand(shape, device=target.device) + 0.25


def eager_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: str,
               label_smoothing: float = 0.0, lse_square_scale: float = 0.0,
               softcap: float | None = None) -> torch.Tensor:
    """The loss as plain PyTorch computes it in the logits' own dtype: soft-capping as Hugging Face's
    Gemma-2 does it (three roundings), torch's cross-entropy, and a z-loss from torch ops."""
    z = logits
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    v = z.shape[-1]
    z2, t = z.reshape(-1, v), target.reshape(-1)
    w = weight.to(z.dtype) if weight is not None else None
    loss = F.cross_entropy(z2, t, w, ignore_index=IGNORE, reduction=reduction, label_smoothing=label_smoothing)
    if lse_square_scale:
        valid = t != IGNORE
        zl = torch.where(valid, lse_square_scale * torch.logsumexp(z2, -1) ** 2, 0.0)
        loss = loss + (zl if reduction == "none" else zl.sum() / (valid.sum() if reduction == "mean" else 1))
    return loss.view(target.shape) if reduction == "none" else loss


@pytest.fixture(params=["one-block", "looped"])
def block_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Rows in one block, or (looped) 16-column blocks: the online softmax across blocks, masked
    tails, and several backward column blocks per row."""
    if request.param == "looped":
        with tuning.changed("cross_entropy", fwd=FwdLaunch(16, 1, 0, True, False), loss=None, bwd_block=16):
            yield request.param
    else:
        yield request.param
