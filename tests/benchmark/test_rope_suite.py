"""The rope suite's specs: registered, inputs laid out as a Llama attention layer makes them, byte
counts, and every provider that runs on CPU passes the correctness gate at the quick shapes."""

from __future__ import annotations

import functools

import pytest
import torch

from kernel_pytorch.benchmark.suites import SUITES, get_suite
from kernel_pytorch.benchmark.suites import gate as G
from kernel_pytorch.benchmark.suites import rope as S
from kernel_pytorch.benchmark.suites.providers import Impl, resolve

CPU = torch.device("cpu")


def test_registered_with_its_ops() -> None:
    assert "rope" in SUITES and get_suite("rope").SUITE is S.SUITE
    assert S.OPS == ("rope", "rope_interleaved", "embedding")
    assert S.SUITE.providers == ("ours", "eager", "compile", "liger")


def test_inputs_and_bytes() -> None:
    t = S.ROPE.make_inputs(S.DECODE, torch.bfloat16, CPU, 0)
    assert t["q"].shape == (32, 32, 1, 128) and t["q"].transpose(1, 2).is_contiguous()
    assert t["cos"].shape == (32, 1, 128)  # decoding: one position per sequence
    e = 4 * 4096 * 40 * 128
    assert S.ROPE.pass_bytes(S.TRAIN, 2, "fwd+bwd") == 2 * (2 * e + 2 * 4096 * 128) * 2


@pytest.mark.parametrize("spec", [S.ROPE, S.ROPE_INTERLEAVED, S.EMBEDDING], ids=lambda s: s.name)
def test_cpu_providers_pass_the_gate(spec) -> None:
    shape = spec.quick_shapes["cpu"]
    checks, eager = G.gate(spec, Impl(spec.eager), shape, torch.bfloat16, CPU, None)
    assert all(c.passed for c in checks), [c.message() for c in checks if not c.passed]
    ours = Impl(functools.partial(spec.ours, backend="reference"))
    checks, _ = G.gate(spec, ours, shape, torch.bfloat16, CPU, eager)
    assert all(c.passed for c in checks), [c.message() for c in checks if not c.passed]
    assert resolve(spec, "liger", CPU)[0] is None
