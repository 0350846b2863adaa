"""Cross-entropy rule: the LM head + loss of a Hugging Face `*ForCausalLM` (ForCausalLMLoss) or of a T5-style
encoder-decoder (cross-entropy over unshifted labels) to one fused linear cross-entropy
(`kernel_pytorch.functional.fused_linear_cross_entropy`), which never holds the (B, T, vocab) logits.

Matched at the model's `lm_head` (a Linear, tied to the input embedding or not). The lm_head becomes
`FusedLossLMHead`: a Linear holding the same `Parameter` objects (same `state_dict` keys, ties kept)
whose `attach(model)` puts a forward wrapper on the model INSTANCE (`model.forward`, an instance
attribute; the class is never touched, and `detach` deletes the attribute). The wrapper signs as the
original forward (`inspect.signature` sees it, so `generate()` reads the same parameters), and returns
the class the original returns (read from the probe run: `MoeCausalLMOutputWithPast`, `Seq2SeqLMOutput`).

Causal LMs. With `labels` (a keyword argument) the wrapper runs the base model
(`model.<base_model_prefix>`) with the other arguments, as the original forward does, then computes the
loss from the last hidden state and lm_head.weight / bias exactly as `ForCausalLMLoss` defines it:
labels shifted left by one and padded with `ignore_index` (or `shift_labels` as given), `ignore_index`
(default -100) skipped, mean over the kept tokens, or the sum divided by `num_items_in_batch` when that
is given. `config.final_logit_softcapping` (Gemma 2/3: logits -> c * tanh(logits / c)) is applied
inside the fused loss, and to the logits returned. MoE models (Mixtral, Qwen2/3-MoE): when router logits
are requested (`output_router_logits`, or the config's default) the base model returns them and the
loss adds `router_aux_loss_coef * load_balancing_loss_func(...)` (the function of the model's own
module) as transformers does; the output carries `aux_loss` and `router_logits`.

Encoder-decoders (T5, `config.is_encoder_decoder`). With `labels` the wrapper fills
`decoder_input_ids` from the labels (`prepare_decoder_input_ids_from_labels`, as the original does when
none are given) and runs the class's own forward without labels while the head hands back its input:
the "logits" of that run are the decoder output after the model's own scaling (T5's d_model**-0.5 when
`scale_decoder_outputs`), bit for bit. The loss is the mean cross-entropy over the unshifted labels with
ignore_index -100, returned in the logits' dtype as T5's is. Encoder-decoders with anything of their own
beside lm_head (BART's `final_logits_bias`), or whose loss or logits differ on the probe, are left alone.

What `logits` holds, both kinds:
  - training (`model.training`) with labels: None. The logits are never materialised; that is the
    memory saving. (Set `lm_head.logits_in_training = True` to get them anyway.)
  - eval with labels: `lm_head(hidden[:, logits_to_keep slice])` (soft-capped where the model caps), as
    transformers returns them; the loss is still the fused one.
  - without labels: the original forward runs, unchanged (`generate()`, inference).
In training with labels the base model also gets `use_cache=False` unless the caller passes `use_cache`
(the output's cache is then None): a training step never reads the cache, and under torch.compile every
layer's K and V become outputs of the compiled forward, for which the backward gets gradients of zeros
(at 4 x 2048 tokens of an 8-layer Llama, 16 tensors of 16 MiB alive through the backward, and an add
each). transformers' own gradient checkpointing turns the cache off in training the same way.

Left alone, with the reason: another loss function (`loss_type`), other changes of the logits
(`logit_scale`, `logits_scaling`) or any change found by a probe (the original and the wrapper must give
the same loss and logits on a tiny batch, with router logits requested where the model takes them), a
router aux loss of a form we do not know, a base model we cannot find.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._env import is_dtensor, is_plain_tensor
from kernel_pytorch.functional.cross_entropy import fused_linear_cross_entropy
from kernel_pytorch.functional.vocab_parallel_cross_entropy import vocab_parallel_linear_cross_entropy
from kernel_pytorch.optimize.rules import Match
from kernel_pytorch.optimize.rules._common import blocked, build_on_meta, same_output
from kernel_pytorch.reference.cross_entropy import apply_softcap

_LOGIT_CHANGES = ("logit_scale", "logits_scaling")  # config attributes the fused forward does not apply
_ROUTER_ATTRS = ("router_aux_loss_coef", "num_experts", "num_experts_per_tok")


def _causal_lm_loss_function() -> Any:
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except ImportError:
        return None
    return ForCausalLMLoss


def fused_causal_lm_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, *,
                         num_items_in_batch: Any = None, ignore_index: int = -100,
                         shift_labels: Tensor | None = None, softcap: float | None = None) -> Tensor:
    """transformers' ForCausalLMLoss on `hidden @ weight.T + bias` (soft-capped by `softcap` when given)
    without the logits.

    Args:
        hidden: (B, T, H) last hidden states; weight: (V, H) lm_head weight; bias: (V,) or None.
        labels: (B, T) token ids (shifted here: position t predicts labels[t + 1]); ignored when
            `shift_labels` (B, T), already shifted, is given.
        num_items_in_batch: None (mean over kept tokens) or the count to divide the summed loss by.
        softcap: c of c * tanh(logits / c) (Gemma 2/3's final_logit_softcapping), or None.
    Returns:
        0-d fp32 loss.
    """
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    reduction = "mean" if num_items_in_batch is None else "sum"
    # a head split over the vocabulary (tensor parallelism): each rank's rows, O(rows) statistics exchanged
    loss_fn = vocab_parallel_linear_cross_entropy if vocab_sharded(weight) else fused_linear_cross_entropy
    loss = loss_fn(hidden.reshape(-1, hidden.shape[-1]), weight, target, bias,
                   ignore_index=ignore_index, reduction=reduction, softcap=softcap)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def vocab_sharded(weight: Tensor) -> bool:
    """Whether `weight` is a DTensor split over its rows (the vocabulary) on one mesh dim and replicated on
    the others: ColwiseParallel's LM head, which the vocabulary-parallel loss takes as it is."""
    if not is_dtensor(weight):
        return False
    shards = [p for p in weight.placements if p.is_shard()]
    return (len(shards) == 1 and shards[0].dim == 0
            and all(p.is_shard() or p.is_replicate() for p in weight.placements))


def _plain_call(model: nn.Module, args: tuple, kwargs: dict) -> bool:
    """Whether the call goes to the class's forward unchanged: no labels, positional arguments past the
    first, a head that is not ours, a tuple asked for, or a head sharded otherwise than over the
    vocabulary (a DTensor weight the fused loss cannot take; a vocabulary-sharded one goes to the
    vocabulary-parallel loss). Hooks on the head (parallelize_module's, a profiler's) leave the fused
    loss in place: it reads the weight, and FSDP2 hands the head its plain unsharded weight in forward."""
    head = model.lm_head
    return (kwargs.get("labels") is None or len(args) > 1 or not isinstance(head, FusedLossLMHead)
            or kwargs.get("return_dict") is False
            or not (is_plain_tensor(head.weight) or vocab_sharded(head.weight)))


def _output(head: FusedLossLMHead, outputs: Any, fields: dict[str, Any]) -> Any:
    """The original's output class holding `fields` and every other field `outputs` has, whatever its
    name (the cache field is `past_key_values` in older transformers and `cache` in newer ones)."""
    cls = head.output_class
    for name in cls.__dataclass_fields__:
        if name not in fields and hasattr(outputs, name):
            fields[name] = getattr(outputs, name)
    return cls(**fields)


def _fused_forward(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The causal-LM wrapper put on the instance (module docstring); `model.forward` when bound."""
    if _plain_call(model, args, kwargs):
        return type(model).forward(model, *args, **kwargs)  # (not forward.__get__: Dynamo cannot trace it)
    head = model.lm_head
    kwargs = dict(kwargs)
    labels = kwargs.pop("labels")
    keep = kwargs.pop("logits_to_keep", 0)
    loss_options = {k: kwargs[k] for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
    base_kwargs = {k: v for k, v in kwargs.items() if k not in ("ignore_index", "shift_labels")}
    if model.training and head.cache_off_in_training and "use_cache" not in base_kwargs:
        base_kwargs["use_cache"] = False  # module docstring: a training step has no use for the cache
    routed = False
    if head.router_aux_loss is not None:  # as the original: the call's choice, else the config's
        routed = base_kwargs.get("output_router_logits")
        routed = model.config.output_router_logits if routed is None else routed
        base_kwargs["output_router_logits"] = routed
    outputs = getattr(model, model.base_model_prefix)(*args, **base_kwargs)
    hidden = outputs[0]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    loss = fused_causal_lm_loss(hidden, head.weight, head.bias, labels, softcap=softcap, **loss_options)
    fields: dict[str, Any] = {"logits": None}
    if routed:
        aux = head.router_aux_loss(outputs.router_logits, model.num_experts, model.num_experts_per_tok,
                                   kwargs.get("attention_mask"))
        loss = loss + model.router_aux_loss_coef * aux.to(loss.device)
        fields["aux_loss"] = aux
    fields["loss"] = loss
    if not model.training or head.logits_in_training:
        rows = slice(-keep, None) if isinstance(keep, int) else keep
        # through the head where tensor parallelism hooks it (its styles place the logits)
        logits = head(hidden[:, rows, :]) if is_dtensor(head.weight) else \
            nn.functional.linear(hidden[:, rows, :], head.weight, head.bias)
        fields["logits"] = apply_softcap(logits, softcap)
    return _output(head, outputs, fields)


def _fused_seq2seq_forward(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The encoder-decoder wrapper put on the instance (module docstring); `model.forward` when bound."""
    if _plain_call(model, args, kwargs):
        return type(model).forward(model, *args, **kwargs)
    head = model.lm_head
    kwargs = dict(kwargs)
    labels = kwargs.pop("labels")
    if kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
        kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
    if model.training and head.cache_off_in_training and "use_cache" not in kwargs:
        kwargs["use_cache"] = False
    head.returns_input = True  # this run's "logits" are the (scaled) decoder output
    try:
        outputs = type(model).forward(model, *args, **kwargs)
    finally:
        head.returns_input = False
    hidden = outputs.logits
    loss = fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                      labels.reshape(-1).to(hidden.device), head.bias, ignore_index=-100)
    loss = loss.to(hidden.dtype)  # T5's CrossEntropyLoss on its logits gives the loss in their dtype
    logits = None
    if not model.training or head.logits_in_training:
        logits = nn.functional.linear(hidden, head.weight, head.bias)
    return _output(head, outputs, {"loss": loss, "logits": logits})


class FusedLossLMHead(nn.Linear):
    """The model's lm_head (same parameters and keys) that, attached to the model, makes its forward
    compute the loss by fused linear cross-entropy (module docstring). As a module it is the Linear,
    except inside the encoder-decoder wrapper's run of the class's forward, where it returns its input."""

    logits_in_training = False
    output_class: type | None = None  # the original forward's output class (set by the rule's probe)
    cache_off_in_training = False  # the forward takes use_cache: training calls pass False unless given
    seq2seq = False  # an encoder-decoder: the wrapper runs the class's forward with this head returning its input
    router_aux_loss: Callable[..., Tensor] | None = None  # the model's load_balancing_loss_func (MoE)
    returns_input = False

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (torch's parameter name)
        return input if self.returns_input else super().forward(input)

    def wrapper(self) -> Callable[..., Any]:
        return _fused_seq2seq_forward if self.seq2seq else _fused_forward

    def attach(self, model: nn.Module) -> None:
        """Put the fused forward on the model instance, signing as the class's forward."""
        self.cache_off_in_training = _takes_use_cache(model, self.seq2seq)
        wrapper = functools.wraps(type(model).forward)(_own_function(self.wrapper()))
        model.forward = types.MethodType(wrapper, model)

    def detach(self, model: nn.Module) -> None:
        """Remove the instance's forward: the class's forward is the model's forward again."""
        if isinstance(model.__dict__.get("forward"), types.MethodType):
            del model.__dict__["forward"]


def _own_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object running `fn`'s code. functools.wraps sets the signature, name and module on
    the function it is given: each model's forward gets its own, so optimizing a model of another class
    does not re-sign the forwards attached before it."""
    own = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    return own


def _takes_use_cache(model: nn.Module, seq2seq: bool) -> bool:
    """Whether the forward the wrapper calls (the class's for an encoder-decoder, else the base model's)
    has a `use_cache` parameter."""
    target = model if seq2seq else getattr(model, getattr(model, "base_model_prefix", ""), None)
    return isinstance(target, nn.Module) and "use_cache" in inspect.signature(type(target).forward).parameters


def _probe(model: nn.Module, head: FusedLossLMHead) -> str | None:
    """Why the fused forward differs from the model's on a (1, 6) batch, or None when it agrees. Sets
    `head.output_class` to the class the original returns."""
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, head.out_features, (1, 6), generator=g).to(head.weight.device)
    labels = ids.clone()
    labels[0, 2] = -100
    # an encoder-decoder's target of another length than its source
    inputs = {"input_ids": ids, "labels": labels[:, :5] if head.seq2seq else labels, "use_cache": False}
    if head.router_aux_loss is not None:
        inputs["output_router_logits"] = True  # the aux loss is part of what is checked

    def run(forward: Callable[..., Any]) -> Any:
        with torch.random.fork_rng(devices=[ids.device] if ids.device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(0)
            saved = model.lm_head
            model._modules["lm_head"] = head  # the probe's own head; put back below
            try:
                saved_flag, head.logits_in_training = head.logits_in_training, True
                return forward(model, **inputs)
            finally:
                head.logits_in_training = saved_flag
                model._modules["lm_head"] = saved

    ref = run(type(model).forward)
    head.output_class = type(ref)
    ours = run(head.wrapper())
    if not same_output(ref.loss, ours.loss.to(ref.loss.dtype)):
        return f"loss {float(ours.loss):.6g} instead of {float(ref.loss):.6g} on a probe batch"
    if not same_output(ref.logits, ours.logits):
        return "logits differ on a probe batch (soft-capping or scaling of the logits?)"
    if getattr(ref, "aux_loss", None) is not None and not same_output(ref.aux_loss, getattr(ours, "aux_loss", None)):
        return "the router aux loss differs on a probe batch"
    return None


def _router_aux_loss(model: nn.Module) -> Callable[..., Tensor] | str | None:
    """For a forward taking `output_router_logits`: the `load_balancing_loss_func` of the module that
    defines the forward, or why we cannot add the aux loss as it does. None: no router logits."""
    forward = type(model).forward
    if "output_router_logits" not in inspect.signature(forward).parameters:
        return None
    owner = next(k for k in type(model).__mro__ if "forward" in vars(k))
    func = getattr(sys.modules.get(owner.__module__), "load_balancing_loss_func", None)
    missing = [a for a in _ROUTER_ATTRS if not hasattr(model, a)]
    if not callable(func) or missing or not hasattr(getattr(model, "config", None), "output_router_logits"):
        return (f"takes output_router_logits, but its router aux loss is not transformers' load_balancing_loss_func "
                f"with {', '.join(_ROUTER_ATTRS)}")
    return func


def _causal_left_alone(model: nn.Module, kind: str) -> str | None:
    """Why a causal LM's loss is not ForCausalLMLoss on the base model's output, or None."""
    prefix = model.base_model_prefix
    if not isinstance(prefix, str) or not isinstance(getattr(model, prefix, None), nn.Module):
        return f"{kind} has no base model at .{prefix}"
    expected = _causal_lm_loss_function()
    try:
        loss_function = model.loss_function
    except Exception:  # noqa: BLE001 (a property that raises: not a transformers causal LM)
        loss_function = None
    if expected is None or getattr(loss_function, "__wrapped__", loss_function) is not expected:
        return f"{kind}'s loss_function is not transformers' ForCausalLMLoss"
    return None


def _seq2seq_left_alone(model: nn.Module, kind: str) -> str | None:
    """Why an encoder-decoder's logits are not lm_head's output alone, or its decoder inputs cannot be made
    from the labels as its forward makes them, or None."""
    own = [n for n, _ in (*model.named_parameters(recurse=False), *model.named_buffers(recurse=False))]
    if own:
        return f"{kind} holds {', '.join(own)} beside lm_head: its logits are not lm_head's output"
    if getattr(model.config, "final_logit_softcapping", None) is not None:
        return f"{kind} soft-caps its logits (config.final_logit_softcapping), which the encoder-decoder path does not"
    if not callable(getattr(model, "prepare_decoder_input_ids_from_labels", None)):
        return f"{kind} has no prepare_decoder_input_ids_from_labels to make decoder inputs from labels"
    if "decoder_input_ids" not in inspect.signature(type(model).forward).parameters:
        return f"{kind}.forward takes no decoder_input_ids"
    return None


class FusedLinearCrossEntropyRule:
    """A transformers *ForCausalLM's lm_head + ForCausalLMLoss, or a T5-style encoder-decoder's lm_head +
    cross-entropy -> FusedLossLMHead and the fused forward."""

    name = "fused_linear_cross_entropy"
    family = "cross_entropy"

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if name != "lm_head" or isinstance(module, FusedLossLMHead) or not isinstance(module, nn.Linear):
            return None
        config = getattr(model, "config", None)
        if getattr(model, "lm_head", None) is not module or config is None:
            return None
        seq2seq = bool(getattr(config, "is_encoder_decoder", False))
        if not seq2seq and not isinstance(getattr(model, "base_model_prefix", None), str):
            return None
        kind = type(model).__name__
        if "forward" in model.__dict__:
            return Match(None, f"{kind} already has a forward set on the instance")
        if (why := blocked(module)) is not None:
            return Match(None, why)
        if type(module).forward is not nn.Linear.forward:
            return Match(None, f"lm_head is a {type(module).__name__} with its own forward")
        for attr in _LOGIT_CHANGES:
            if getattr(config, attr, None) not in (None, 1.0):
                return Match(None, f"{kind} changes its logits (config.{attr}={getattr(config, attr)!r})")
        if "labels" not in inspect.signature(type(model).forward).parameters:
            return Match(None, f"{kind}.forward takes no labels")
        why = _seq2seq_left_alone(model, kind) if seq2seq else _causal_left_alone(model, kind)
        if why is not None:
            return Match(None, why)
        router = None if seq2seq else _router_aux_loss(model)
        if isinstance(router, str):
            return Match(None, f"{kind} {router}")
        names = tuple(n for n in ("weight", "bias") if getattr(module, n) is not None)
        head = build_on_meta(
            lambda: FusedLossLMHead(module.in_features, module.out_features, bias=module.bias is not None,
                                    device="meta"), module, names)
        head.seq2seq, head.router_aux_loss = seq2seq, router
        try:
            why = _probe(model, head)
        except Exception as exc:  # noqa: BLE001 (the model cannot run the probe: leave it)
            why = f"the probe batch fails ({type(exc).__name__}: {exc})"
        if why is not None:
            return Match(None, f"{kind}: {why}")
        return Match(head, _reason(model, module, kind, seq2seq, router is not None))


def _reason(model: nn.Module, module: nn.Linear, kind: str, seq2seq: bool, routed: bool) -> str:
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = " (tied to the input embedding)" if module.weight is getattr(embedding, "weight", None) else ""
    loss = "cross-entropy over the labels" if seq2seq else "ForCausalLMLoss"
    extras = [f"soft-capped at {model.config.final_logit_softcapping:g}"] if getattr(
        model.config, "final_logit_softcapping", None) is not None else []
    extras += ["+ router aux loss"] if routed else []
    extra = f" ({', '.join(extras)})" if extras else ""
    return (f"{kind} lm_head{tied} + {loss}{extra} -> fused linear cross-entropy "
            "(no logits and no KV cache in training with labels)")


CROSS_ENTROPY_RULES = (FusedLinearCrossEntropyRule(),)

__all__ = ["CROSS_ENTROPY_RULES", "FusedLinearCrossEntropyRule", "FusedLossLMHead", "fused_causal_lm_loss"]
