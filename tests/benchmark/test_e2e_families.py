"""benchmarks/bench_e2e.py across decoder families and batches (benchmarks/e2e/families.py, batches.py):
`--quick --device cpu --family F` rows for Llama, Qwen3 and Gemma 3 with packed rows beside the plain ones;
each family's transformers config and Liger patch; the step FLOPs against pairs counted from the masks;
packed batches as DataCollatorWithFlattening makes them; --batch/--seq; the target judged per workload."""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path

import pytest
import torch

from kernel_pytorch.benchmark.results import BenchmarkResults, Row
from kernel_pytorch.reference.attention import allowed_keys
from kernel_pytorch.reference.positions import seq_ids_from_position_ids
from tests.benchmark.test_e2e_bench import SCRIPT, _bench

pytest.importorskip("transformers")
sys.path.insert(0, str(SCRIPT.parent))  # the e2e helpers, as the script imports them

from e2e import batches, families, models  # noqa: E402
from e2e.providers import Variant, parse  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_quick_cpu_run_per_family_with_packed_rows(family: str, tmp_path: Path) -> None:
    bench = _bench()
    # Llama's builtin row compiles (Inductor on the CPU takes a minute): left out; the others' are not applicable
    trained = "ours,eager+packed,ours+packed" + (",builtin" if family != "llama" else "")
    assert bench.main(["--quick", "--device", "cpu", "--family", family, "--providers", trained, "--no-long",
                       "--no-inference", "--steps", "1", "--out", str(tmp_path)]) == 0
    results = BenchmarkResults.load(tmp_path / "e2e.json")
    status = {r.provider: r.status for r in results.rows}
    assert all(status[p] == "ok" for p in ("ours", "eager+packed", "ours+packed")), status
    assert status.get("builtin", "not applicable") == "not applicable"
    size = families.QUICK_SIZES[family]
    assert {r.config for r in results.rows} == {size.label}
    assert size.label.startswith(f"HF {families.FAMILIES[family].title} ")
    packed = results.find(provider="ours+packed")[0]
    docs = batches.doc_lengths(size.batch, size.seq)
    assert f"{sum(map(len, docs))} documents" in packed.note and packed.flops == size.step_flops(2, 32, docs)
    assert results.find(provider="ours")[0].flops == size.step_flops(2, 32)
    assert any("ours+packed" in n and "torch.compile+packed's tokens/s" in n for n in results.notes)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_each_family_builds_its_transformers_model(family: str) -> None:
    """The quick size of each family: the transformers class, head dim, tied embeddings and sliding layers
    its Size says; the matmul parameters those of the model's Linear layers (the lm_head included)."""
    import transformers

    size = families.QUICK_SIZES[family]
    model = models.hf_model(size, torch.device("cpu"), torch.float32)
    assert type(model) is getattr(transformers, families.FAMILIES[family].model_class)
    attn = model.model.layers[0].self_attn
    assert attn.head_dim == size.dim and attn.q_proj.out_features == size.heads * size.dim
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linears == size.matmul_params()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) is size.tied
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]
    assert windows == ([16, None] if family == "gemma3" else [None, None])
    if family == "gemma3":
        assert type(model.model.embed_tokens).__name__ == "Gemma3TextScaledWordEmbedding"


def _pairs_from_masks(size: families.Size, rows: list[list[int]]) -> int:
    """Twice the (query, key) pairs the layers score, counted from the reference's masks, with the diagonal
    counted half (the n^2 / 2 convention)."""
    total = 0
    positions = batches.position_ids(rows)
    seq_ids = seq_ids_from_position_ids(positions)
    t = positions.shape[1]
    for kind in size.layer_types():
        window = size.window if kind == "sliding_attention" else None
        keep = allowed_keys(t, t, is_causal=True, window=window, seq_ids=seq_ids)
        total += 2 * int(keep.sum()) - len(rows) * t  # strictly below the diagonal twice, plus the diagonal once
    return total


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_step_flops_count_the_pairs_each_layer_scores(family: str) -> None:
    """6 x matmul params x tokens + 6 x heads x head_dim x (twice the pairs): the Llama formula the
    committed results use unchanged, sliding layers and packed documents against pairs counted from the
    reference's masks (the diagonal counted half)."""
    size = dataclasses.replace(families.QUICK_SIZES[family], window=16 if family == "gemma3" else None)
    rows = batches.doc_lengths(2, 64)
    for docs in (None, rows):
        expected = _pairs_from_masks(size, docs or [[64], [64]])
        attention = size.step_flops(2, 64, docs) - 6 * size.matmul_params() * 128
        assert attention == 6 * size.heads * size.dim * expected
    llama = families.SIZES["llama"]
    d = llama.hidden
    params = llama.layers * (2 * d * d + 2 * d * 1024 + 3 * d * llama.intermediate) + llama.vocab * d
    assert llama.step_flops(4, 2048) == 6 * params * 4 * 2048 + 6 * 8 * 4 * 2048 * 2048 * d
    gemma = families.SIZES["gemma3"]
    assert gemma.layer_types().count("sliding_attention") == 7 and gemma.window == 1024


def test_packed_batch_is_what_data_collator_with_flattening_makes() -> None:
    """Documents of seq / 32 to seq / 4 tokens filling each row (the same every call), positions restarting
    at each, -100 at each document's first label, the same token ids as the plain batch."""
    from transformers import DataCollatorWithFlattening

    rows = batches.doc_lengths(4, 4096)
    assert rows == batches.doc_lengths(4, 4096) and all(sum(r) == 4096 for r in rows)
    assert all(128 <= n <= 1024 for r in rows for n in r[:-1]) and sum(map(len, rows)) > 4 * 4
    plain = batches.training_batch(256, 2, 64, torch.device("cpu"))
    packed = batches.training_batch(256, 2, 64, torch.device("cpu"), packed=True)
    assert torch.equal(plain["input_ids"], packed["input_ids"]) and torch.equal(plain["labels"], plain["input_ids"])
    start = 0
    features = []
    for n in batches.doc_lengths(2, 64)[0]:
        doc = packed["input_ids"][0, start:start + n].tolist()
        features.append({"input_ids": doc, "labels": doc})
        start += n
    collated = DataCollatorWithFlattening(return_tensors="pt")(features)
    assert torch.equal(collated["position_ids"][0], packed["position_ids"][0])
    assert torch.equal(collated["labels"][0], packed["labels"][0])
    assert parse("torch.compile+packed").variant == Variant(packed=True)
    assert parse("torch.compile+packed").variant.call_kwargs() == {"use_cache": False}


def test_batch_and_seq_override_and_family_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    size = families.size_of("gemma3", batch=1, seq=16384)
    assert (size.batch, size.seq, size.family) == (1, 16384, "gemma3")
    assert size.hf_config().max_position_embeddings >= 16384
    assert families.size_of("llama", quick=True, seq=48).seq == 48
    with pytest.raises(ValueError, match="--size llama3-8b is a Llama of its own"):
        families.size_of("qwen3", shape="llama3-8b")
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--quick", "--device", "cpu", "--size", "llama3-8b", "--out", str(tmp_path)])
    assert "not with --quick" in capsys.readouterr().err
    assert bench.main(["--quick", "--device", "cpu", "--batch", "1", "--seq", "48", "--providers", "eager",
                       "--no-long", "--no-inference", "--steps", "1", "--out", str(tmp_path)]) == 0
    assert [r.op for r in BenchmarkResults.load(tmp_path / "e2e.json").rows] == ["train step 1x48"]


def test_liger_patch_is_the_familys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A liger row patches with its family's function; a Liger without it is the row's error."""
    called = []
    fake = types.ModuleType("liger_kernel.transformers")
    fake.apply_liger_kernel_to_qwen3 = lambda: called.append("qwen3")
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    sys.modules["liger_kernel"].transformers = fake
    models.apply_liger("qwen3")
    assert called == ["qwen3"]
    with pytest.raises(RuntimeError, match="no apply_liger_kernel_to_gemma3_text"):
        models.apply_liger("gemma3")


def test_target_judges_packed_rows_against_packed_baselines() -> None:
    bench = _bench()
    results = BenchmarkResults(name="e2e", device="cpu")
    op = "train step 4x4096"
    for provider, ms, peak in (("torch.compile", 100.0, 10), ("liger", 120.0, 10), ("torch.compile+packed", 90.0, 9),
                               ("liger+packed", 110.0, 10), ("ours+compile+packed", 70.0, 8)):
        results.add(Row(op=op, shape=[4, 4096], config="c", dtype="bf16", provider=provider, pass_name="p",
                        median_ms=ms, peak_mem_bytes=peak))
    notes = bench.target_check(results, op)
    assert notes == ["target (>= 1.2x torch.compile+packed's tokens/s and <= 0.9x liger+packed's peak): "
                     "ours+compile+packed 1.286x and 0.800x: met"]
