"""torch.export of the attention path (CPU): `nn.Attention` and `functional.attention` export with a
dynamic sequence length, the graph holds the ops we expect (attention itself is torch's SDPA, RoPE our
registered op), and the exported program matches eager on a fresh input of another length; a module
holding an `Attention` and its `StaticKVCache` exports once and serves the prefill and every decoding
step (the cache written in place by index_copy_)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.export import Dim, export

from kernel_pytorch import functional as kpf
from kernel_pytorch.nn import Attention, StaticKVCache
from kernel_pytorch.tolerances import tolerance_for
from tests.grid import randn


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = tolerance_for(expected.dtype)
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol)


def _ops(ep: torch.export.ExportedProgram) -> Counter:
    return Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


class _Functional(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kpf.attention(q, k, v, is_causal=True)


def test_functional_attention_exports_as_one_sdpa_call() -> None:
    q, k, v = randn(1, 4, 10, 16), randn(1, 2, 10, 16), randn(1, 2, 10, 16)
    s = Dim("S", min=2, max=64)
    ep = export(_Functional(), (q, k, v), dynamic_shapes=({2: s}, {2: s}, {2: s}))
    ops = _ops(ep)
    # GQA by enable_gqa and causality by is_causal: no repeat, no mask in the graph
    assert ops == Counter({"aten.scaled_dot_product_attention.default": 1}), ops
    q, k, v = randn(1, 4, 23, 16), randn(1, 2, 23, 16), randn(1, 2, 23, 16)
    _assert_close(ep.module()(q, k, v), kpf.attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("padded", [False, True])
def test_module_exports_with_a_dynamic_length(padded: bool) -> None:
    model = Attention(64, 8, 2).eval()
    x = randn(2, 12, 64)
    t = Dim("T", min=2, max=64)
    if padded:  # transformers' 2-D padding mask, converted inside the graph
        pad = torch.ones(2, 12, dtype=torch.long)
        pad[0, :3] = 0
        ep = export(model, (x,), {"attention_mask": pad}, dynamic_shapes={"x": {1: t}, "attention_mask": {1: t}})
    else:
        ep = export(model, (x,), dynamic_shapes=({1: t},))
    ops = _ops(ep)
    assert ops["aten.scaled_dot_product_attention.default"] == 1  # attention is torch's SDPA
    assert ops["kernel_pytorch.rope_fwd.default"] == 1  # RoPE is our registered op, q and k in one call
    assert ops["aten.linear.default"] == 2  # one fused QKV projection and o_proj
    assert not any("repeat" in op for op in ops), ops  # K/V heads never repeated
    x = randn(2, 19, 64)  # another length: the graph is not specialised to 12
    with torch.no_grad():
        if padded:
            pad = torch.ones(2, 19, dtype=torch.long)
            pad[1, :5] = 0
            keep = pad.bool()[..., None]  # fully padded query rows are not compared
            _assert_close(ep.module()(x, attention_mask=pad) * keep, model(x, attention_mask=pad) * keep)
        else:
            _assert_close(ep.module()(x), model(x))


class _DecodeStep(torch.nn.Module):
    def __init__(self, model: Attention, cache: StaticKVCache) -> None:
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.model(x, kv_cache=self.cache, cache_position=pos)


def test_static_cache_step_exports_once_for_prefill_and_decoding() -> None:
    model = Attention(64, 8, 2).eval()
    step = _DecodeStep(model, StaticKVCache(2, 32, 2, 8))
    x = randn(2, 12, 64)
    t = Dim("T", min=1, max=32)
    # a fresh tensor, not a view of x: an example input's storage size would otherwise pin T
    ep = export(step, (x[:, :4].clone(), torch.arange(4)), dynamic_shapes=({1: t}, {0: t}))
    ops = _ops(ep)
    assert ops["aten.index_copy_.default"] == 2  # the cache written in place at cache_position
    assert ops["aten.scaled_dot_product_attention.default"] == 1
    run = ep.module()  # holds its own copy of the cache's buffers
    with torch.no_grad():
        full = model(x)
        outs = [run(x[:, :5], torch.arange(5))]  # a prefill of another length, then one token a step
        outs += [run(x[:, i : i + 1], torch.tensor([i])) for i in range(5, 12)]
    _assert_close(torch.cat(outs, dim=1), full)
