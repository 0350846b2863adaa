"""The helpers every layer shares: example inputs and tree moves (_tree), error text (_errors),
Dynamo's compile-limit name (_env)."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch

from kernel_pytorch import _env
from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import as_inputs, call, move, split_inputs


def test_as_inputs_and_split_inputs_accept_every_form() -> None:
    x = torch.randn(2, 3)
    assert as_inputs([x, 1]) == (x, 1)
    assert as_inputs(x)[0] is x
    # a mapping that is not a dict (HF BatchEncoding is a UserDict) becomes keyword args
    enc = UserDict(input_ids=x)
    assert as_inputs(enc) == {"input_ids": x} and type(as_inputs(enc)) is dict
    assert split_inputs(enc) == ((), {"input_ids": x})
    assert split_inputs((x,)) == ((x,), {})
    assert call(lambda a, b=0: a + b, {"a": 1, "b": 2}) == 3 and call(lambda a, b: a * b, (2, 3)) == 6


def test_move_casts_only_floating_tensors() -> None:
    ids = torch.arange(4)
    x = torch.randn(4)
    moved = move({"ids": ids, "x": [x, 3]}, "cpu", torch.float64)
    assert moved["ids"].dtype == torch.int64 and moved["x"][0].dtype == torch.float64 and moved["x"][1] == 3
    assert move(x, None) is x


def test_short_error_cuts_trailers_lines_and_length() -> None:
    exc = RuntimeError("bad shape\n\nfrom user code:\n  File x.py, line 3")
    assert short_error(exc) == "RuntimeError: bad shape"
    many = ValueError("\n".join(f"line {i}" for i in range(10)))
    assert short_error(many, lines=2) == "ValueError: line 0\nline 1\n..."
    assert short_error(ValueError("x" * 100), 20) == "ValueError: xxxxx..."
    assert short_error(KeyError()) == "KeyError"


def test_recompile_headroom_raises_and_restores_the_limit() -> None:
    name = _env.recompile_limit_name()
    before = _env.recompile_limit()
    with _env.recompile_headroom(before + 5):
        assert getattr(torch._dynamo.config, name) == before + 5
    assert _env.recompile_limit() == before
    with _env.recompile_headroom(1):  # never lowers it
        assert _env.recompile_limit() == before


@pytest.mark.parametrize("value", [1, 2.5, "s"])
def test_as_inputs_wraps_a_lone_value(value: object) -> None:
    assert as_inputs(value) == (value,)
