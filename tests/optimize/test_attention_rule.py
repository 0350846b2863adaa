"""The "attention" rule: HF decoder attention becomes HFAttention, which issues SDPA with is_causal=True,
no mask and K/V not repeated whenever the call's mask is plain causal (whatever mask transformers
built), passes transformers' mask on otherwise (padding, a binding sliding window), and leaves modules
it cannot reproduce alone with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rules.attention import AttentionRule, HFAttention, MaskHint
from kernel_pytorch.tolerances import compare
from tests.optimize import models

transformers = pytest.importorskip("transformers")


class _Record(TorchFunctionMode):
    """Records (has a mask, is_causal, enable_gqa) of every eager SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, bool, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls.append((kwargs.get("attn_mask") is not None, kwargs.get("is_causal", False),
                               kwargs.get("enable_gqa", False)))
        return func(*args, **kwargs)


def _eager_sdpa_calls(model: torch.nn.Module, **inputs: torch.Tensor) -> list[tuple[bool, bool, bool]]:
    with torch.no_grad(), _Record() as record:
        model(**inputs)
    return record.calls


def _sdpa_calls(model: torch.nn.Module, **inputs: torch.Tensor) -> list[tuple[bool, bool, bool]]:
    """(has a mask, is_causal, enable_gqa) of every SDPA call in the compiled graph of model(**inputs)."""
    calls = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        for node in gm.graph.nodes:
            if node.target is torch.nn.functional.scaled_dot_product_attention:
                calls.append((node.kwargs.get("attn_mask") is not None, node.kwargs.get("is_causal", False),
                              node.kwargs.get("enable_gqa", False)))
        return gm

    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(**inputs)
    return calls


def test_fast_call_under_compile_whatever_mask_transformers_builds() -> None:
    # with attn_implementation="eager" transformers hands every layer a materialised additive mask
    # (transformers 5.17 does the same with "sdpa" under torch.compile)
    torch.manual_seed(0)
    model, inputs = models.llama(attn_implementation="eager")
    optimize(model, inputs, components="attention", seeds=(0,))
    assert _sdpa_calls(model, **inputs) == [(False, True, True)] * 2  # no mask, is_causal, GQA (2 of 4 heads)
    assert _eager_sdpa_calls(model, **inputs) == [(False, True, True)] * 2


def test_padding_mask_is_passed_on_and_correct() -> None:
    torch.manual_seed(0)
    model, inputs = models.llama()
    reference = copy.deepcopy(model)
    optimize(model, inputs, components="attention", seeds=(0,))
    mask = torch.ones_like(inputs["input_ids"])
    mask[0, :3] = 0  # left padding
    assert _eager_sdpa_calls(model, input_ids=inputs["input_ids"], attention_mask=mask) == [(True, False, True)] * 2
    assert _eager_sdpa_calls(model, input_ids=inputs["input_ids"], attention_mask=torch.ones_like(mask)) == [
        (False, True, True)] * 2  # all ones: checked in eager, plain causal
    ours = model(input_ids=inputs["input_ids"], attention_mask=mask).logits
    theirs = reference(input_ids=inputs["input_ids"], attention_mask=mask).logits
    result = compare(ours[mask.bool()], theirs[mask.bool()])
    assert result.passed, result.message()


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_binding_sliding_window_passes_the_window(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window shorter than the call (6 < 8 tokens: every Mistral layer, Gemma 3's sliding layer 0) goes to
    attention(window=6), not transformers' dense mask (on the CPU SDPA gets the mask that window makes),
    and computes what the original computes, gradients included."""
    from kernel_pytorch.optimize.rules.attention import rule

    torch.manual_seed(0)
    model, inputs = getattr(models, family)()
    reference = copy.deepcopy(model)
    optimize(model, inputs, components="attention", seeds=(0,))
    windows = []
    real = rule.attention
    monkeypatch.setattr(rule, "attention", lambda *a, **k: windows.append((k.get("window"), k.get("mask"))) or
                        real(*a, **k))
    ours, theirs = model(**inputs).loss, reference(**inputs).loss
    assert windows == ([(6, None)] * 2 if family == "mistral" else [(6, None), (None, None)])
    ours.backward()
    theirs.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        result = compare(p.grad, q.grad)
        assert result.passed, f"{name}: {result.message()}"
    assert all(has_mask for has_mask, _, _ in _eager_sdpa_calls(model, input_ids=inputs["input_ids"])[:1])
    short = inputs["input_ids"][:, :6]  # within the window: plain causal again
    assert _eager_sdpa_calls(model, input_ids=short) == [(False, True, True)] * 2


def test_layer_window_is_the_one_transformers_masks_with() -> None:
    """The layer's attribute (Gemma 3: 6 on sliding layers, None on full ones), else the config's layer_types
    (Qwen2-MoE keeps the attribute on sliding layers only, and its config's window is 0 when unused), else the
    config's window on every layer (Mistral); a window that is not a positive int is not understood."""
    from kernel_pytorch.optimize.rules.attention.rule import _layer_window

    gemma, _ = models.gemma3()
    assert [_layer_window(m.self_attn, gemma.config) for m in gemma.model.layers] == [(6, True), (None, True)]
    mistral, _ = models.mistral()
    assert _layer_window(mistral.model.layers[1].self_attn, mistral.config) == (6, True)
    moe, _ = models.qwen2_moe()
    assert moe.config.sliding_window == 0 and _layer_window(moe.model.layers[0].self_attn, moe.config) == (None, True)
    odd = torch.nn.Module()
    odd.sliding_window = 0
    assert _layer_window(odd, moe.config) == (None, False)


def test_hint_hooks_follow_the_swaps() -> None:
    torch.manual_seed(0)
    model, inputs = models.llama()
    optimize(model, inputs, components="attention", seeds=(0,))
    hints = [h.__self__ for h in model._forward_pre_hooks.values() if isinstance(h.__self__, MaskHint)]
    assert len(hints) == 1 and hints[0].users == 2 and not hints[0].plain_causal  # cleared after each call
    twin = copy.deepcopy(model)  # a copy gets its own hint, wired to its own layers
    twin_hint = twin.model.layers[0].self_attn.hint
    assert twin_hint is not hints[0] and twin_hint is twin.model.layers[1].self_attn.hint
    for layer in model.model.layers:
        layer.self_attn.detach(model)
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_left_alone_with_reasons() -> None:
    model, inputs = models.llama(attention_dropout=0.1)
    _, report = optimize(model, inputs, components="attention", seeds=(0,))
    assert report.counts() == {} and all("attention_dropout" in c.reason for c in report.skipped())
    model, _ = models.llama()
    model.config._attn_implementation = "flex_attention"
    match = AttentionRule().match(model.model.layers[0].self_attn, "model.layers.0.self_attn", model)
    assert match is not None and match.replacement is None and "flex_attention" in match.reason
    model, inputs = models.gpt2()  # Conv1D c_attn: not this shape at all
    assert not any(AttentionRule().match(m, n, model) for n, m in model.named_modules() if n)


def test_keeps_attributes_children_and_keys() -> None:
    model, inputs = models.qwen3()
    old = model.model.layers[1].self_attn
    keys = list(old.state_dict())
    optimize(model, inputs, components="attention", seeds=(0,))
    new = model.model.layers[1].self_attn
    assert isinstance(new, HFAttention) and new.layer_idx == 1 and new.q_proj is old.q_proj
    assert list(new.state_dict()) == keys and type(new.q_norm).__name__ == "RMSNorm"


def test_gradient_checkpointing_recomputes_the_same_call() -> None:
    torch.manual_seed(0)
    model, inputs = models.llama(attn_implementation="eager")
    reference = copy.deepcopy(model)
    optimize(model, inputs, components="attention", seeds=(0,))
    for m in (model, reference):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
        m(**inputs).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        result = compare(p.grad, q.grad)
        assert result.passed, f"{name}: {result.message()}"


def test_mask_hint_reads_the_call() -> None:
    hint = MaskHint()
    ids, ones = torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    cases = [
        ({"input_ids": ids, "labels": ids}, True),
        ({"input_ids": ids, "attention_mask": ones}, True),  # all ones: checked (eager)
        ({"input_ids": ids, "attention_mask": ones.tril(1)}, False),  # padding
        ({"input_ids": ids, "position_ids": ids}, False),  # could be packed documents
        ({"input_ids": ids, "attention_mask": ones, "position_ids": ids}, True),  # a mask given: no packing
        ({"input_ids": ids, "token_type_ids": ids}, False),  # may shape the mask (Gemma 3 images)
        ({"input_ids": ids, "past_key_values": object()}, False),
    ]
    for kwargs, plain in cases:
        hint.before(torch.nn.Identity(), (), kwargs)
        assert hint.plain_causal is plain, kwargs
        hint.after(torch.nn.Identity(), (), kwargs, None)
        assert not hint.plain_causal
    hint.before(torch.nn.Identity(), (ids, ones), {})  # a positional mask: not read, not plain
    assert not hint.plain_causal


@pytest.mark.parametrize("name", ["past_key_values", "cache"])
def test_the_kv_cache_is_taken_under_either_name(name: str) -> None:
    # transformers hands attention the cache as `past_key_values`, newer releases as `cache`
    torch.manual_seed(0)
    model, inputs = models.llama()
    optimize(model, inputs, components="attention", seeds=(0,))
    attn = model.model.layers[0].self_attn
    assert isinstance(attn, HFAttention)
    hidden = torch.randn(2, 8, model.config.hidden_size)
    position_embeddings = model.model.rotary_emb(hidden, torch.arange(8)[None].expand(2, -1))
    cache = transformers.DynamicCache()
    with torch.no_grad():
        attn(hidden, position_embeddings, None, **{name: cache})
    assert cache.get_seq_length(0) == 8


class _Raises(transformers.models.llama.modeling_llama.LlamaAttention):
    """A Llama attention by structure whose forward fails on any input."""

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):  # noqa: ANN001, ANN201
        raise RuntimeError("cannot attend to a probe")


def test_probe_failure_reason_carries_the_error() -> None:
    model, _ = models.llama()
    module = _Raises(model.config, layer_idx=0)
    match = AttentionRule().match(module, "model.layers.0.self_attn", model)
    assert match is not None and match.replacement is None
    assert "on a probe (RuntimeError: cannot attend to a probe)" in match.reason


@pytest.mark.parametrize("family", ["gpt_neox", "falcon", "falcon_multi_query", "falcon_per_head"])
def test_packed_layouts_split_as_the_module_does(family: str) -> None:
    # q/k/v cut from query_key_value's output must be the heads the module itself attends with: with
    # cos = 1, sin = 0 (no rotation) and no mask, module and replacement see the same q, k, v
    torch.manual_seed(0)
    model, _ = getattr(models, family)()
    old = next(m for n, m in model.named_modules() if n.endswith(("attention", "self_attention")))
    match = AttentionRule().match(old, "attn", model)
    assert match is not None and match.replacement is not None, match
    hidden = torch.randn(2, 5, 32)
    rot = torch.ones(1, 5, 8), torch.zeros(1, 5, 8)
    if family == "gpt_neox":
        rot = rot[0][..., :2], rot[1][..., :2]  # a quarter of each head rotates
    with torch.no_grad():
        result = compare(match.replacement(hidden, position_embeddings=rot)[0],
                         old(hidden, attention_mask=None, position_embeddings=rot)[0])
    assert result.passed, result.message()


def test_alibi_and_broken_layouts_left_alone_with_reasons() -> None:
    model, _ = models.falcon(new_decoder_architecture=False, multi_query=False, num_kv_heads=4, alibi=True)
    match = AttentionRule().match(model.transformer.h[0].self_attention, "attn", model)
    assert match is not None and match.replacement is None and "ALiBi" in match.reason
    model, _ = models.falcon(new_decoder_architecture=False, multi_query=False, num_kv_heads=2)
    match = AttentionRule().match(model.transformer.h[0].self_attention, "attn", model)
    assert match is not None and match.replacement is None and "num_kv_heads=2 != 4 heads" in match.reason


def test_packed_replacement_keeps_children_and_keys() -> None:
    model, inputs = models.falcon()
    old = model.transformer.h[1].self_attention
    keys = list(old.state_dict())
    optimize(model, inputs, components="attention", seeds=(0,))
    new = model.transformer.h[1].self_attention
    assert isinstance(new, HFAttention) and new.query_key_value is old.query_key_value and new.dense is old.dense
    assert list(new.state_dict()) == keys and (new.n_heads, new.n_kv_heads, new.layout.kind) == (4, 2, "grouped")
