"""Packed sequences through optimize(): rows holding several documents, position_ids restarting at each and
the first label of each document ignored (as DataCollatorWithFlattening makes them). The packed step's
loss and every gradient equal those of the documents run one by one (their losses weighted by their
token counts), for plain transformers (the reference behaviour, with no cache in the call) and for the
optimized model, eager and compiled; the optimized layers attend through the document ids, not
transformers' dense mask."""

from __future__ import annotations

import copy

import pytest
import torch

from kernel_pytorch.optimize import optimize
from kernel_pytorch.optimize.rules.attention import MaskHint
from kernel_pytorch.optimize.rules.attention import rule as attention_rule
from kernel_pytorch.reference import seq_ids_from_position_ids
from kernel_pytorch.tolerances import compare_reordered
from tests.optimize import models

transformers = pytest.importorskip("transformers")

LENGTHS = ((5, 3, 8), (10, 6))  # two rows of 16 tokens: documents of 5, 3, 8 and of 10, 6


def packed_batch(lengths: tuple[tuple[int, ...], ...] = LENGTHS, seed: int = 0) -> dict[str, torch.Tensor]:
    """input_ids, labels (-100 at each document's first token) and position_ids restarting per document."""
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths[0])
    ids = torch.randint(3, models.VOCAB, (len(lengths), t), generator=g)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in lengths])
    labels = ids.clone()
    labels[positions == 0] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def one_by_one_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                    lengths: tuple[tuple[int, ...], ...] = LENGTHS) -> torch.Tensor:
    """The packed loss computed document by document: each document's mean loss times its predicted
    tokens (all but its first), summed, over all the predicted tokens."""
    total, count = 0.0, 0
    for b, row in enumerate(lengths):
        start = 0
        for n in row:
            doc = slice(start, start + n)
            loss = model(input_ids=batch["input_ids"][b:b + 1, doc], labels=batch["labels"][b:b + 1, doc],
                         use_cache=False).loss
            total, count = total + loss * (n - 1), count + (n - 1)
            start += n
    return total / count


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad]))


def assert_packed_equals_one_by_one(packed_model: torch.nn.Module, model: torch.nn.Module,
                                    batch: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> None:
    """packed_model's packed step (loss, every gradient) against `model`'s documents one by one (the same
    parameters: packed_model may be `model` compiled), within the table's reordering tolerance for `dtype`
    (default: the tensors' own)."""
    packed = packed_model(**batch, use_cache=False).loss
    got = _grads(model, packed)
    one = one_by_one_loss(model, batch)
    expected = _grads(model, one)
    result = compare_reordered(packed.detach(), one.detach(), dtype)
    assert result.passed, f"loss: {result.message()}"
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    for name, a, b in zip(names, got, expected):
        result = compare_reordered(a, b, dtype)
        assert result.passed, f"grad {name}: {result.message()}"


def _optimized(family: str, dtype: torch.dtype = torch.float64) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the HF model, its optimized copy), both in `dtype` in training mode; optimized on a packed batch in
    fp32 (validated against the original on it)."""
    torch.manual_seed(0)
    model, _ = getattr(models, family)()
    ours = copy.deepcopy(model)
    ours, report = optimize(ours, packed_batch(seed=1), seeds=(0,), compile=False)
    assert report.passed and report.counts().get("hf_attention"), report.summary(validation=False)
    return model.to(dtype).train(), ours.to(dtype).train()


class _Calls:
    """Records (seq_ids given, mask given, is_causal, window) of the attention rule's calls of
    functional.attention (under torch.compile, when the call is traced), and in eager the seq_ids."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[bool, bool, bool, int | None]] = []
        self.seq_ids: list[torch.Tensor] = []
        real = attention_rule.attention

        def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            seq_ids = kwargs.get("seq_ids")
            self.calls.append((seq_ids is not None, kwargs.get("mask") is not None, kwargs.get("is_causal", False),
                               kwargs.get("window")))
            if seq_ids is not None and not torch.compiler.is_compiling():
                self.seq_ids.append(seq_ids)
            return real(*args, **kwargs)

        monkeypatch.setattr(attention_rule, "attention", spy)


def test_transformers_packs_only_without_a_cache() -> None:
    """The reference behaviour (transformers 5.x): documents read from position_ids when the call has no
    cache; a training call with the config's use_cache=True makes one and attends across documents."""
    torch.manual_seed(0)
    model, _ = models.llama()
    model = model.double().train()
    batch = packed_batch()
    assert_packed_equals_one_by_one(model, model, batch)
    with torch.no_grad():
        crossing = model(**batch).loss  # use_cache from the config: a cache, no document mask
        one = one_by_one_loss(model, batch)
    assert not compare_reordered(crossing, one).passed


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gemma2", "mistral", "qwen2_moe"])
def test_optimized_packed_step_equals_documents_one_by_one(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama; Qwen3 (q/k norms); Gemma 3 (sliding layers, a window of 6 binding inside documents of 8 and
    10); Gemma 2 (soft-capped scores: the eager reference with documents); Mistral (a window on every
    layer); Qwen2-MoE (its config's window 0, unused: full layers; the expert block left alone). The fused
    loss calls the model with use_cache=False in training, so even the config's default call packs."""
    # transformers' grouped expert GEMMs take no fp64: the MoE model runs in fp32
    model, ours = _optimized(family, torch.float32 if family == "qwen2_moe" else torch.float64)
    batch = packed_batch()
    calls = _Calls(monkeypatch)
    assert_packed_equals_one_by_one(ours, ours, batch)
    packed_calls = calls.calls[:2]  # the packed forward's two layers
    assert all(docs and not mask and causal for docs, mask, causal, _ in packed_calls)
    assert torch.equal(calls.seq_ids[0], seq_ids_from_position_ids(batch["position_ids"]))
    windows = {window for *_, window in packed_calls}
    assert windows == ({6} if family == "mistral" else {None, 6} if family.startswith("gemma") else {None})
    # transformers alike; its Gemma norms compute in fp32 whatever the model's dtype
    assert_packed_equals_one_by_one(model, model, batch, torch.float32 if "gemma" in family else None)
    default = ours(**batch).loss  # no use_cache given: the fused loss turns the cache off in training
    assert compare_reordered(default.detach(), one_by_one_loss(ours, batch).detach()).passed


def test_one_document_per_row_takes_the_plain_causal_call(monkeypatch: pytest.MonkeyPatch) -> None:
    _, ours = _optimized("llama")
    batch = packed_batch(((16,), (16,)))
    calls = _Calls(monkeypatch)
    with torch.no_grad():
        ours(**batch)
    assert calls.calls and all(not docs and not mask and causal for docs, mask, causal, _ in calls.calls)


def test_activation_checkpointing_recomputes_per_document() -> None:
    model, ours = _optimized("llama")
    batch = packed_batch()
    ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert_packed_equals_one_by_one(ours, ours, batch)


def test_mask_hint_reads_packed_calls() -> None:
    hint = MaskHint()
    ids, ones = torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    flash = {"cu_seq_lens_q": ids[0], "cu_seq_lens_k": ids[0], "max_length_q": 4, "max_length_k": 4}
    cases = [
        ({"input_ids": ids, "position_ids": ids}, True),
        ({"input_ids": ids, "position_ids": ids, "labels": ids, **flash}, True),  # DataCollatorWithFlattening's
        ({"input_ids": ids, "attention_mask": ones, "position_ids": ids}, False),  # a mask given: no packing
        ({"input_ids": ids, "position_ids": ids, "past_key_values": object()}, False),
        ({"input_ids": ids, "position_ids": ids, "token_type_ids": ids}, False),
    ]
    for kwargs, documents in cases:
        hint.before(torch.nn.Identity(), (), kwargs)
        assert hint.documents is documents and not (documents and hint.plain_causal), kwargs
        hint.after(torch.nn.Identity(), (), kwargs, None)
        assert not hint.documents
    positions = packed_batch()["position_ids"]
    hint.before(torch.nn.Identity(), (), {"position_ids": positions})
    found = hint.documents_of(positions, 2)
    assert found is hint.documents_of(positions, 2)  # once per call in eager
    assert hint.documents_of(torch.arange(16)[None], 2) is None  # one document per row: plain causal


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_packed_step_under_compile(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled optimized model (fullgraph: the document ids are computed in the graph, no host sync)
    against the uncompiled one's documents one by one. CPU Inductor takes ~25 s to compile the forward and
    backward with a cold cache."""
    _, ours = _optimized("llama")
    torch._dynamo.reset()
    compiled = torch.compile(ours, backend=backend, fullgraph=True)
    calls = _Calls(monkeypatch)
    assert_packed_equals_one_by_one(compiled, ours, packed_batch())
    assert calls.calls[:2] == [(True, False, True, None)] * 2  # as traced: the layers take the document ids


@pytest.mark.cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_gemma3_head_dim_256_through_flex_on_cuda(packed: bool, compiled: bool) -> None:
    """Gemma 3's head_dim of 256 in bf16 on the GPU: its sliding layer's window (128 in rows of 512) and
    packed documents go to FlexAttention (forward and backward); the optimized model's loss and gradients
    judged as optimize() judges them: the table against transformers in bf16, else within twice its error
    of transformers in fp32."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from kernel_pytorch.validation.compare import check_tensor

    config = Gemma3TextConfig(vocab_size=models.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                              sliding_window=128, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=1024)
    torch.manual_seed(0)
    reference = models._noisy_norms(Gemma3ForCausalLM(config)).cuda().train()
    bf16 = copy.deepcopy(reference).bfloat16()
    batch = {k: v.cuda() for k, v in packed_batch(((200, 150, 162), (512,))).items()}
    if not packed:
        batch.pop("position_ids")
    ours, _ = optimize(copy.deepcopy(bf16), {k: v[:, :64] for k, v in batch.items()}, seeds=(0,), compile=False)
    run = torch.compile(ours) if compiled else ours
    results = {}
    for name, model in (("ours", run), ("bf16", bf16), ("fp32", reference)):
        loss = model(**batch, use_cache=False).loss
        params = ours if name == "ours" else model
        results[name] = [loss.detach(), *torch.autograd.grad(loss, list(params.parameters()))]
    names = ["loss", *(n for n, _ in reference.named_parameters())]
    for name, got, low, high in zip(names, results["ours"], results["bf16"], results["fp32"]):
        check = check_tensor(name, got, low, reference_hi=high, reordered=compiled)
        assert check.passed, check
