"""The attention suite: transformers' eager code and our block match the reference, the chunked reference
is the reference, the decoding step's providers match it over a partly written cache, the gate's reduced
shape at the CUDA prefill shapes (and nowhere else), byte counts, and a quick CPU run end to end (the
smoke path of scripts/gpu_check.sh)."""

from __future__ import annotations

import torch

from kernel_pytorch import reference
from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.suites import SUITES, get_suite, runner, suite_names
from kernel_pytorch.benchmark.suites import attention as A
from kernel_pytorch.tolerances import tolerance_for

SHAPE = A.attn_shape(2, 4, 2, 24, 16, "test")


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    tol = tolerance_for(b.dtype)
    torch.testing.assert_close(a, b, atol=tol.atol, rtol=tol.rtol)


def test_registry_and_shapes() -> None:
    assert "attention" in suite_names() and get_suite("attention") is A
    big = A.CUDA_SHAPES[0]
    assert big.sizes == [4, 32, 8, 4096, 128] and big.config
    assert A.SUITE.ops == ("attention", "attention_block", "attention_documents", "attention_decode")
    assert [s.sizes for s in A.DECODE_CUDA_SHAPES] == [[32, 32, 8, 4096, 128], [32, 32, 8, 16384, 128]]
    assert A.ATTENTION_DECODE.passes == ("fwd",) and not A.ATTENTION_DECODE.grad_names  # inference only
    assert all(spec.liger is None for spec in A.SPECS.values())  # Liger has no attention


def test_eager_code_and_ours_match_the_reference_in_fp32() -> None:
    t = A.ATTENTION.make_inputs(SHAPE, torch.float32, torch.device("cpu"), 0)
    want = reference.attention(t["q"], t["k"], t["v"], is_causal=True)
    _close(A.chunked_reference(t["q"], t["k"], t["v"], is_causal=True), want)
    for spec in (A.ATTENTION,):
        _close(spec.eager(*t.values()), want)
        _close(spec.ours(*t.values(), backend="auto"), want)
    b = A.ATTENTION_BLOCK.make_inputs(SHAPE, torch.float32, torch.device("cpu"), 0)
    want = A.ATTENTION_BLOCK.reference(*b.values())
    _close(A.ATTENTION_BLOCK.eager(*b.values()), want)
    _close(A.ATTENTION_BLOCK.ours(*b.values(), backend="auto"), want)
    docs = A.ATTENTION_DOCUMENTS
    _close(docs.eager(*t.values()), docs.reference(*t.values()))


def test_minimum_bytes() -> None:
    q = 4 * 32 * 4096 * 128
    kv = 4 * 8 * 4096 * 128
    fwd, bwd = A.ATTENTION.min_bytes(A.CUDA_SHAPES[0], 2)
    assert (fwd, bwd) == ((2 * q + 2 * kv) * 2, (5 * q + 4 * kv) * 2)


def test_quick_cpu_run() -> None:
    ceilings = Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                        matmul_dtype="float32", torch_version=torch.__version__, measured_at="now")
    r = runner.run(A.SUITE, device="cpu", providers=("ours", "ours-flex", "sdpa-flash", "eager", "liger"),
                     quick=True, ceilings=ceilings)
    for op in A.SUITE.ops:
        for provider in ("ours", "eager"):
            rows = r.find(op=op, provider=provider)
            assert rows and all(row.ok for row in rows), [row.note for row in rows]
    assert not r.find(provider="ours-flex") and not r.find(provider="sdpa-flash")  # CUDA only
    assert all(row.status == "not available" for row in r.find(provider="liger"))


def test_decoding_step_providers_match_the_reference_over_a_partly_written_cache() -> None:
    shape = A.decode_shape(2, 8, 2, 40, 16, "test")
    t = A.ATTENTION_DECODE.make_inputs(shape, torch.float32, torch.device("cpu"), 0)
    assert t["q"].shape == (2, 8, 1, 16) and t["k"].shape == (2, 2, 40, 16) and t["pos"].tolist() == [39]
    sdpa = A.ATTENTION_DECODE.extras[0].make(torch.device("cpu"))[0]
    _close(sdpa(*t.values()), A.ATTENTION_DECODE.reference(*t.values()))  # the whole cache written
    t["pos"] = torch.tensor([17])  # slots past 17 not written yet: masked
    want = reference.attention(t["q"], t["k"][:, :, :18], t["v"][:, :, :18])
    _close(A.ATTENTION_DECODE.reference(*t.values()), want)
    _close(A.ATTENTION_DECODE.eager(*t.values()), want)
    _close(A.ATTENTION_DECODE.ours(*t.values(), backend="auto"), want)
    fwd, bwd = A.ATTENTION_DECODE.min_bytes(A.DECODE_CUDA_SHAPES[0], 2)
    assert (fwd, bwd) == ((2 * 32 * 8 * 4096 * 128 + 2 * 32 * 32 * 128) * 2, 0)  # the cache read once


def test_gate_runs_smaller_only_where_the_fp64_scores_are_over_budget() -> None:
    for shape in (*A.CUDA_SHAPES, *A.CPU_SHAPES, *A.QUICK_SHAPES.values()):
        assert A.gate_shape(shape) is shape  # the default shapes gate at their own shape
    big = A.attn_shape(4, 32, 8, 16384, 128, "test")
    small = A.gate_shape(big)
    assert small.sizes == [1, 16, 4, 16384, 128]  # batch 1, half the heads: seq, head_dim, GQA ratio kept
    assert small.batch * small.heads * small.seq**2 <= A.GATE_SCORE_ELEMENTS < big.batch * big.heads * big.seq**2
    long = A.attn_shape(1, 32, 8, 65536, 128, "test")  # over budget even at one K/V head: the least there is
    assert A.gate_shape(long).sizes == [1, 4, 1, 65536, 128]
    assert A.ATTENTION_DECODE.gate_shape is None  # B Hq cache scores: gated at its own shape
    # the other suites' gates are not weakened: every op gates at its benchmark shape (cross-entropy's
    # past 2^30 fp64 logits only: tests/benchmark/test_cross_entropy_suite.py)
    for name in SUITES:
        if name not in ("attention", "cross_entropy"):
            assert all(spec.gate_shape is None for spec in get_suite(name).SUITE.specs), name
