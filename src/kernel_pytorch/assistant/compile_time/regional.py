"""Regional compilation: compile one repeated block (a decoder layer, a transformer block) in place of
the whole model, so identical blocks share one compiled graph and compile time stops growing with
depth. Advised only where it pays: identical blocks held in an `nn.ModuleList` or `nn.Sequential`
that carry a real share of the model's parameters, with the code that does it, runnable as printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kernel_pytorch.assistant.findings import Finding, Severity

# below this share of the parameters, compiling the blocks once saves too little to be worth a change
MIN_SHARE = 0.25


@dataclass(frozen=True)
class RepeatedBlocks:
    """Structurally identical blocks of one container: where regional compilation pays.

    Attributes:
        path: qualified name of the container ("model.layers"); "" when the model itself is one.
        block_type: class name of the blocks.
        count: how many identical blocks.
        param_fraction: share of the model's parameters inside these blocks.
        indices: their positions in the container.
        size: how many entries the container holds.
    """

    path: str
    block_type: str
    count: int
    param_fraction: float
    indices: tuple[int, ...] = ()
    size: int = 0

    def container(self) -> str:
        """Python that evaluates to the container, given the model as `model`."""
        parts = self.path.split(".") if self.path else []
        if not all(p.isidentifier() or p.isdigit() for p in parts):
            return f"model.get_submodule({self.path!r})"
        return "model" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)

    def code(self) -> str:
        """The loop that compiles each block in place: every entry, a slice, or the listed ones."""
        expr, idx = self.container(), self.indices
        if idx == tuple(range(self.size)):
            blocks = expr
        elif idx == tuple(range(idx[0], idx[-1] + 1)):
            blocks = f"{expr}[{idx[0]}:{idx[-1] + 1}]"
        else:
            blocks = "(" + ", ".join(f"{expr}[{i}]" for i in idx) + ")"
        return f"for block in {blocks}: block.compile()"


def _signature(module: nn.Module) -> tuple[Any, ...]:
    return (type(module), tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()))


def find_repeated_blocks(module: nn.Module, min_share: float = MIN_SHARE) -> RepeatedBlocks | None:
    """The `nn.ModuleList`/`nn.Sequential` (the model itself included) whose structurally identical
    entries (same class, same parameter names and shapes), two or more and most of its entries, hold
    the largest share of the model's parameters, if that share is at least `min_share`; else None."""
    total = sum(p.numel() for p in module.parameters()) or 1
    best: RepeatedBlocks | None = None
    for path, parent in module.named_modules():
        if not isinstance(parent, (nn.ModuleList, nn.Sequential)):
            continue
        entries = [m for m in parent]  # iteration keeps a block listed twice; children() would not
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, m in enumerate(entries):
            groups.setdefault(_signature(m), []).append(i)
        for sig, idx in groups.items():
            # most of the container: a stack of blocks (maybe after a different first one), not a few
            # alike stages of a pipeline of different ones
            if len(idx) < 2 or 2 * len(idx) <= len(entries):
                continue
            params = {id(p): p.numel() for i in idx for p in entries[i].parameters()}
            fraction = sum(params.values()) / total
            if fraction < min_share or (best is not None and fraction <= best.param_fraction):
                continue
            best = RepeatedBlocks(path, sig[0].__name__, len(idx), fraction, tuple(idx), len(entries))
    return best


def regional_finding(blocks: RepeatedBlocks, scalable_s: float, total_s: float) -> Finding:
    """The regional-compilation advice for `blocks`, with its saving estimated from the seconds of the
    compile phases that grow with the graph (`scalable_s` of a `total_s` compile)."""
    # Dynamo, AOTAutograd and Inductor work grows with the graph; compiling one block in place of the
    # whole model keeps about 1/count of the blocks' share of it (an estimate from parameter share).
    saved = scalable_s * blocks.param_fraction * (1 - 1 / blocks.count)
    nested = (
        f" (or keep `torch.compile(model)` and decorate `{blocks.block_type}.forward` with "
        "`@torch.compiler.nested_compile_region`)"
        if hasattr(torch.compiler, "nested_compile_region")
        else ""
    )
    where = blocks.container()
    some = "" if blocks.count == blocks.size else f" ({blocks.count} of its {blocks.size} entries)"
    return Finding(
        id="compile-time.regional",
        severity=Severity.INFO,
        title=f"{blocks.count} identical `{blocks.block_type}` blocks in `{where}`{some}: compile one, reuse it",
        evidence=f"the blocks hold {100 * blocks.param_fraction:.0f}% of the parameters; torch.compile of "
        "the whole model traces, lowers and generates code for every copy",
        suggestion=f"Regional compilation: `{blocks.code()}` instead of `torch.compile(model)`{nested}. "
        "Identical blocks then share one compiled graph.",
        estimated_gain=f"about {saved:.1f} s of {total_s:.1f} s compile time (estimate: the blocks' "
        f"parameter share x (1 - 1/{blocks.count}) of the traced phases; not measured)",
        data={
            "container": blocks.path,
            "block_type": blocks.block_type,
            "count": blocks.count,
            "indices": list(blocks.indices),
            "param_fraction": round(blocks.param_fraction, 4),
            "estimated_saving_s": round(saved, 3),
            "code": blocks.code(),
        },
    )

