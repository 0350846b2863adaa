"""What the rewrite tests check alike: a marked source line, and a rewritten model's outputs and
gradients against the written one's (kernel_pytorch.tolerances' table)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kernel_pytorch.tolerances import compare


def marked_line(path: str, marker: str) -> int:
    """1-based line of the file at `path` that ends in `# AT:<marker>` (exactly one)."""
    with open(path) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# AT:{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def close(actual: Tensor, expected: Tensor) -> None:
    result = compare(actual, expected)
    assert result.passed, result.message()


def same_outputs_and_grads(model: nn.Module, original: nn.Module, inputs: tuple[Tensor, ...]) -> None:
    """`model` and `original` called on `inputs` and differentiated with one upstream gradient: the
    outputs and every parameter's gradient agree, and a parameter without a gradient in one has none in
    the other."""
    ya, yb = model(*inputs), original(*inputs)
    close(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    for (name, pa), (_, pb) in zip(model.named_parameters(), original.named_parameters(), strict=True):
        assert (pa.grad is None) == (pb.grad is None), name
        if pb.grad is not None:
            close(pa.grad, pb.grad)

