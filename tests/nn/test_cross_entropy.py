"""The cross-entropy modules: CrossEntropyLoss is torch's (arguments, layouts, state_dict, repr) with our kernels;
FusedLinearCrossEntropyLoss gives a Hugging Face Llama's causal-LM loss and gradients from its hidden
states and lm_head weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from kernel_pytorch import functional as F
from kernel_pytorch import nn as knn
from tests.grid import randn
from tests.ops.norm_helpers import assert_close


@pytest.mark.parametrize(
    ("shape", "target_shape", "kwargs"),
    [
        ((6, 9), (6,), {"reduction": "mean", "label_smoothing": 0.1, "ignore_index": 2}),
        ((2, 9, 3), (2, 3), {"reduction": "none"}),
        ((9,), (), {"reduction": "sum", "weight": torch.rand(9) + 0.5}),
    ],
)
def test_cross_entropy_loss_is_torchs(shape, target_shape, kwargs) -> None:
    ours, theirs = knn.CrossEntropyLoss(**kwargs), torch.nn.CrossEntropyLoss(**kwargs)
    assert isinstance(ours, torch.nn.CrossEntropyLoss)
    assert ours.state_dict().keys() == theirs.state_dict().keys() and repr(ours) == repr(theirs)
    x = randn(*shape).requires_grad_()
    target = torch.randint(0, 9, target_shape)
    got, want = ours(x, target), theirs(x, target)
    assert_close(got, want, "loss")
    dloss = torch.rand(want.shape) + 0.25
    assert_close(torch.autograd.grad(got, x, dloss)[0], torch.autograd.grad(want, x, dloss)[0], "grad")


def test_cross_entropy_loss_extras_and_soft_targets() -> None:
    x, target = randn(4, 7).requires_grad_(), torch.randint(0, 7, (4,))
    z = knn.CrossEntropyLoss(lse_square_scale=1e-2, softcap=3.0)(x, target)
    capped = 3.0 * torch.tanh(x / 3.0)
    want = TF.cross_entropy(capped, target) + 1e-2 * torch.logsumexp(capped, -1).pow(2).mean()
    assert_close(z, want, "z-loss + softcap")
    probs = torch.softmax(randn(4, 7), -1)
    assert_close(knn.CrossEntropyLoss()(x, probs), TF.cross_entropy(x, probs), "soft targets")


def test_fused_linear_cross_entropy_loss_matches_hf_llama() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).float()
    ids = torch.randint(0, 64, (2, 7))
    labels = ids.clone()
    labels[0, :2] = -100
    hf_loss = model(input_ids=ids, labels=labels).loss
    hf_grads = torch.autograd.grad(hf_loss, list(model.parameters()))

    hidden = model.model(input_ids=ids).last_hidden_state
    target = labels[:, 1:]  # the causal shift: position i predicts token i + 1
    loss_fn = knn.FusedLinearCrossEntropyLoss(ignore_index=-100, reduction="mean")
    ours = loss_fn(hidden[:, :-1].reshape(-1, 16), model.lm_head.weight, target.reshape(-1))
    assert_close(ours, hf_loss, "loss")
    for (name, _), got, want in zip(model.named_parameters(), torch.autograd.grad(ours, list(model.parameters())),
                                    hf_grads):
        assert_close(got, want, name)


def test_cross_entropy_loss_extras_in_torchs_layout() -> None:
    """(N, C, d) logits: the predicted tokens and per-token scales have the target's (N, d) shape."""
    x, target = randn(2, 9, 3).requires_grad_(), torch.randint(0, 9, (2, 3))
    target[0, 1] = -100
    u = torch.rand(2, 3) + 0.5
    loss_fn = knn.CrossEntropyLoss(lse_square_scale=1e-2, return_z_loss=True, return_token_accuracy=True,
                                   return_predicted_tokens=True)
    assert repr(loss_fn) == repr(torch.nn.CrossEntropyLoss())
    out = loss_fn(x, target, token_scale=u)
    want = F.cross_entropy(x.movedim(1, -1), target, lse_square_scale=1e-2, token_scale=u, return_z_loss=True,
                           return_token_accuracy=True, return_predicted_tokens=True, backend="reference")
    assert out.predicted_tokens.shape == (2, 3) and out.predicted_tokens[0, 1] == -1
    for got, ref, name in zip(out[:3], want[:3], out._fields):
        assert_close(got, ref, name)
    assert torch.equal(out.predicted_tokens, want.predicted_tokens)
    with pytest.raises(ValueError, match="need class-index targets"):
        loss_fn(x, torch.softmax(randn(2, 9, 3), 1))


def test_fused_linear_cross_entropy_loss_extras_export() -> None:
    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm_head = torch.nn.Linear(8, 11, bias=False)
            self.loss = knn.FusedLinearCrossEntropyLoss(return_z_loss=True, return_token_accuracy=True,
                                                        return_predicted_tokens=True, lse_square_scale=1e-3)

        def forward(self, hidden, target, token_scale):
            return self.loss(hidden, self.lm_head.weight, target, token_scale=token_scale)

    head = Head()
    hidden, target = randn(6, 8), torch.randint(0, 11, (6,))
    target[2] = -100
    u = torch.rand(6) + 0.5
    want = head(hidden, target, u)
    ep = torch.export.export(head, (hidden, target, u))
    assert "kernel_pytorch.fused_linear_cross_entropy_fwd" in str(ep.graph)
    got = ep.module()(hidden, target, u)
    for a, b, name in zip(got[:3], want[:3], want._fields):
        assert_close(a, b, name)
    assert torch.equal(got[3], want.predicted_tokens)
