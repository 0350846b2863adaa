"""Loss rule: the LM head + causal-LM loss of a Hugging Face `*ForCausalLM` to one fused linear
cross-entropy (`kernel_pytorch.functional.fused_linear_cross_entropy`), which never holds the
(B, T, vocab) logits.

Matched at the model's `lm_head` (a Linear, tied to the input embedding or not) when the model computes
its loss with transformers' `ForCausalLMLoss`. The lm_head becomes `FusedLossLMHead`: a Linear holding
the same `Parameter` objects (same `state_dict` keys, ties kept) whose `attach(model)` puts a forward
wrapper on the model INSTANCE (`model.forward`, an instance attribute; the class is never touched, and
`detach` deletes the attribute). The wrapper signs as the original forward (`inspect.signature` sees it,
so `generate()` reads the same parameters).

With `labels` (a keyword argument) the wrapper runs the base model (`model.<base_model_prefix>`) with
the other arguments, as the original forward does, then computes the loss from the last hidden state
and lm_head.weight / bias exactly as `ForCausalLMLoss` defines it: labels shifted left by one and padded
with `ignore_index` (or `shift_labels` as given), `ignore_index` (default -100) skipped, mean over the
kept tokens, or the sum divided by `num_items_in_batch` when that is given. What `logits` holds:
  - training (`model.training`) with labels: None. The logits are never materialised; that is the
    memory saving. (Set `lm_head.logits_in_training = True` to get them anyway.)
  - eval with labels: `lm_head(hidden[:, logits_to_keep slice])`, as transformers returns them; the
    loss is still the fused one.
  - without labels: the original forward runs, unchanged (`generate()`, inference).
In training with labels the base model also gets `use_cache=False` unless the caller passes `use_cache`
(the output's cache is then None): a training step never reads the cache, and under torch.compile every
layer's K and V become outputs of the compiled forward, for which the backward gets gradients of zeros
(at 4 x 2048 tokens of an 8-layer Llama, 16 tensors of 16 MiB alive through the backward, and an add
each). transformers' own gradient checkpointing turns the cache off in training the same way.

Left alone, with the reason: another loss function (`loss_type`), logit soft-capping
(`final_logit_softcapping`, Gemma 2/3) or any other change of the logits (found by a probe: the original
and the wrapper must give the same loss and logits on a tiny batch), a base model we cannot find.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch.functional.loss import fused_linear_cross_entropy
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import blocked, build_on_meta, same_output


def _causal_lm_loss_function() -> Any:
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except ImportError:
        return None
    return ForCausalLMLoss


def _output_classes() -> tuple[type, type]:
    """transformers' causal-LM output classes, (with past, with cross-attentions). Looked up when the
    wrapper is attached: inside a compiled forward, importing from transformers' lazy modules breaks
    the graph."""
    from transformers import modeling_outputs as mo

    return mo.CausalLMOutputWithPast, mo.CausalLMOutputWithCrossAttentions


def fused_causal_lm_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, *,
                         num_items_in_batch: Any = None, ignore_index: int = -100,
                         shift_labels: Tensor | None = None) -> Tensor:
    """transformers' ForCausalLMLoss on `hidden @ weight.T + bias` without the logits.

    Args:
        hidden: (B, T, H) last hidden states; weight: (V, H) lm_head weight; bias: (V,) or None.
        labels: (B, T) token ids (shifted here: position t predicts labels[t + 1]); ignored when
            `shift_labels` (B, T), already shifted, is given.
        num_items_in_batch: None (mean over kept tokens) or the count to divide the summed loss by.
    Returns:
        0-d fp32 loss.
    """
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, target, bias,
                                      ignore_index=ignore_index, reduction=reduction)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _fused_forward(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The wrapper put on the instance (module docstring); `model.forward` when bound."""
    head = model.lm_head
    labels = kwargs.get("labels")
    if labels is None or len(args) > 1 or not isinstance(head, FusedLossLMHead) or kwargs.get("return_dict") is False:
        return type(model).forward(model, *args, **kwargs)  # (not forward.__get__: Dynamo cannot trace it)
    kwargs = dict(kwargs)
    del kwargs["labels"]
    keep = kwargs.pop("logits_to_keep", 0)
    loss_options = {k: kwargs[k] for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    base_kwargs = {k: v for k, v in kwargs.items() if k not in ("ignore_index", "shift_labels")}
    if model.training and head.cache_off_in_training and "use_cache" not in base_kwargs:
        base_kwargs["use_cache"] = False  # module docstring: a training step has no use for the cache
    outputs = getattr(model, model.base_model_prefix)(*args, **base_kwargs)
    hidden = outputs[0]
    loss = fused_causal_lm_loss(hidden, head.weight, head.bias, labels, **loss_options)
    logits = None
    if not model.training or head.logits_in_training:
        rows = slice(-keep, None) if isinstance(keep, int) else keep
        logits = nn.functional.linear(hidden[:, rows, :], head.weight, head.bias)
    fields = {"loss": loss, "logits": logits}
    with_past, with_cross = head.output_classes
    cls = with_cross if hasattr(outputs, "cross_attentions") else with_past
    # the cache field is `past_key_values` in older transformers and `cache` in newer ones: every field the
    # output class has besides loss and logits is carried over, whatever its name
    for name in cls.__dataclass_fields__:
        if name not in fields and hasattr(outputs, name):
            fields[name] = getattr(outputs, name)
    return cls(**fields)


class FusedLossLMHead(nn.Linear):
    """The model's lm_head (same parameters and keys) that, attached to the model, makes its forward
    compute the loss by fused linear cross-entropy (module docstring). As a module it is the Linear."""

    logits_in_training = False
    output_classes: tuple[type, type] = ()
    cache_off_in_training = False  # the base model takes use_cache: training calls pass False unless given

    def attach(self, model: nn.Module) -> None:
        """Put the fused forward on the model instance, signing as the class's forward."""
        self.output_classes = _output_classes()
        self.cache_off_in_training = _takes_use_cache(model)
        wrapper = functools.wraps(type(model).forward)(_fused_forward)
        model.forward = types.MethodType(wrapper, model)

    def detach(self, model: nn.Module) -> None:
        """Remove the instance's forward: the class's forward is the model's forward again."""
        if isinstance(model.__dict__.get("forward"), types.MethodType):
            del model.__dict__["forward"]


def _takes_use_cache(model: nn.Module) -> bool:
    """Whether the base model's forward has a `use_cache` parameter."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    return isinstance(base, nn.Module) and "use_cache" in inspect.signature(type(base).forward).parameters


def _probe(model: nn.Module, head: FusedLossLMHead) -> str | None:
    """Why the fused forward differs from the model's on a (1, 6) batch, or None when it agrees."""
    vocab = head.out_features
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, vocab, (1, 6), generator=g).to(head.weight.device)
    labels = ids.clone()
    labels[0, 2] = -100
    inputs = {"input_ids": ids, "labels": labels, "use_cache": False}
    runs = []
    for forward in (type(model).forward, _fused_forward):
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(0)
            saved = model.lm_head
            model._modules["lm_head"] = head  # the probe's own head; put back below
            try:
                saved_flag, head.logits_in_training = head.logits_in_training, True
                runs.append(forward(model, **inputs))
            finally:
                head.logits_in_training = saved_flag
                model._modules["lm_head"] = saved
    (ref, ours) = runs
    if not same_output(ref.loss.float(), ours.loss.float()):
        return f"loss {float(ours.loss):.6g} instead of {float(ref.loss):.6g} on a probe batch"
    if not same_output(ref.logits, ours.logits):
        return "logits differ on a probe batch (soft-capping or scaling of the logits?)"
    return None


class FusedLinearCrossEntropyRule:
    """A transformers *ForCausalLM's lm_head + ForCausalLMLoss -> FusedLossLMHead and the fused forward."""

    name = "fused_linear_cross_entropy"
    family = "loss"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if name != "lm_head" or isinstance(module, FusedLossLMHead) or not isinstance(module, nn.Linear):
            return None
        config = getattr(model, "config", None)
        prefix = getattr(model, "base_model_prefix", None)
        if getattr(model, "lm_head", None) is not module or config is None or not isinstance(prefix, str):
            return None
        kind = type(model).__name__
        if "forward" in model.__dict__:
            return Match(None, f"{kind} already has a forward set on the instance")
        if (why := blocked(module)) is not None:
            return Match(None, why)
        if type(module).forward is not nn.Linear.forward:
            return Match(None, f"lm_head is a {type(module).__name__} with its own forward")
        if not isinstance(getattr(model, prefix, None), nn.Module):
            return Match(None, f"{kind} has no base model at .{prefix}")
        for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
            if getattr(config, attr, None) not in (None, 1.0):
                return Match(None, f"{kind} changes its logits (config.{attr}={getattr(config, attr)!r})")
        expected = _causal_lm_loss_function()
        try:
            loss_function = model.loss_function
        except Exception:  # noqa: BLE001 (a property that raises: not a transformers causal LM)
            loss_function = None
        if expected is None or getattr(loss_function, "__wrapped__", loss_function) is not expected:
            return Match(None, f"{kind}'s loss_function is not transformers' ForCausalLMLoss")
        if "labels" not in inspect.signature(type(model).forward).parameters:
            return Match(None, f"{kind}.forward takes no labels")
        names = tuple(n for n in ("weight", "bias") if getattr(module, n) is not None)
        head = build_on_meta(
            lambda: FusedLossLMHead(module.in_features, module.out_features, bias=module.bias is not None,
                                    device="meta"), module, names)
        head.output_classes = _output_classes()
        try:
            why = _probe(model, head)
        except Exception as exc:  # noqa: BLE001 (the model cannot run the probe: leave it)
            why = f"the probe batch fails ({type(exc).__name__}: {exc})"
        if why is not None:
            return Match(None, f"{kind}: {why}")
        tied = " (tied to the input embedding)" if module.weight is getattr(
            model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None, "weight", None) else ""
        return Match(head, f"{kind} lm_head{tied} + ForCausalLMLoss -> fused linear cross-entropy "
                           "(no logits and no KV cache in training with labels)")


LOSS_RULES = (FusedLinearCrossEntropyRule(),)

__all__ = ["LOSS_RULES", "FusedLinearCrossEntropyRule", "FusedLossLMHead", "fused_causal_lm_loss"]
