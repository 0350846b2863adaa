"""The replacement rules behind `optimize()`: one family per file, each rule a small object that looks
at one module and says whether it replaces it, with what, and why.

A rule never edits the module it is shown, nor any class: it returns a new module (built around the
same `Parameter` objects, so names, devices, dtypes, `state_dict` keys and ties are kept) or says why
not. `optimize()` swaps the instance in the model, validates, and reverts what fails.

Families, one module each, named as the family is in every layer (and as `components=` and the
report's `family` name it): `norm.py` (torch and Hugging Face norms), `mlp.py` (gated, packed gate_up
and fc1/fc2 or dense_h_to_4h/dense_4h_to_h MLPs; MoE expert blocks recognised and left alone),
`attention/` (Hugging Face decoder attention, RoPE applied inside it: `rule.py`; `layouts.py`: where its
q, k and v come from, split or packed), `cross_entropy.py` (LM head + causal-LM or T5 loss -> fused
linear cross-entropy), `embedding.py` (torch.nn.Embedding and transformers' scaled word embeddings, for
their deterministic backward in the table's dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import nn


@dataclass(frozen=True)
class Match:
    """A rule's answer for one module: `replacement` (None: recognised but left alone) and `reason`."""

    replacement: nn.Module | None
    reason: str


@runtime_checkable
class Rule(Protocol):
    """One replacement: `name` (unique, used in reports and `components=`), `family` ("norm", "mlp", ...).

    `match(module, name, model)` returns None when the module is not of the rule's kind, else a
    `Match`: the replacement (a new module holding the same parameters) or None with the reason it is
    left alone. It must not change `module` or `model`.
    """

    name: str
    family: str

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None: ...


def default_rules() -> list[Rule]:
    """Every built-in rule, in the order they are tried (the first rule that matches a module wins)."""
    from kernel_pytorch.optimize.rules.attention import ATTENTION_RULES
    from kernel_pytorch.optimize.rules.cross_entropy import CROSS_ENTROPY_RULES
    from kernel_pytorch.optimize.rules.embedding import EMBEDDING_RULES
    from kernel_pytorch.optimize.rules.mlp import MLP_RULES
    from kernel_pytorch.optimize.rules.norm import NORM_RULES

    return [*NORM_RULES, *MLP_RULES, *ATTENTION_RULES, *CROSS_ENTROPY_RULES, *EMBEDDING_RULES]


__all__ = ["Match", "Rule", "default_rules"]
