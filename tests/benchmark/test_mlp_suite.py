"""The MLP suite: registry, byte and FLOP counts, function and module peers (Liger's kinds, with torch
stand-ins), the gate with a provider that writes its gradients over its inputs, and a quick CPU run."""

from __future__ import annotations

import torch

from kernel_pytorch import reference
from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.module import PASSES
from kernel_pytorch.benchmark.suites import get_suite, runner, suite_names
from kernel_pytorch.benchmark.suites import mlp as M
from kernel_pytorch.benchmark.suites.gate import gate
from kernel_pytorch.benchmark.suites.providers import Impl, bind
from kernel_pytorch.benchmark.suites.spec import ModulePeer
from kernel_pytorch.validation.compare import failures
from tests.ops.norm_helpers import assert_close

CPU = torch.device("cpu")


def _fake_ceilings() -> Ceilings:
    return Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                    matmul_dtype="float32", torch_version=torch.__version__, measured_at="now")


def test_registry_counts_and_shapes() -> None:
    assert "mlp" in suite_names() and get_suite("mlp") is M
    assert M.SUITE.ops == ("swiglu", "geglu_tanh", "swiglu_packed", "gated_mlp")
    assert M.SUITE.providers == ("ours", "ours-inplace", "gemms", "eager", "compile", "liger")
    big = M.ACT_CUDA_SHAPES[0]
    e = 16384 * 14336
    assert (big.tokens, big.inter) == (16384, 14336)
    assert M.SWIGLU.pass_bytes(big, 2, "fwd") == 3 * e * 2
    assert M.SWIGLU.pass_bytes(big, 2, "fwd+bwd (cuda graph)") == 8 * e * 2  # the probe's 8 tensors
    blk = M.BLOCK_CUDA_SHAPES[0]
    assert (blk.tokens, blk.hidden, blk.inter) == (16384, 4096, 14336)
    assert M.GATED_MLP.pass_flops(blk, "fwd+bwd") == 9 * 2 * 16384 * 4096 * 14336
    assert all(s.config for s in M.ACT_CUDA_SHAPES + M.BLOCK_CUDA_SHAPES)


def test_hf_eager_code_matches_the_reference_in_fp32() -> None:
    t = M._block_inputs(M.BLOCK_QUICK["cpu"], torch.float32, CPU, 0)
    assert_close(M.hf_gated_mlp(*t.values()), reference.gated_mlp(*t.values(), "silu"), "block")
    gu = M._act_inputs(packed=True)(M.ACT_QUICK["cpu"], torch.float32, CPU, 0)["gate_up"]
    assert_close(M.hf_gated_packed(gu), reference.gated_act_packed(gu, "silu"), "packed")


class _MulInPlace(torch.autograd.Function):
    """silu(gate) * up whose backward writes its gradients over its inputs, as Liger's does."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors
        s = torch.sigmoid(gate)
        d_up = dh * gate * s
        gate.copy_(dh * up * s * (1 + gate * (1 - s)))
        up.copy_(d_up)
        return gate, up


def test_function_peer_with_an_in_place_backward_passes_the_gate() -> None:
    """The gate hands the provider copies, so the reference still reads the inputs after the backward."""
    peer = ModulePeer(target="unused:Fn", init_args=lambda t: (), call=("gate", "up"), function=True)
    shape = M.ACT_QUICK["cpu"]
    checks, _ = gate(M.SWIGLU, Impl(_MulInPlace, peer), shape, torch.float32, CPU, None)
    assert not failures(checks), [c.message() for c in failures(checks)]


def test_module_peer_parameters_by_path() -> None:
    """LigerSwiGLUMLP's kind: a module built from a config, the benchmark's weights copied to gate_proj.weight ..."""

    class Llamaish(torch.nn.Module):
        def __init__(self, config) -> None:
            super().__init__()
            h, i = config.hidden_size, config.intermediate_size
            self.gate_proj, self.up_proj = torch.nn.Linear(h, i, bias=False), torch.nn.Linear(h, i, bias=False)
            self.down_proj = torch.nn.Linear(i, h, bias=False)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    liger = M.GATED_MLP.liger
    t = M._block_inputs(M.BLOCK_QUICK["cpu"], torch.float32, CPU, 0)
    bound = bind(M.GATED_MLP, Impl(Llamaish, liger), t, grad=True)
    assert all(isinstance(w, torch.nn.Parameter) for w in bound.wrt[1:])  # the module's own, in its place
    assert_close(bound.call(), M.hf_gated_mlp(*t.values()), "peer")
    assert all(w.requires_grad for w in bound.wrt)


def test_quick_cpu_run() -> None:
    ops = ("swiglu", "gated_mlp")  # the other two activations are the same code paths (time)
    r = runner.run(M.SUITE, device="cpu", providers=("ours", "ours-inplace", "eager", "liger"), ops=ops, quick=True,
                   ceilings=_fake_ceilings())
    for op in ops:
        for p in PASSES:
            for provider in ("eager", "ours"):
                rows = r.find(op=op, provider=provider, pass_name=p)
                assert len(rows) == 1 and rows[0].ok, rows
    assert not r.find(provider="ours-inplace")  # on CPU the flag has no effect: no rows
    assert all(x.status in ("not installed", "not available") for x in r.find(provider="liger"))


def test_block_floor_runs_the_block_gemms() -> None:
    """The gemms floor: outputs and gradients of the block's shapes, from the same GEMMs as the block
    (with gate in h's place and dh in d_gate's and d_up's); the CPU run gives it a row marked a floor."""
    t = M._block_inputs(M.BLOCK_QUICK["cpu"], torch.float32, CPU, 0)
    x, gw, uw, dw = (v.requires_grad_() for v in t.values())
    y = M._block_gemms(x, gw, uw, dw)
    assert y.shape == x.shape[:-1] + (dw.shape[0],)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, gw, uw, dw), dy)
    gate = x @ gw.t()
    dh = dy @ dw
    want = (dh @ gw + dh @ uw, dh.t() @ x, dh.t() @ x, dy.t() @ gate)
    for g, w in zip(grads, want):
        assert_close(g, w, "floor gradient")
    with torch.no_grad():
        assert_close(M._block_gemms(x, gw, uw, dw), gate @ dw.t(), "floor forward")
    r = runner.run(M.SUITE, device="cpu", providers=("gemms",), ops=("gated_mlp",), quick=True,
                   ceilings=_fake_ceilings())
    rows = r.find(op="gated_mlp", provider="gemms")
    assert rows and all(row.ok and "floor" in row.note for row in rows), rows
