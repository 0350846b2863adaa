"""ops/_gemm_into (a GEMM written into a buffer, kept in place under compile) and the traced form of
ops/_scale.scaled_grad (torch ops Inductor can write over the saved gradient)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.profiler import ProfilerActivity, profile

from kernel_pytorch.ops._common.gemm_into import gemm_into
from kernel_pytorch.ops._common.scale import scaled_grad
from kernel_pytorch.reference._math import acc
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close

COPIES = ("aten::copy_", "aten::clone")


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "op"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32-acc"])
def test_writes_then_accumulates_in_place(eager: bool, out_dtype: torch.dtype) -> None:
    a1, a2 = randn(5, 3, dtype=torch.bfloat16), randn(5, 3, dtype=torch.bfloat16)
    b1, b2 = randn(3, 7, dtype=torch.bfloat16), randn(3, 7, dtype=torch.bfloat16)
    out = torch.full((5, 7), float("nan"), dtype=out_dtype)  # written, not read, by the first call
    ptr = out.data_ptr()
    gemm_into(out, a1, b1, False, eager=eager)
    gemm_into(out, a2, b2, True, eager=eager)
    assert out.data_ptr() == ptr
    expected = a1.float() @ b1.float() + a2.float() @ b2.float()
    assert_close(out, expected.to(out_dtype), "out")


def test_rows_of_a_larger_buffer() -> None:
    a, b = randn(2, 4), randn(4, 3)
    buf = torch.zeros(6, 3)
    gemm_into(buf[2:4], a, b, False)
    assert_close(buf[2:4], a @ b, "rows")
    assert not buf[:2].any() and not buf[4:].any()


def test_compiled_accumulation_copies_nothing() -> None:
    """The chunk loop of the fused linear cross-entropy: compiled, grad_W stays one buffer updated in
    place and grad_x's rows are written where they lie (an out= addmm traced functionally copies the
    accumulator for every chunk after the first; a mutation Inductor did not put back in place would
    show as a clone in its code)."""
    from torch._inductor.utils import run_and_get_code

    def grads(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gw, gx = torch.empty(g.shape[1], x.shape[1]), torch.empty_like(x)
        for start in range(0, g.shape[0], 4):
            gemm_into(gw, g[start:start + 4].t(), x[start:start + 4], start > 0)
            gemm_into(gx[start:start + 4], g[start:start + 4], w, False)
        return gw, gx

    g, x, w = randn(12, 40), randn(12, 6), randn(40, 6)
    compiled = torch.compile(grads, fullgraph=True)
    (gw, gx), code = run_and_get_code(compiled, g, x, w)
    assert_close(gw, g.t() @ x, "grad_w")
    assert_close(gx, g @ w, "grad_x")
    assert "clone" not in "".join(code)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(g, x, w)
    assert [e.name for e in prof.events() if e.name in COPIES] == []


@pytest.mark.parametrize("per_row", [False, True], ids=["0-d", "per-row"])
def test_traced_scaled_grad_is_torch_math(per_row: bool) -> None:
    dev = device_under_test()  # the kernel's device: CUDA, or the interpreter's CPU
    grad = randn(2, 3, 16, dtype=torch.bfloat16, device=dev)
    dloss = torch.rand(2, 3, device=dev) + 0.5 if per_row else torch.tensor(0.37, device=dev)
    graph = make_fx(lambda g, d: scaled_grad(g, d), tracing_mode="fake")(grad, dloss)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert not any("triton" in t for t in targets), targets  # no kernel: Inductor can fuse and reuse
    expected = (acc(grad) * acc(dloss if not per_row else dloss[..., None])).to(grad.dtype)
    got = graph(grad, dloss)
    assert got.dtype == grad.dtype and got.is_contiguous()
    assert torch.equal(got, expected)  # one rounding, as the kernel
    assert_close(scaled_grad(grad, dloss), expected, "kernel")  # the interpreter rounds bf16 its own way
