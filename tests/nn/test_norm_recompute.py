"""nn/_recompute: a norm's output that a projection saves is made again in the backward, not kept."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
import torch.nn.functional as TF

import kernel_pytorch as kp
from kernel_pytorch.nn import _recompute
from kernel_pytorch.nn._recompute import recompute_norm_outputs


def _norm_and_weights(seed: int = 0) -> tuple[kp.nn.RMSNorm, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    norm = kp.nn.RMSNorm(16, eps=1e-6)
    norm.recompute_output = True
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, torch.randn(3, 16, requires_grad=True), torch.randn(2, 8, 16, requires_grad=True)


def _grads(recompute: bool, corrupt: bool) -> list[torch.Tensor]:
    """Gradients of a norm feeding a projection (and a view of its output feeding another), with the
    output's storage zeroed behind autograd's back after the forward when `corrupt`."""
    norm, w, x = _norm_and_weights()
    norm.recompute_output = recompute
    y = norm(x)
    with recompute_norm_outputs():
        z = TF.linear(y, w) + TF.linear(y[:, 2:6].reshape(-1, 16), w).sum()
    if corrupt:
        y.data.zero_()  # a kept output would now give zero weight gradients
    z.square().sum().backward()
    return [w.grad, x.grad, norm.weight.grad]


def test_the_backward_makes_the_output_again_and_gets_the_same_gradients() -> None:
    expected = _grads(recompute=False, corrupt=False)
    for got, want in zip(_grads(recompute=True, corrupt=True), expected):
        assert torch.equal(got, want)
    # the same corruption with the output kept changes the gradients: the check above can fail
    assert not torch.equal(_grads(recompute=False, corrupt=True)[0], expected[0])


def test_nothing_is_remembered_without_a_gradient_or_inside_other_hooks() -> None:
    norm, _, x = _norm_and_weights()
    with torch.no_grad():
        y0 = norm(x)
    assert y0.untyped_storage().data_ptr() not in _recompute._LIVE
    y = norm(x)
    key = y.untyped_storage().data_ptr()
    assert key in _recompute._LIVE
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # e.g. activation checkpointing
        assert isinstance(recompute_norm_outputs(), contextlib.nullcontext)
    del y
    assert key not in _recompute._LIVE  # forgotten with the output


def test_a_parameter_changed_in_place_after_the_forward_is_reported() -> None:
    norm, w, x = _norm_and_weights()
    y = norm(x)
    with recompute_norm_outputs():
        z = TF.linear(y, w)
    with torch.no_grad():
        norm.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place after the forward"):
        z.sum().backward()


def test_an_optimized_hf_llama_makes_two_norm_outputs_per_layer_again(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 128, (2, 12))
    model, report = kp.optimize(model, {"input_ids": ids, "labels": ids}, compile=False, validate=False)
    norms = [m for m in model.modules() if isinstance(m, kp.nn.RMSNorm)]
    assert len(norms) == 2 * config.num_hidden_layers + 1 and all(m.recompute_output for m in norms)
    made = []
    output = _recompute._Source.output

    def counted(self: _recompute._Source) -> torch.Tensor:
        if self.made is None:
            made.append(self.module)
        return output(self)

    monkeypatch.setattr(_recompute._Source, "output", counted)
    runs = []
    for recompute in (True, False):
        for m in norms:
            m.recompute_output = recompute
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        runs.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    assert len(made) == 2 * config.num_hidden_layers  # input and post-attention norms, once each
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("recompute", [True, False])
def test_the_output_is_freed_after_the_forward_only_when_made_again(recompute: bool) -> None:
    norm, w, x = _norm_and_weights()
    norm.recompute_output = recompute
    y = norm(x)
    storage = weakref.ref(y.untyped_storage())  # storages keep their Python object while alive
    with recompute_norm_outputs():
        z = TF.linear(y, w)
    del y
    gc.collect()
    assert (storage() is None) is recompute
    z.sum().backward()
