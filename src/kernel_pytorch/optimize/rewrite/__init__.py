"""Graph rewrites: hand-written patterns the analyser's fusion findings name (an RMSNorm in plain torch
ops with or without the residual add before it, `silu(gate) * up`, `gelu(x + bias)`, a rotate-half
rotary embedding of q and k, `softmax(q @ k^T * scale + mask) @ v`, a linear layer's logits into
cross-entropy) replaced in a module's traced forward by our registered ops, through
`kernel_pytorch.functional` (so eager, autograd and torch.compile all run them).

`optimize(model, inputs, rewrite=True)` plans them (`sites.plan`), installs them, validates the model
against the original (outputs and gradients) and reverts any rewrite that fails, alone, with its reason;
the report lists each at its source line, the line the analyser's finding names. Compiled afterwards,
the model's graph holds our ops (`torch.ops.kernel_pytorch.*`).

Parts: `pattern.py` (`Pattern`: one spelling and its replacement), one file per family (`norm.py` and its
residual form `residual_norm.py`, `activation.py`, `rope.py`, `attention.py` and its causal mask
`causal.py`, `cross_entropy.py`), `sites.py` (tracing, matching with
`torch.fx.subgraph_rewriter`, installing and reverting), `compiled.py` (the same patterns as Inductor's
pre-grad pass, for a model compiled without optimize()).
"""

from __future__ import annotations

from collections.abc import Iterable

from kernel_pytorch.optimize.rewrite.activation import ACTIVATION_PATTERNS, BIAS_ACT_PATTERNS
from kernel_pytorch.optimize.rewrite.causal import CAUSAL_ATTENTION_PATTERNS
from kernel_pytorch.optimize.rewrite.cross_entropy import CROSS_ENTROPY_PATTERNS
from kernel_pytorch.optimize.rewrite.norm import NORM_PATTERNS
from kernel_pytorch.optimize.rewrite.pattern import Pattern
from kernel_pytorch.optimize.rewrite.residual_norm import RESIDUAL_NORM_PATTERNS
from kernel_pytorch.optimize.rewrite.rope import ROPE_PATTERNS

FAMILIES = ("norm", "activation", "rope", "attention", "cross_entropy")


def patterns_of(families: bool | str | Iterable[str]) -> tuple[Pattern, ...]:
    """The patterns of `families`: True (all), False (none), a family name or names (`FAMILIES`)."""
    # the residual form before the plain norm; gated before bias-act (silu(g + b) * up is gated)
    every = (*RESIDUAL_NORM_PATTERNS, *NORM_PATTERNS, *ACTIVATION_PATTERNS, *BIAS_ACT_PATTERNS, *ROPE_PATTERNS,
             *CAUSAL_ATTENTION_PATTERNS, *CROSS_ENTROPY_PATTERNS)
    if families is True:
        return every
    if families is False or families is None:
        return ()
    names = [families] if isinstance(families, str) else list(families)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"rewrite: unknown family {unknown[0]!r}; known: {', '.join(FAMILIES)} (or True, False)")
    return tuple(p for p in every if p.family in names)


__all__ = ["FAMILIES", "Pattern", "patterns_of"]
