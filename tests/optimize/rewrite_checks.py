"""What the rewrite tests check alike: a marked source line, and a rewritten model's outputs and
gradients against the written one's (kernel_pytorch.tolerances' table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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



def recording_pass(families: bool | str = True) -> tuple[Any, Callable[[torch.fx.Graph], None], set[str]]:
    """(our pre-grad rewrite pass for `families`, a plain function running it to pass as Inductor's
    `pre_grad_custom_pass`, the call targets it leaves in the graphs it rewrites). A function, not the pass
    object: it has no uuid, so Inductor's cache never skips the pass."""
    from kernel_pytorch.optimize.rewrite.compiled import inductor_options

    rewrite = inductor_options(families)["pre_grad_custom_pass"]
    seen: set[str] = set()

    def pre_grad(graph: torch.fx.Graph) -> None:
        rewrite(graph)
        seen.update(str(n.target) for n in graph.nodes if n.op == "call_function")

    return rewrite, pre_grad, seen
