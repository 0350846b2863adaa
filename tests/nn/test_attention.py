"""kernel_pytorch.nn's attention modules: transformers' LlamaAttention checkpoints load unchanged and give
the same outputs and gradients; the static KV cache decodes like the full sequence, under torch.compile
with one graph for all decoding steps; the tutorial pair share state dicts, outputs and gradients."""

from __future__ import annotations

import warnings

import pytest
import torch

from kernel_pytorch.nn import (
    Attention,
    LoopAttention,
    MemoryEfficientAttention,
    StandardAttention,
    StaticKVCache,
)
from kernel_pytorch.tolerances import tolerance_for
from tests.grid import randn


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    tol = tolerance_for(expected.dtype)
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol, msg=msg or None)


def _llama(n_heads: int = 8, n_kv_heads: int = 2, bias: bool = False):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                      intermediate_size=128, num_hidden_layers=1, max_position_embeddings=64,
                      attention_bias=bias, rope_theta=500.0)
    cfg._attn_implementation = "eager"
    return cfg, LlamaAttention(cfg, layer_idx=0), LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize(("n_kv_heads", "bias"), [(8, True), (2, False), (1, False)])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_llama_checkpoint_loads_and_matches(backend: str, n_kv_heads: int, bias: bool) -> None:
    cfg, hf, rotary = _llama(n_kv_heads=n_kv_heads, bias=bias)
    ours = Attention(64, 8, n_kv_heads, bias=bias, rope=cfg, backend=backend)
    ours.load_state_dict(hf.state_dict())  # strict: q_proj / k_proj / v_proj fold into qkv_proj
    b, t = 2, 12
    x = randn(b, t, 64)
    pad = torch.ones(b, t, dtype=torch.long)
    pad[1, :4] = 0  # left padding in row 1
    position_ids = (pad.cumsum(-1) - 1).clamp(min=0)
    # transformers' eager attention takes the 4-D additive mask its masking utilities build
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    allowed = causal[None, None] & pad.bool()[:, None, None, :]
    additive = torch.zeros(b, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    y_hf, _ = hf(xs[0], position_embeddings=rotary(x, position_ids), attention_mask=additive)
    y = ours(xs[1], position_ids=position_ids, attention_mask=pad)
    keep = pad.bool()[..., None]  # fully padded query rows: transformers averages, we give zeros
    _assert_close(y * keep, y_hf * keep)
    dy = randn(b, t, 64) * keep
    y_hf.backward(dy)
    y.backward(dy)
    _assert_close(xs[1].grad, xs[0].grad)
    grads = dict(zip(("q_proj", "k_proj", "v_proj"), ours.qkv_proj.weight.grad.split(ours._sizes)))
    for name, g in grads.items():
        _assert_close(g, getattr(hf, name).weight.grad, msg=name)
    _assert_close(ours.o_proj.weight.grad, hf.o_proj.weight.grad)


def test_state_dict_round_trip() -> None:
    cfg, hf, _ = _llama(bias=True)
    ours = Attention(64, 8, 2, bias=True, rope=cfg)
    sd = ours.state_dict()
    assert list(sd) == list(hf.state_dict())  # names and order
    assert {n for n, _ in ours.named_parameters()} == {"qkv_proj.weight", "qkv_proj.bias", "o_proj.weight",
                                                        "o_proj.bias"}
    hf.load_state_dict(sd)  # ours -> transformers
    again = Attention(64, 8, 2, bias=True, rope=cfg)
    fused = {"qkv_proj.weight": ours.qkv_proj.weight, "qkv_proj.bias": ours.qkv_proj.bias,
             "o_proj.weight": ours.o_proj.weight, "o_proj.bias": ours.o_proj.bias}
    again.load_state_dict(fused)  # a fused checkpoint loads as it is
    assert torch.equal(again.qkv_proj.weight, ours.qkv_proj.weight)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        Attention(64, 8, 3)


def _decode(model: Attention, x: torch.Tensor, prompt: int, step) -> torch.Tensor:
    cache = StaticKVCache(4, 32, model.n_kv_heads, model.head_dim)
    outs = [step(x[:, :prompt], cache, torch.arange(prompt))]
    for i in range(prompt, x.shape[1]):
        outs.append(step(x[:, i : i + 1], cache, torch.tensor([i])))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_static_cache_decodes_like_the_full_sequence(backend: str) -> None:
    model = Attention(64, 8, 2, backend=backend).eval()
    x = randn(2, 11, 64)
    with torch.no_grad():
        full = model(x)
        stepped = _decode(model, x, 5, lambda xi, cache, pos: model(xi, kv_cache=cache, cache_position=pos))
    _assert_close(stepped, full)


def test_compiled_decoding_compiles_once_for_all_steps() -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    model = Attention(64, 8, 2).eval()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(lambda xi, cache, pos: model(xi, kv_cache=cache, cache_position=pos),
                         backend=counter, fullgraph=True, dynamic=False)
    x = randn(2, 12, 64)
    with torch.no_grad():
        full = model(x)
        stepped = _decode(model, x, 4, step)  # a prefill and 8 decoding steps
    _assert_close(stepped, full)
    assert counter.frame_count == 2, f"{counter.frame_count} compiles: one for the prefill, one for all steps"


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_attention_compiles_fullgraph(backend: str) -> None:
    torch._dynamo.reset()
    model = Attention(64, 8, 2, backend=backend)
    x = randn(2, 9, 64)
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[0, :2] = 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    _assert_close(compiled(x, attention_mask=pad), model(x, attention_mask=pad))


def test_flex_module_forward_on_cpu() -> None:
    model = Attention(64, 4, 2, backend="flex", window=4, softcap=20.0).eval()
    eager = Attention(64, 4, 2, backend="eager", window=4, softcap=20.0).eval()
    eager.load_state_dict(model.state_dict())
    x = randn(1, 10, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's unfused-eager warning
        _assert_close(model(x), eager(x))


@pytest.mark.parametrize("causal", [False, True])
def test_tutorial_pair_share_state_dicts_outputs_and_grads(causal: bool) -> None:
    std = StandardAttention(32, 4, is_causal=causal)
    mem = MemoryEfficientAttention(32, 4, is_causal=causal)
    loop = LoopAttention(32, 4, is_causal=causal)
    mem.load_state_dict(std.state_dict())
    loop.load_state_dict(mem.state_dict())
    x = randn(2, 7, 32)
    dy = randn(2, 7, 32)
    outs = []
    for module in (std, mem, loop):
        xi = x.clone().requires_grad_()
        y = module(xi)
        y.backward(dy)
        outs.append((y, xi.grad, module.qkv_proj.weight.grad, module.o_proj.weight.grad))
    for other in outs[1:]:
        for got, want in zip(other, outs[0]):
            _assert_close(got, want)


class _DecodeStep(torch.nn.Module):
    """A layer and its cache in one module: compiled, the cache's buffers are static inputs that
    CUDA graphs may mutate in place (gpt-fast's arrangement)."""

    def __init__(self, model: Attention, cache: StaticKVCache) -> None:
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(x, kv_cache=self.cache, cache_position=pos)


@pytest.mark.cuda
def test_cuda_decode_under_reduce_overhead() -> None:
    torch._dynamo.reset()
    model = Attention(256, 8, 2).cuda().to(torch.bfloat16).eval()
    x = randn(2, 20, 256, dtype=torch.bfloat16, device="cuda")
    step = _DecodeStep(model, StaticKVCache(2, 32, 2, 32, dtype=torch.bfloat16, device="cuda"))
    compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
    with torch.no_grad():
        full = model(x)
        # clone: a CUDA-graph replay overwrites the previous step's output
        outs = [compiled(x[:, :4], torch.arange(4, device="cuda")).clone()]
        for i in range(4, 20):
            outs.append(compiled(x[:, i : i + 1], torch.tensor([i], device="cuda")).clone())
    _assert_close(torch.cat(outs, dim=1), full)
