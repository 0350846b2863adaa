"""What the model call in progress asked of its attention, for `HFAttention`: plain causal attention, or
packed documents read from `position_ids`.

`MaskHint` is a forward pre-hook on the model (and a forward hook that clears it). It reads the call's
keyword arguments only, never the mask transformers builds from them:

    plain_causal   no `attention_mask` and no `position_ids` (or an all-ones 2-D mask, checked in eager),
                   no cache and no other input that may shape the mask: every layer may call SDPA with
                   is_causal=True and no mask.
    documents      `position_ids` without an `attention_mask`, no cache given, no other input that may
                   shape the mask: transformers (masking_utils, 5.x) then reads packed documents from the
                   position ids (a document starts wherever a position does not follow the one before it)
                   and builds a block-diagonal causal mask, provided no cache is in play, which a layer
                   sees (`use_cache=True` makes transformers create one inside the call, and its mask is
                   then plain causal over the whole row).

`documents_of` gives a layer the (B, T) document ids (`reference.seq_ids_from_position_ids`): in eager
mode once per call, shared by the layers, and None where every row holds one document (transformers'
own check, a host sync it makes too: the layers then take the plain causal call); under torch.compile
computed in each layer's graph (a few ops on (B, T) ids, no sync) and never None.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch.reference.positions import seq_ids_from_position_ids

# keyword arguments of a causal LM's forward that leave its mask as attention_mask and position_ids make
# it (those two are looked at separately); FlashAttention's packed-sequence arguments, which
# DataCollatorWithFlattening can add, are read by no SDPA or eager mask
PLAIN_KWARGS = frozenset({
    "input_ids", "inputs_embeds", "labels", "use_cache", "attention_mask", "position_ids", "cache_position",
    "logits_to_keep", "num_items_in_batch", "shift_labels", "ignore_index", "return_dict", "output_attentions",
    "output_hidden_states", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
})


class MaskHint:
    """Whether the model call in progress asked for plain causal attention (`plain_causal`) or may carry
    packed documents (`documents`), set by a forward pre-hook on the model and cleared after it; the hooks
    are this object's bound methods, so a deep copy of the model gets its own hint."""

    def __init__(self) -> None:
        self.plain_causal = False
        self.documents = False
        self.users = 0
        self.handles: list[Any] = []  # RemovableHandles (a deep copy of the model rebinds them to the copy)
        self._seq_ids: tuple[Tensor, Tensor | None] | None = None  # eager: (position_ids, their documents)

    def before(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        # anything else given (token_type_ids, pixel_values, a cache ...) may shape the mask: not plain
        others = [k for k, v in kwargs.items() if v is not None and k not in PLAIN_KWARGS]
        plain = len(args) <= 1 and not others
        self.documents = plain and mask is None and isinstance(positions, Tensor)
        if mask is None:
            plain = plain and positions is None  # transformers reads packed documents from position_ids
        elif isinstance(mask, Tensor) and mask.dim() == 2 and not torch.compiler.is_compiling():
            plain = plain and bool(mask.all())  # a host sync, as transformers' own check in eager
        else:
            plain = False
        self.plain_causal = plain
        self._seq_ids = None

    def after(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.plain_causal = self.documents = False
        self._seq_ids = None

    def documents_of(self, position_ids: Tensor, batch: int) -> Tensor | None:
        """The (batch, T) document ids of the call's position ids (1 or batch, T) (module docstring):
        None in eager mode when every row holds one document."""
        rows = position_ids if position_ids.dim() == 2 else position_ids.reshape(1, -1)
        if torch.compiler.is_compiling():
            return seq_ids_from_position_ids(rows).expand(batch, -1)
        if self._seq_ids is not None and self._seq_ids[0] is position_ids:
            return self._seq_ids[1]
        ids = seq_ids_from_position_ids(rows).expand(batch, -1)
        found = None if bool((ids[:, -1] == 0).all()) else ids
        self._seq_ids = (position_ids, found)
        return found


def hint_of(model: nn.Module) -> MaskHint | None:
    """The MaskHint whose hooks are on `model`, if any."""
    for hook in model._forward_pre_hooks.values():
        if isinstance(getattr(hook, "__self__", None), MaskHint):
            return hook.__self__
    return None


__all__ = ["PLAIN_KWARGS", "MaskHint", "hint_of"]
