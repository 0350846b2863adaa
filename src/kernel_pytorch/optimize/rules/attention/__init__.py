"""The attention family's rule: Hugging Face decoder attention to `HFAttention` (`rule.py`), what the
model's call asked of it, plain causal or packed documents (`hint.py`), and where such a module's q, k
and v come from, split or packed (`layouts.py`)."""

from kernel_pytorch.optimize.rules.attention.hint import MaskHint
from kernel_pytorch.optimize.rules.attention.layouts import QKVLayout, qkv_layout, rotary_dims
from kernel_pytorch.optimize.rules.attention.rule import ATTENTION_RULES, AttentionRule, HFAttention

__all__ = ["ATTENTION_RULES", "AttentionRule", "HFAttention", "MaskHint", "QKVLayout", "qkv_layout", "rotary_dims"]
