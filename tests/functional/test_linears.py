"""functional.shared_input_linears: the outputs are F.linear's, every gradient is the composed Linears'
(bf16 input gradient within the fp64-derived budget of torch's own), outputs without a gradient and frozen
parameters, the compiled backward sums dx in the GEMMs (the mutating gemm_into op, no add), and the paths
that run plain Linears (no gradient, autocast, mixed dtypes, a single weight)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from kernel_pytorch.functional import linears as linears_mod
from kernel_pytorch.functional.linears import shared_input_linears
from kernel_pytorch.tolerances import fp64_budget
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close

DEV = device_under_test()
H = 32


def _params(widths: tuple[int, ...], dtype: torch.dtype = torch.float32, bias: bool = True):
    x = randn(2, 5, H, dtype=dtype, device=DEV).requires_grad_()
    ws = [randn(o, H, dtype=dtype, device=DEV, scale=H ** -0.5).requires_grad_() for o in widths]
    bs = [randn(o, dtype=dtype, device=DEV).requires_grad_() if bias else None for o in widths]
    return x, ws, bs


def _grads(fn, x, ws, bs, ups):
    outs = fn(x, ws, bs)
    leaves = [t for t in (x, *ws, *bs) if t is not None and t.requires_grad]
    used = [(o, u) for o, u in zip(outs, ups) if u is not None]
    return outs, torch.autograd.grad([o for o, _ in used], leaves, [u for _, u in used], allow_unused=True)


def _composed(x, ws, bs):
    return tuple(TF.linear(x, w, b) for w, b in zip(ws, bs))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("widths", [(48, 16, 16), (24, 24)])
def test_outputs_and_gradients_are_the_composed_linears(widths: tuple[int, ...], bias: bool) -> None:
    x, ws, bs = _params(widths, bias=bias)
    ups = [randn(2, 5, o, device=DEV) for o in widths]
    outs, grads = _grads(shared_input_linears, x, ws, bs, ups)
    ref_outs, ref_grads = _grads(_composed, x, ws, bs, ups)
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert torch.equal(o, r), f"output {i}"
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(g, r, f"gradient {i}")


def test_bf16_input_gradient_within_the_fp64_budget() -> None:
    """Each product rounds once, into the running sum: dx is no further from fp64 than torch's."""
    widths = (64, 32, 32)
    x, ws, bs = _params(widths, torch.bfloat16, bias=False)
    ups = [randn(2, 5, o, dtype=torch.bfloat16, device=DEV) for o in widths]
    _, (dx, *_) = _grads(shared_input_linears, x, ws, bs, ups)
    _, (dx_torch, *_) = _grads(_composed, x, ws, bs, ups)
    dx64 = sum(u.double() @ w.double() for u, w in zip(ups, ws))
    result = fp64_budget(dx, dx_torch, dx64)
    assert result.passed, result.message()


def test_an_output_without_gradient_and_frozen_parameters() -> None:
    widths = (16, 8, 8)
    x, ws, bs = _params(widths)
    ws[1].requires_grad_(False)
    bs[2].requires_grad_(False)
    ups = [randn(2, 5, 16, device=DEV), None, randn(2, 5, 8, device=DEV)]
    _, grads = _grads(shared_input_linears, x, ws, bs, ups)
    _, ref = _grads(_composed, x, ws, bs, ups)
    assert len(grads) == len(ref)
    for i, (g, r) in enumerate(zip(grads, ref)):
        if r is None:  # the unused output's bias: no gradient either way
            assert g is None, f"gradient {i}"
        else:
            assert_close(g, r, f"gradient {i}")


def test_compiled_backward_sums_dx_in_the_gemms() -> None:
    """Under torch.compile the backward holds the mutating gemm_into op (in place) and no add of products."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs: list[str] = []

    def keep(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    widths = (16, 8, 8)
    x, ws, bs = _params(widths, bias=False)
    fn = torch.compile(shared_input_linears, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    ups = [randn(2, 5, o, device=DEV) for o in widths]
    _, grads = _grads(fn, x, ws, bs, ups)
    _, ref = _grads(_composed, x, ws, bs, ups)
    for i, (g, r) in enumerate(zip(grads, ref)):
        assert_close(g, r, f"compiled gradient {i}")
    backward = graphs[-1]
    assert backward.count("kernel_pytorch.gemm_into_") == 2, backward
    assert "aten.add.Tensor" not in backward, backward


class _Sub(torch.Tensor):
    pass


def test_plain_linears_where_the_function_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(linears_mod._SharedInputLinears, "apply",
                        staticmethod(lambda *a: calls.append(1) or _composed(a[0], a[2:2 + a[1]], a[2 + a[1]:])))
    x, ws, bs = _params((8, 8))
    shared_input_linears(x, ws, bs)
    assert calls == [1]
    with torch.no_grad():
        shared_input_linears(x, ws, bs)
    shared_input_linears(x, ws[:1], bs[:1])  # one weight
    shared_input_linears(x, [ws[0], ws[1].detach().as_subclass(_Sub)], bs)  # a tensor subclass runs as itself
    with torch.autocast(torch.device(DEV).type, dtype=torch.bfloat16):
        shared_input_linears(x, ws, bs)
    assert calls == [1]


def test_bias_count_must_match() -> None:
    x, ws, _ = _params((8, 8))
    with pytest.raises(ValueError, match="biases must give one entry per weight"):
        shared_input_linears(x, ws, [None])
