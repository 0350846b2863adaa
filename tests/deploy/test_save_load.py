"""kernel_pytorch.save / load round trips: optimized built-in and Hugging Face models, ties written once,
shards with HF's index, dtypes, compile re-applied, tensor subclasses refused, files under the umask."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch
from kernel_pytorch.deploy import LoadError, Manifest
from kernel_pytorch.models import build_model
from kernel_pytorch.optimize import CompileOptions, Match
from tests.deploy.models import DIM, Small, optimized_small, snapshot, unchanged


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) and sa[k].dtype == sb[k].dtype for k in sa)


def test_builtin_llama_round_trip_sharded(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, inputs = build_model("llama-tiny")
    model, report = kernel_pytorch.optimize(model, inputs, validate=False, compile=False)
    written = kernel_pytorch.save(model, tmp_path, report=report, max_shard_size="100KB")
    names = sorted(p.name for p in written)
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 1 and all(n.endswith(f"-of-{len(shards):05d}.safetensors") for n in shards)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in model.state_dict().values())
    assert not (tmp_path / "model.safetensors").exists()

    torch.manual_seed(1)  # other random weights: the load must replace them all
    loaded = kernel_pytorch.load(tmp_path, lambda: build_model("llama-tiny")[0])
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]  # swaps re-applied
    assert _same_state(loaded, model)
    assert torch.equal(loaded(*inputs), model(*inputs))

    kernel_pytorch.save(model, tmp_path, report=report)  # a new save replaces the shards
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernel_pytorch.json", "model.safetensors"]


def test_hf_llama_tied_embeddings_saved_once(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.optimize.models import llama

    torch.manual_seed(0)
    model, inputs = llama(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model, report = kernel_pytorch.optimize(model, inputs, validate=False, compile=False)
    assert report.counts()
    kernel_pytorch.save(model, tmp_path, report=report)
    manifest = Manifest.read(tmp_path)
    (alias, target), = manifest.aliases.items()
    assert {alias, target} == {"lm_head.weight", "model.embed_tokens.weight"}
    assert alias not in manifest.tensors

    torch.manual_seed(1)
    loaded = kernel_pytorch.load(tmp_path, lambda: llama(tie_word_embeddings=True)[0])
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # still tied
    assert _same_state(loaded, model)
    assert {type(m).__name__ for m in loaded.modules()} >= {"GatedMLP", "RMSNorm"}
    with torch.no_grad():
        ids = inputs["input_ids"]
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes(tmp_path: Path, dtype: torch.dtype) -> None:
    model, report = optimized_small()
    model.to(dtype)
    kernel_pytorch.save(model, tmp_path, report=report)
    assert {t["dtype"] for t in Manifest.read(tmp_path).tensors.values()} == {str(dtype).removeprefix("torch.")}
    loaded = kernel_pytorch.load(tmp_path, lambda: Small().to(dtype))
    assert _same_state(loaded, model) and type(loaded.out).__module__.startswith("kernel_pytorch.")
    assert kernel_pytorch.load(tmp_path, model) is model  # into the optimized model itself: no swap twice


def test_shared_module_and_views(tmp_path: Path) -> None:
    """A module used twice is one instance (its keys alias); a slice of another tensor is written as a copy."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    model.append(model[0])
    model.register_buffer("top", model[0].weight.detach()[:2])  # a distinct view of the same storage
    torch.manual_seed(3)
    kernel_pytorch.save(model, tmp_path)
    manifest = Manifest.read(tmp_path)
    assert manifest.aliases == {"2.weight": "0.weight", "2.bias": "0.bias"}

    def make() -> nn.Module:
        m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        m.append(m[0])
        m.register_buffer("top", m[0].weight.detach()[:2])
        return m

    loaded = kernel_pytorch.load(tmp_path, make)
    assert loaded[2] is loaded[0] and torch.equal(loaded[0].weight, model[0].weight)
    assert torch.equal(loaded.top, model[0].weight[:2])


def test_compile_re_applied_with_options(tmp_path: Path) -> None:
    model, report = optimized_small()
    model.proj.compile(backend="eager")  # regional compilation, as optimize(compile=True) does per block
    kernel_pytorch.save(model, tmp_path, report=report, compile_options=CompileOptions(backend="eager"),
                        dynamic_dims={"x": [0]}, metadata={"factory": "tests.deploy.models:Small"})
    manifest = Manifest.read(tmp_path)
    assert manifest.compile["compiled"] == ["proj"] and manifest.compile["options"] == {"backend": "eager"}
    assert manifest.dynamic_dims == {"x": [0]} and manifest.metadata["factory"] == "tests.deploy.models:Small"
    assert set(manifest.versions) == {"kernel_pytorch", "torch", "triton", "transformers"}
    loaded = kernel_pytorch.load(tmp_path, Small)
    assert loaded.proj._compiled_call_impl is not None
    x = torch.randn(3, DIM)
    assert torch.allclose(loaded(x), model(x))
    assert kernel_pytorch.load(tmp_path, Small, compile=False).proj._compiled_call_impl is None


class _Sub(torch.Tensor):
    """Stands in for a quantized tensor subclass (torchao's are subclasses too)."""


def test_tensor_subclass_is_refused_before_writing(tmp_path: Path) -> None:
    model = Small()
    model.register_buffer("scale", torch.ones(2).as_subclass(_Sub))
    with pytest.raises(TypeError, match=r"tensor 'scale' is a .*_Sub \(a tensor subclass\).*torchao's quantized"):
        kernel_pytorch.save(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


class _Wrap(nn.Module):
    """A replacement for a Linear holding its Parameter objects (as optimize's rules do)."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = inner.weight, inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class _WrapRule:
    name, family = "wrap_linear", "custom"

    def __init__(self, rename: bool = False) -> None:
        self.rename = rename

    def match(self, module: nn.Module, name: str, model: nn.Module) -> Match | None:
        if not isinstance(module, nn.Linear):
            return None
        new = _Wrap(module)
        if self.rename:  # breaks the rules' contract: the state_dict keys change
            new.w = new.weight
            del new.weight
        return Match(new, "wrapped")


def test_custom_rules_and_an_in_place_reload(tmp_path: Path) -> None:
    model = Small()
    model, report = kernel_pytorch.optimize(model, (torch.randn(2, DIM),), components=[_WrapRule()],
                                            validate=False, compile=False)
    kernel_pytorch.save(model, tmp_path, report=report)
    with pytest.raises(LoadError, match="rules this kernel_pytorch does not have: wrap_linear"):
        kernel_pytorch.load(tmp_path, Small)
    loaded = kernel_pytorch.load(tmp_path, Small, rules=[_WrapRule()])
    assert isinstance(loaded.proj, _Wrap) and _same_state(loaded, model)

    fresh = Small()
    before = snapshot(fresh)
    with pytest.raises(LoadError, match=r"re-applying the saved swaps changed the model's state_dict.*proj\.weight"):
        kernel_pytorch.load(tmp_path, fresh, rules=[_WrapRule(rename=True)])
    assert unchanged(fresh, before)  # the swap was put back before any weight was copied

    assert kernel_pytorch.load(tmp_path, model, rules=[_WrapRule()]) is model  # optimized: nothing to swap


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
@pytest.mark.parametrize("shard", ["5GB", 600])
def test_every_file_follows_the_umask(tmp_path: Path, umask: int, mode: int, shard: int | str) -> None:
    model, report = optimized_small()
    old = os.umask(umask)
    try:
        written = kernel_pytorch.save(model, tmp_path, report=report, max_shard_size=shard)
    finally:
        os.umask(old)
    assert len(written) == (2 if shard == "5GB" else len(list(tmp_path.glob("model-*"))) + 2)
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {p.name: oct(mode) for p in written}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)  # the probe file is gone
