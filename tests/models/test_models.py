"""Built-in models: every tiny preset builds, runs forward and backward, is deterministic and compiles
in one graph; parameter names follow HF Llama; full-size presets have their published parameter counts
(counted on the meta device, nothing allocated)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from kernel_pytorch.models import (
    DEFAULT_DEMO,
    MODELS,
    LlamaConfig,
    build_model,
    example_inputs,
    input_spec,
    list_models,
)

TINY = [name for name in MODELS if "tiny" in name]
FULL = [name for name in MODELS if "tiny" not in name]

# Published parameter counts (tied weights counted once).
KNOWN_PARAMS = {
    "llama3-8b": 8_030_261_248,
    "gpt2-small": 124_439_808,
    "vit-b16": 86_567_656,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
}


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _output_shape(name: str, inputs: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    config = MODELS[name].config
    if MODELS[name].task == "causal-lm":
        return (*inputs[0].shape, config.vocab_size)
    return (inputs[0].shape[0], config.num_classes)


def test_registry() -> None:
    assert list_models() == list(MODELS)
    assert DEFAULT_DEMO in MODELS
    assert set(TINY) == {"llama-tiny", "gpt2-tiny", "vit-tiny", "resnet-tiny"}
    with pytest.raises(KeyError, match="llama-tiny"):
        build_model("no-such-model")
    with pytest.raises(TypeError):
        MODELS["x"] = MODELS["llama-tiny"]  # type: ignore[index]


@pytest.mark.parametrize("name", TINY)
def test_forward_backward(name: str) -> None:
    model, inputs = build_model(name)
    assert not model.training
    out = model(*inputs)
    assert out.shape == _output_shape(name, inputs)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    out.square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", TINY)
def test_deterministic_by_seed(name: str) -> None:
    state = torch.get_rng_state()
    (m1, in1), (m2, in2), (m3, in3) = (build_model(name, seed=s) for s in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(in1, in2))
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k
    torch.testing.assert_close(m1(*in1), m2(*in2), rtol=0, atol=0)
    assert not torch.equal(m1(*in1), m3(*in3))
    assert torch.equal(torch.get_rng_state(), state), "building must not consume the global RNG"


@pytest.mark.parametrize("name", TINY)
def test_input_spec_dims_vary(name: str) -> None:
    """Every dim input_spec names can change without breaking the model."""
    model, inputs = build_model(name)
    (spec,) = input_spec(name)
    assert spec[0] == "batch"
    kinds = set(spec.values())
    kwargs = {"batch_size": 3}
    if "seq" in kinds:
        kwargs["seq_len"] = 17
    if "spatial" in kinds:
        kwargs["image_size"] = 48
    (x,) = example_inputs(name, **kwargs)
    assert x.shape[0] == 3
    assert model(x).shape == _output_shape(name, (x,))


def test_input_spec_kinds() -> None:
    assert input_spec("llama-tiny") == ({0: "batch", 1: "seq"},)
    assert input_spec("vit-b16") == ({0: "batch"},)
    assert input_spec("resnet50") == ({0: "batch", 2: "spatial", 3: "spatial"},)
    with pytest.raises(ValueError, match="position embeddings"):
        example_inputs("vit-tiny", image_size=64)
    with pytest.raises(ValueError, match="max_seq_len"):
        example_inputs("gpt2-tiny", seq_len=1000)


def test_llama_labels_give_next_token_loss() -> None:
    model, (ids,) = build_model("llama-tiny")
    loss = model(ids, labels=ids)
    assert loss.shape == () and loss.dtype == torch.float32
    # A freshly initialised model is near uniform over the vocabulary.
    uniform = torch.log(torch.tensor(float(MODELS["llama-tiny"].config.vocab_size)))
    assert abs(loss.item() - uniform.item()) < 0.5
    loss.backward()


def test_llama_hf_parameter_names() -> None:
    model, _ = build_model("llama-tiny", device="meta")
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.q_proj.weight" in names
    pattern = re.compile(
        r"model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight|"
        r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|"
        r"input_layernorm|post_attention_layernorm)\.weight"
    )
    assert all(pattern.fullmatch(n) for n in names), sorted(n for n in names if not pattern.fullmatch(n))
    assert len(names) == 3 + 9 * LlamaConfig.tiny().n_layers


def test_tied_weights_survive_materialisation() -> None:
    gpt, _ = build_model("gpt2-tiny")
    assert gpt.lm_head.weight is gpt.transformer.wte.weight
    config = dataclasses.replace(LlamaConfig.tiny(), tie_embeddings=True)
    llama, _ = build_model("llama-tiny", config=config)
    assert llama.lm_head.weight is llama.model.embed_tokens.weight


def test_bfloat16_build() -> None:
    model, (ids,) = build_model("llama-tiny", dtype=torch.bfloat16, seq_len=8)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(ids).dtype == torch.bfloat16


@pytest.mark.parametrize("name", FULL)
def test_full_presets_on_meta(name: str) -> None:
    model, inputs = build_model(name, device="meta")
    assert all(p.is_meta for p in model.parameters()) and all(x.is_meta for x in inputs)
    n = _n_params(model)
    if name in KNOWN_PARAMS:
        assert n == KNOWN_PARAMS[name]
    else:  # llama-8l-2048: 8 Llama-3 layers at hidden 2048 plus untied 128256-token embeddings
        assert 1.0e9 < n < 1.05e9
    # Shape propagation only: checks the wiring of the full-size sizes at no cost.
    assert model(*inputs).shape == _output_shape(name, inputs)


@pytest.mark.parametrize("name", TINY)
def test_compiles_in_one_graph(name: str) -> None:
    torch._dynamo.reset()
    model, inputs = build_model(name)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), model(*inputs))
    assert counter.frame_count == 1
    explanation = torch._dynamo.explain(model)(*inputs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_llama_tiny_compiled_backward() -> None:
    """Forward and backward through AOTAutograd match eager (inductor is left to the GPU tests)."""
    torch._dynamo.reset()
    model, (ids,) = build_model(DEFAULT_DEMO)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss = compiled(ids, labels=ids)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.testing.assert_close(loss, model(ids, labels=ids))
    model(ids, labels=ids).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)
