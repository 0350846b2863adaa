"""nn/_recompute: a norm's output that a projection saves is made again in the backward, not kept."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as TF

import kernel_pytorch as kp
from kernel_pytorch.nn import _recompute
from kernel_pytorch.nn._recompute import recompute_norm_outputs
from kernel_pytorch.tolerances import compare_reordered
from tests.grid import device_under_test, randn

DEV = device_under_test()


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


def _optimized_llama(layers: int) -> tuple[torch.nn.Module, torch.Tensor, list[kp.nn.RMSNorm]]:
    """A tiny random HF Llama in training mode, optimize()d (no compile, no validation): the model,
    input ids (2, 12) and its RMSNorms."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 128, (2, 12))
    model, _ = kp.optimize(model, {"input_ids": ids, "labels": ids}, compile=False, validate=False)
    return model, ids, [m for m in model.modules() if isinstance(m, kp.nn.RMSNorm)]


def test_an_optimized_hf_llama_makes_two_norm_outputs_per_layer_again(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, ids, norms = _optimized_llama(2)
    config = model.config
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


class _NormQK(torch.nn.Module):
    """x (B, T, D) -> RMSNorm -> the q and k projections, as in a decoder layer's attention."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = kp.nn.RMSNorm(dim, eps=1e-6)
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.k = torch.nn.Linear(dim, dim // 2, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.norm(x)
        return self.q(y), self.k(y)


@contextlib.contextmanager
def _saved_numels() -> Iterator[list[int]]:
    """The element counts of the tensors saved for the backward inside it (a compiled forward: those
    its graph saves)."""
    numels: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        numels.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield numels


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    # the partitioner Inductor uses (min-cut), without its code generation: a second instead of ten
    return torch.compile(model, fullgraph=True, backend="aot_eager_decomp_partition")


def _step(model: _NormQK, x: torch.Tensor, compiled: bool) -> tuple[list[torch.Tensor], list[int]]:
    """Outputs and gradients (x, then the parameters) of one forward and backward, and the element
    counts of the tensors the forward saved for the backward."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with _saved_numels() as numels:
        q, k = (_compiled(model) if compiled else model)(x)
    torch.autograd.backward((q, k), (torch.ones_like(q), torch.full_like(k, 0.5)))
    return [q.detach(), k.detach(), x.grad] + [p.grad for p in model.parameters()], numels


def test_a_compiled_forward_keeps_the_norm_input_and_the_backward_makes_the_output_again() -> None:
    torch._dynamo.reset()
    dtype, (b, t, d) = torch.bfloat16, (2, 8, 64)
    model = _NormQK(d).to(DEV, dtype)
    x = randn(b, t, d, dtype=dtype, device=DEV)
    runs = {}
    model.norm.compiled_norm = "op"  # our op both ways: the same kernels, so bitwise the same gradients
    for recompute in (False, True):
        model.norm.recompute_output = recompute
        runs[recompute] = _step(model, x, compiled=True)
    (kept, kept_numels), (made, made_numels) = runs[False], runs[True]
    # kept: x (for the norm's backward) and the norm output (for the projections'); made: x alone
    assert kept_numels.count(b * t * d) == 2 and made_numels.count(b * t * d) == 1
    assert sum(made_numels) <= sum(kept_numels) - b * t * d
    for got, want in zip(made, kept):
        assert torch.equal(got, want)  # the same kernels on the same input
    del model.norm.compiled_norm  # the default: the norm's math handed to Inductor, recomputed the same way
    torch._dynamo.reset()
    model.norm.recompute_output = True
    fused, fused_numels = _step(model, x, compiled=True)
    assert sorted(fused_numels) == sorted(made_numels)
    model.norm.recompute_output = False
    eager = _step(model, x, compiled=False)[0]
    for name, run in (("op", made), ("inductor", fused)):
        for got, want in zip(run, eager):
            result = compare_reordered(got, want)
            assert result.passed, result.message(f"compiled ({name}) against eager")


@pytest.mark.parametrize(("compiled_norm", "backend", "expected"),
                         [("inductor", "auto", "reference"), ("op", "auto", "auto"), ("inductor", "triton", "triton")])
def test_compiled_norm_picks_the_math_a_compiled_training_graph_gets(
        monkeypatch: pytest.MonkeyPatch, compiled_norm: str, backend: str, expected: str) -> None:
    """The recompute region of a compiled training graph runs the reference math (plain torch ops, which
    Inductor fuses) by default, our op with compiled_norm="op", and a backend set on the instance as given."""
    from kernel_pytorch.nn import norm as norm_mod

    seen: list[str] = []
    real = norm_mod.F.rms_norm
    monkeypatch.setattr(norm_mod.F, "rms_norm", lambda *a, **kw: seen.append(kw["backend"]) or real(*a, **kw))
    norm, _, x = _norm_and_weights()
    norm.compiled_norm, norm.backend = compiled_norm, backend
    if backend == "triton":
        monkeypatch.setattr(norm_mod.F, "rms_norm", lambda *a, **kw: seen.append(kw["backend"]) or x)
    norm._compiled_normed(x)
    norm._normed(x)  # eager and inference: the instance's backend
    assert seen == [expected, backend]


@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_the_plain_norm_with_recompute_output(strict: bool) -> None:
    model = _NormQK(16)
    model.norm.recompute_output = True
    x = torch.randn(3, 16)
    for train in (True, False):
        model.train(train)
        program = torch.export.export(model, (x,), strict=strict)
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
        assert "kernel_pytorch.rms_norm_fwd.default" in targets
        assert not any("checkpoint" in name for name in targets)  # no checkpoint region in the program
        for got, want in zip(program.module()(x), model(x)):
            assert torch.equal(got, want)


def test_a_compiled_optimized_hf_llama_keeps_two_norm_outputs_less_per_layer() -> None:
    torch._dynamo.reset()
    model, ids, norms = _optimized_llama(1)
    config = model.config
    runs = {}
    for m in norms:
        m.compiled_norm = "op"  # bitwise-equal gradients below need our op both ways
    for recompute in (False, True):
        for m in norms:
            m.recompute_output = recompute
        model.zero_grad(set_to_none=True)
        with _saved_numels() as numels:
            loss = _compiled(model)(input_ids=ids, labels=ids).loss
        loss.backward()
        runs[recompute] = numels, [loss.detach()] + [p.grad for p in model.parameters()]
    tokens_x_hidden = ids.numel() * config.hidden_size
    (kept_numels, kept), (made_numels, made) = runs[False], runs[True]
    # the input and post-attention norms' outputs, which q/k/v and gate/up would keep
    assert kept_numels.count(tokens_x_hidden) - made_numels.count(tokens_x_hidden) == 2 * config.num_hidden_layers
    assert all(torch.equal(a, b) for a, b in zip(kept, made))
